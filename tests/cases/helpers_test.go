package cases

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// createVolume creates a mount volume of exactly size bytes and checks that
// its directory exists under the data root.
func createVolume(t testing.TB, in *testdriver.Instance, name string, size int64) *csi.Volume {
	t.Helper()
	resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      csitest.Range(size, size),
		VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
	})
	csitest.MustCode(t, err, codes.OK, "CreateVolume "+name)
	v := resp.GetVolume()
	if v.GetCapacityBytes() != size {
		t.Fatalf("CreateVolume %s: capacity %d, want %d", name, v.GetCapacityBytes(), size)
	}
	if fi, err := os.Lstat(volDir(in, v.GetVolumeId())); err != nil || !fi.IsDir() {
		t.Fatalf("CreateVolume %s: backing directory of %s: %v", name, v.GetVolumeId(), err)
	}
	return v
}

func volumesDir(in *testdriver.Instance) string { return filepath.Join(in.Opts.DataRoot, "volumes") }

// volDir is the documented backing directory of a mount volume.
func volDir(in *testdriver.Instance, id string) string { return filepath.Join(volumesDir(in), id) }

// listIDs returns the volume ids ListVolumes reports, sorted.
func listIDs(t testing.TB, ctl csi.ControllerClient) []string {
	t.Helper()
	resp, err := ctl.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	csitest.MustCode(t, err, codes.OK, "ListVolumes")
	if resp.GetNextToken() != "" {
		t.Fatalf("ListVolumes without max_entries returned a next_token %q", resp.GetNextToken())
	}
	var ids []string
	for _, e := range resp.GetEntries() {
		ids = append(ids, e.GetVolume().GetVolumeId())
	}
	slices.Sort(ids)
	return ids
}

// assertListMatchesDisk checks that ListVolumes and <root>/volumes hold
// exactly the ids want, one-to-one.
func assertListMatchesDisk(t testing.TB, in *testdriver.Instance, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	if got := listIDs(t, in.Controller); !slices.Equal(got, want) {
		t.Errorf("ListVolumes = %v, want %v", got, want)
	}
	if got := csitest.DirNames(t, volumesDir(in)); !slices.Equal(got, want) {
		t.Errorf("%s holds %v, want %v", volumesDir(in), got, want)
	}
}

func available(t testing.TB, in *testdriver.Instance) int64 {
	t.Helper()
	resp, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
	csitest.MustCode(t, err, codes.OK, "GetCapacity")
	return resp.GetAvailableCapacity()
}

// assertMountCount checks how many mounts sit on p.
func assertMountCount(t testing.TB, p string, want int) {
	t.Helper()
	if got := len(csitest.MountsAt(t, p)); got != want {
		t.Errorf("%s: %d mount(s) in /proc/self/mountinfo, want %d", p, got, want)
	}
}

// assertShowsVolume checks that p is a single mount of volume id: one
// mount-table entry whose root is the volume's backing directory, and the
// same inode as that directory.
func assertShowsVolume(t testing.TB, in *testdriver.Instance, p, id string) {
	t.Helper()
	ms := csitest.MountsAt(t, p)
	if len(ms) != 1 {
		t.Errorf("%s: %d mounts, want exactly 1 (a bind mount of %s)", p, len(ms), id)
		return
	}
	if want := csitest.RealPath(volDir(in, id)); ms[0].Root != want {
		t.Errorf("%s: mount root is %q, want the backing directory %q", p, ms[0].Root, want)
	}
	if !csitest.SameInode(t, p, volDir(in, id)) {
		t.Errorf("%s does not show the directory of volume %s", p, id)
	}
}

func assertDir(t testing.TB, p string) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil || !fi.IsDir() {
		t.Errorf("%s: want a directory (lstat: %v)", p, err)
	}
}

// writeFileSynced writes data to p and fsyncs it.
func writeFileSynced(t testing.TB, p string, data []byte) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// treeOf describes everything below dir (without following symlinks):
// relative path → type, mode, size, content hash or link target. Two equal
// results mean nothing below dir was created, removed or changed.
func treeOf(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		desc := fmt.Sprintf("%v", fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		case fi.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %d %x", len(data), sha256.Sum256(data))
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return out
}

func assertTreeUnchanged(t testing.TB, dir string, before map[string]string) {
	t.Helper()
	after := treeOf(t, dir)
	for k, v := range before {
		if a, ok := after[k]; !ok {
			t.Errorf("%s: %q was removed", dir, k)
		} else if a != v {
			t.Errorf("%s: %q changed: %s -> %s", dir, k, v, a)
		}
	}
	for k, v := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s: %q (%s) appeared", dir, k, v)
		}
	}
}

// mountOptions returns the per-mount options of the single mount at p.
func mountOptions(t testing.TB, p string) []string {
	t.Helper()
	ms := csitest.MountsAt(t, p)
	if len(ms) != 1 {
		t.Fatalf("%s: %d mounts, want 1", p, len(ms))
	}
	return strings.Split(ms[0].Options, ",")
}

// stage runs NodeStageVolume with mnt at staging (which it creates first,
// as kubelet does) and checks the bind mount.
func stage(t testing.TB, in *testdriver.Instance, id, staging string) {
	t.Helper()
	csitest.Mkdir(t, staging)
	_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.MntCap(),
	})
	csitest.MustCode(t, err, codes.OK, "NodeStageVolume "+id)
	assertShowsVolume(t, in, staging, id)
}

// publish runs NodePublishVolume with mnt(flags) and checks the bind mount.
func publish(t testing.TB, in *testdriver.Instance, id, staging, target string, flags ...string) {
	t.Helper()
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(id, staging, target, flags...))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume "+id+" at "+target)
	assertShowsVolume(t, in, target, id)
}

func publishReq(id, staging, target string, flags ...string) *csi.NodePublishVolumeRequest {
	return &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.MntCap(flags...),
	}
}

func unpublish(t testing.TB, in *testdriver.Instance, id, target string) {
	t.Helper()
	_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	csitest.MustCode(t, err, codes.OK, "NodeUnpublishVolume "+id+" at "+target)
	assertMountCount(t, target, 0)
	csitest.AssertGone(t, target)
}

func unstage(t testing.TB, in *testdriver.Instance, id, staging string) {
	t.Helper()
	_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume "+id+" at "+staging)
	assertMountCount(t, staging, 0)
}

func deleteVolume(t testing.TB, in *testdriver.Instance, id string) {
	t.Helper()
	_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume "+id)
	csitest.AssertGone(t, volDir(in, id))
}

// unknownID has the shape of a driver-issued id but was never issued, so
// calls with it reach the existence lookup.
const unknownID = "vol-0123456789abcdef0123456789abcdef"
