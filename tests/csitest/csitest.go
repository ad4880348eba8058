// Package csitest holds the small helpers the driver-level test packages
// (tests/cases, tests/datacases, tests/reliability) share: CSI request
// builders, exact gRPC code assertions, and mount-table and loop-device
// lookups.
package csitest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RPCTimeout bounds every call: a hung RPC fails the test, not the run.
const RPCTimeout = 60 * time.Second

// Ctx is a context with RPCTimeout, cancelled when the test ends.
func Ctx(t testing.TB) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), RPCTimeout)
	t.Cleanup(cancel)
	return c
}

// MntCap is a SINGLE_NODE_WRITER mount capability with mount flags.
func MntCap(flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// BlkCap is a SINGLE_NODE_WRITER block capability.
func BlkCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

// CapOf is BlkCap or MntCap.
func CapOf(block bool) *csi.VolumeCapability {
	if block {
		return BlkCap()
	}
	return MntCap()
}

// Range is a CapacityRange in bytes.
func Range(req, lim int64) *csi.CapacityRange {
	return &csi.CapacityRange{RequiredBytes: req, LimitBytes: lim}
}

// FromSnapshot is a content source restoring snapshot id.
func FromSnapshot(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}}
}

// FromVolume is a content source cloning volume id.
func FromVolume(id string) *csi.VolumeContentSource {
	return &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}}
}

// CodeIs fails the test unless err carries exactly the gRPC code want.
func CodeIs(t testing.TB, err error, want codes.Code, what string) bool {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Errorf("%s: got code %s (%v), want %s", what, got, err, want)
		return false
	}
	return true
}

// RealPath is p with symlinks resolved, as the mount table shows it.
func RealPath(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(r, filepath.Base(p))
	}
	return filepath.Clean(p)
}

// AssertGone fails the test when p exists.
func AssertGone(t testing.TB, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s still exists (lstat: %v)", p, err)
	}
}

// Loops returns every attached loop device and its backing file.
func Loops(t testing.TB) map[string]string {
	t.Helper()
	ents, err := os.ReadDir("/sys/block")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, en := range ents {
		if !strings.HasPrefix(en.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", en.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		out["/dev/"+en.Name()] = strings.TrimSuffix(string(b), "\n")
	}
	return out
}
