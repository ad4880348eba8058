// Package csitest holds the small helpers the driver-level test packages
// (tests/cases, tests/datacases, tests/imagevol, tests/reliability) share:
// CSI request builders, exact gRPC code assertions, mount-table and
// loop-device lookups, and a few file helpers.
package csitest

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/tests/treecmp"
)

// Ki and Mi are binary size units in bytes (KiB, MiB), typed int64 like
// the CSI byte counts they build.
const (
	Ki = int64(1) << 10
	Mi = int64(1) << 20
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

// MntCapFS is a SINGLE_NODE_WRITER mount capability with fs_type fs: an
// image volume for "ext4" or "xfs", a directory volume for "".
func MntCapFS(fs string) *csi.VolumeCapability {
	c := MntCap()
	c.GetMount().FsType = fs
	return c
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

// MustCode is CodeIs that stops the test.
func MustCode(t testing.TB, err error, want codes.Code, what string) {
	t.Helper()
	if got := status.Code(err); got != want {
		t.Fatalf("%s: got code %s (%v), want %s", what, got, err, want)
	}
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

// LoopsBelow returns the attached loop devices whose backing file is below
// dir, and their backing files (other tests on the machine attach their
// own; only these count).
func LoopsBelow(t testing.TB, dir string) map[string]string {
	t.Helper()
	rd := RealPath(dir) + "/"
	out := map[string]string{}
	for dev, file := range Loops(t) {
		if strings.HasPrefix(file, rd) {
			out[dev] = file
		}
	}
	return out
}

// MountsAt returns every mount-table entry whose mount point is p (stacked
// mounts give several), read from /proc/self/mountinfo.
func MountsAt(t testing.TB, p string) []*mountinfo.Info {
	t.Helper()
	rp := RealPath(p)
	ms, err := mountinfo.GetMounts(func(i *mountinfo.Info) (bool, bool) { return i.Mountpoint != rp, false })
	if err != nil {
		t.Fatalf("read mount table: %v", err)
	}
	return ms
}

// MountsUnder returns the mounts at or below p, in mount order.
func MountsUnder(t testing.TB, p string) []*mountinfo.Info {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(RealPath(p)))
	if err != nil {
		t.Fatalf("read mount table: %v", err)
	}
	return ms
}

// SameInode reports whether a and b (symlinks followed) are the same inode
// on the same device; a failed stat is a test error.
func SameInode(t testing.TB, a, b string) bool {
	t.Helper()
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		t.Errorf("stat %s: %v", a, err)
		return false
	}
	if err := unix.Stat(b, &sb); err != nil {
		t.Errorf("stat %s: %v", b, err)
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// DirNames returns the names in dir, sorted (none when dir is missing).
func DirNames(t testing.TB, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	slices.Sort(names)
	return names
}

// Mkdir creates p and its parents (mode 0750) and returns p.
func Mkdir(t testing.TB, p string) string {
	t.Helper()
	if err := os.MkdirAll(p, 0o750); err != nil {
		t.Fatal(err)
	}
	return p
}

// RandomBytes returns n reproducible pseudo-random bytes for a seed. It is
// treecmp.RandomBytes: one seed gives the same bytes through either
// package, so data written with one can be checked with the other.
func RandomBytes(seed uint64, n int) []byte {
	return treecmp.RandomBytes(seed, n)
}

// AssertFileBytes fails the test unless p holds exactly want.
func AssertFileBytes(t testing.TB, p string, want []byte) {
	t.Helper()
	switch got, err := os.ReadFile(p); {
	case err != nil:
		t.Errorf("read %s: %v", p, err)
	case !bytes.Equal(got, want):
		t.Errorf("%s: %d bytes differ from the %d bytes written", p, len(got), len(want))
	}
}

// Each calls f(0), …, f(n-1) from workers goroutines at once and fails tb
// with every error they return (after all calls ended).
func Each(tb testing.TB, n, workers int, f func(i int) error) {
	tb.Helper()
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, n)
	for range workers {
		wg.Go(func() {
			for i := range next {
				if err := f(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Error(err)
	}
	if tb.Failed() {
		tb.FailNow()
	}
}

// FillUntilFull writes 1 MiB blocks of non-zero data into a new file under
// dir until a write fails, and returns the bytes written and the error.
func FillUntilFull(t testing.TB, dir string, limit int64) (int64, error) {
	t.Helper()
	f, err := os.Create(filepath.Join(dir, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{0xa5}, int(Mi))
	var n int64
	for n < limit {
		w, err := f.Write(buf)
		n += int64(w)
		if err == nil {
			err = f.Sync() // delayed allocation: make the filesystem decide now
		}
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// WriteSeq replaces path with a file holding n: written to path.tmp,
// fsynced, renamed over path. (Truncating path in place would let a cut
// between the truncation and the write show an empty file: a state the
// writer did pass through, but not a number.)
func WriteSeq(path string, n int) error {
	tmp := path + ".tmp"
	if err := WriteSynced(tmp, []byte(strconv.Itoa(n))); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// WriteSynced writes data to the file p (created or truncated), 1 MiB per
// write, and fsyncs it before closing it; it returns the first error
// (write, fsync or close), which tests of quota limits look at.
func WriteSynced(p string, data []byte) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	for off := 0; off < len(data); off += int(Mi) {
		if _, err := f.Write(data[off:min(off+int(Mi), len(data))]); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
