// Package reliability holds the tests that show localdir keeps users' data
// safe under faults and hostile callers (docs/reliability.md):
//
//   - crash storm: the real binary SIGKILLed at random moments under a random
//     mix of controller and node calls, restarted, and checked against a model
//     of every acknowledged call (crash_test.go); the same in cluster mode, a
//     controller-mode and a node-mode process against a real API server
//     (tests/cluster/clustertest) with the deploy/kubernetes RBAC, the node
//     plugin SIGKILLed (nodestorm_test.go); damaged state files refused
//     without being overwritten;
//   - hostile input: every RPC with path-like, oversized, control-character
//     and never-issued ids, names, parameters, contexts and node paths, each
//     with its exact gRPC code, under a watcher that proves nothing outside
//     the data root and the given paths changed (hostile_test.go);
//   - concurrency: 16 clients on overlapping names and ids under the race
//     detector (concurrency_test.go);
//   - broken and stacked mounts, FUSE mounts whose server died
//     (brokenmount_test.go);
//   - a data root that fills up during create, snapshot, restore and expand
//     (exhaustion_test.go);
//   - the binary SIGKILLed while a snapshot of a staged ext4 image volume
//     holds its filesystem frozen: the restart thaws it
//     (imagefreeze_test.go);
//   - socket permissions and --kubelet-root (hardening_test.go).
//
// The reboot simulation is tests/datacases.TestNodeRebootSimulation; the
// fuzz targets live next to the code they fuzz (pkg/driver, pkg/volume) and
// run with `make fuzz`.
//
// CI runs the short settings (go test ./tests/reliability/, a few minutes as
// root; the cluster-mode storm needs `make tools`). LOCALDIR_STRESS=1 (make
// stress) selects the long ones: 500 kills in each storm, more rounds of
// everything.
package reliability
