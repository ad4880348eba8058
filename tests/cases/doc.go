// Package cases turns the acceptance cases of /work/shared/cases/README.md
// (C01, C02, …) into Go tests, one test function per case, against a real
// driver in all mode: in-process (tests/testdriver) or, where a case needs
// kill -9, the built binary as a subprocess. They assert the exact gRPC code
// of every call and the outcome on disk and in the mount table, and must run
// as root (real bind mounts).
//
// Only mount volumes are covered here. The parts of a case that need raw
// block volumes, snapshots, clones, expansion or ephemeral inline volumes are
// left as comments naming the feature that covers them; they belong with
// that feature's tests.
package cases
