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
package cases
