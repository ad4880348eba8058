// Package datacases tests localdir's data features through gRPC against a
// real in-process driver (tests/testdriver) in all mode, as root: raw block
// volumes on loop devices, snapshots, restores and clones (compared file by
// file with tests/treecmp), volume group snapshots (write order kept across
// members; image volumes frozen together, the pods using directory and raw
// block members frozen through their freezer cgroup), expansion online and
// against capacity, GetCapacity and btrfs qgroup enforcement,
// VolumeAttributesClass parameters (btrfs compression, dirMode, per-volume
// I/O limits on a pod's cgroup), ephemeral inline volumes, failed creates
// that must leave nothing behind, and a simulated node reboot. It covers the
// data-path acceptance cases (C12, C17–C20, C22, C23, C29 and the block
// halves of C04, C19 and C32).
//
// GetCapacity never lets a node be overcommitted, on every engine:
// available_capacity is what a new volume can still be guaranteed, so it
// moves by exactly the size of every volume created or deleted, and two
// creates never both get the last free bytes (capacity_test.go).
//
// Every test asserts the exact gRPC code of each call and the outcome on the
// node: bytes on disk or read back through the published device node, the
// mount table (/proc/self/mountinfo) and the loop devices
// (/sys/block/loop*/loop/backing_file). Nothing is skipped: a missing tool
// or privilege fails the test. The group snapshot and I/O limit tests need
// pod cgroups as the kubelet lays them out (tests/testcgroup: cgroup v1
// blkio and freezer, or v2 with io and freezer).
//
// Files are named by what they test: failed_create_test.go (C12),
// restore_snapshots_topology_test.go (C17, C18, C20),
// expansion_ephemeral_test.go (C22, C23, C29), capacity_test.go,
// group_snapshot_test.go, modify_test.go (VolumeAttributesClass
// parameters), block_test.go and reboot_test.go; helpers_test.go and
// pod_helpers_test.go (volumes staged and published for a pod) hold the
// helpers.
package datacases
