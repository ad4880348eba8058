// Package datacases tests localdir's data features through gRPC against a
// real in-process driver (tests/testdriver) in all mode, as root: raw block
// volumes on loop devices, snapshots, restores and clones (compared file by
// file with tests/treecmp), expansion online and against capacity, btrfs
// qgroup enforcement, ephemeral inline volumes, failed creates that must
// leave nothing behind, and a simulated node reboot. It covers the
// data-path acceptance cases (C12, C17–C20,
// C22, C23, C29 and the block halves of C04, C19 and C32).
//
// Every test asserts the exact gRPC code of each call and the outcome on the
// node: bytes on disk or read back through the published device node, the
// mount table (/proc/self/mountinfo) and the loop devices
// (/sys/block/loop*/loop/backing_file). Nothing is skipped: a missing tool
// or privilege fails the test.
//
// Files are named by what they test: failed_create_test.go (C12),
// restore_snapshots_topology_test.go (C17, C18, C20),
// expansion_ephemeral_test.go (C22, C23, C29), block_test.go and
// reboot_test.go.
package datacases
