// Package cases turns the acceptance cases (C01, C02, …; each a public bug
// report of a CSI driver turned into a case) into Go tests, one test
// function per case, against a real driver in all mode: in-process
// (tests/testdriver) or, where a case needs kill -9 or the process's log,
// the built binary as a subprocess. They assert the exact gRPC code of
// every call and the outcome on disk, in the mount table and on the loop
// devices, and must run as root (real bind mounts and loop devices).
//
// Mount volumes are covered throughout; raw block volumes in the cases
// that are about them (C35, C36, C39 and the block rows of C38, C50; see
// block_helpers_test.go). The parts of the older cases that need raw block
// volumes, snapshots, clones, expansion or ephemeral inline volumes are
// left as comments naming the feature that covers them; they belong with
// that feature's tests.
//
// Files are named by what they test; the case ids are in the test names:
//
//   - create_delete_volume_test.go: C01–C04, CreateVolume names, arguments
//     and capacity ranges, idempotent DeleteVolume;
//   - unpublish_leftovers_test.go: C06, C07, C11, NodeUnpublishVolume on
//     unmounted, missing or unknown targets and after a reboot;
//   - restart_state_file_test.go: C08, C09, kill -9 between calls and a
//     damaged state file;
//   - path_safety_test.go: C13, C15, ids that would traverse paths and
//     symlinked target and staging paths;
//   - stage_publish_test.go: C26, C27, capabilities, mount flags and
//     NodeStageVolume idempotency;
//   - required_fields_volume_stats_test.go: C31, C32, missing fields and
//     NodeGetVolumeStats;
//   - capabilities_test.go: C35–C39, republishing, read-only block and
//     capability decisions;
//   - names_empty_capacity_range_test.go: C49, C50, names with control
//     characters and restores with an empty capacity range.
package cases
