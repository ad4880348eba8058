// Package imagevol checks image volumes (a StorageClass with
// csi.storage.k8s.io/fstype ext4 or xfs: an image file on the data root, a
// loop device, a filesystem made on first stage) as a pod sees them: the
// size holds (ENOSPC at it, statfs within the filesystem's own overhead),
// growth online and at the next stage, snapshots of a volume being written
// that keep every byte fsync'd before the call, a reboot, a staged volume
// that DeleteVolume and an early unstage leave alone, and the image's loop
// device at unstage. A driver killed while it holds a filesystem frozen is
// tested in tests/reliability (imagefreeze_test.go).
package imagevol

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

const mib = int64(1) << 20

// kinds are the filesystems, each on the data root the acceptance names:
// ext4 images on an ext4 data root (snapshots are copies), xfs images on
// XFS with reflink (snapshots are reflinks). size is a volume size and
// overhead the share of it the filesystem keeps for itself at that size
// (docs/engines.md): statfs's total must lie between size·(1−overhead) and
// size.
var kinds = []struct {
	fs, dataRoot string
	size         int64
	overhead     float64
}{
	{"ext4", testfs.Ext4, 64 * mib, 0.15},
	{"xfs", testfs.XFSReflink, 300 * mib, 0.22},
}

// vol is a volume staged and published by the test; done once the test
// unpublished and unstaged it itself.
type vol struct {
	id, staging, target string
	done                bool
}

func startImageRoot(t *testing.T, dataRoot string) *testdriver.Instance {
	t.Helper()
	testdriver.RequireRoot(t)
	root := testfs.New(t, dataRoot, 2<<30)
	return testdriver.Start(t, func(o *driver.Options) {
		o.DataRoot = filepath.Join(root, "data")
		o.Engine = "dir"
		o.CapacityBytes = 0
	})
}

func createImage(t *testing.T, in *testdriver.Instance, name, fs string, size int64, src *csi.VolumeContentSource) string {
	t.Helper()
	r, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: csitest.Range(size, 0),
		VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS(fs)}, VolumeContentSource: src,
	})
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	return r.GetVolume().GetVolumeId()
}

func stagePublish(t *testing.T, in *testdriver.Instance, id, fs string) *vol {
	t.Helper()
	v := &vol{id: id, staging: csitest.Mkdir(t, filepath.Join(in.Dir, "staging-"+id)), target: filepath.Join(in.Dir, "target-"+id)}
	if _, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: v.staging, VolumeCapability: csitest.MntCapFS(fs),
	}); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: csitest.MntCapFS(fs),
	}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	t.Cleanup(func() { unpublishUnstage(t, in, v) })
	return v
}

func unpublishUnstage(t *testing.T, in *testdriver.Instance, v *vol) {
	t.Helper()
	if v.done {
		return
	}
	v.done = true
	if _, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
		t.Errorf("NodeUnpublishVolume: %v", err)
	}
	if _, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging}); err != nil {
		t.Errorf("NodeUnstageVolume: %v", err)
	}
}

func statfsTotal(t *testing.T, p string) int64 {
	t.Helper()
	var s unix.Statfs_t
	if err := unix.Statfs(p, &s); err != nil {
		t.Fatal(err)
	}
	return int64(s.Blocks) * s.Bsize
}

// TestImageVolumeSizeHolds: a pod sees a filesystem of the requested size
// less the filesystem's own overhead, NodeGetVolumeStats reports that
// filesystem, and a write past the size fails with ENOSPC (#12 item 2).
func TestImageVolumeSizeHolds(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			v := stagePublish(t, in, createImage(t, in, "sized", k.fs, k.size, nil), k.fs)
			total := statfsTotal(t, v.target)
			if total > k.size || float64(total) < float64(k.size)*(1-k.overhead) {
				t.Fatalf("statfs total %d bytes for a %d-byte %s volume: outside the documented overhead of %.0f%%", total, k.size, k.fs, k.overhead*100)
			}
			st, err := in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: v.id, VolumePath: v.target})
			if err != nil {
				t.Fatal(err)
			}
			var bytesTotal, inodesTotal int64
			for _, u := range st.GetUsage() {
				switch u.GetUnit() {
				case csi.VolumeUsage_BYTES:
					bytesTotal = u.GetTotal()
				case csi.VolumeUsage_INODES:
					inodesTotal = u.GetTotal()
				}
			}
			if bytesTotal != total || inodesTotal <= 0 {
				t.Errorf("NodeGetVolumeStats: %d bytes, %d inodes; want the mounted filesystem's %d bytes and its inodes", bytesTotal, inodesTotal, total)
			}
			n, err := csitest.FillUntilFull(t, v.target, 2*k.size)
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("writing into a %d-byte volume: %d bytes written, then %v; want ENOSPC", k.size, n, err)
			}
			if n > k.size {
				t.Fatalf("%d bytes written into a %d-byte volume", n, k.size)
			}
			if err := os.Remove(filepath.Join(v.target, "fill")); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// hasSysResource reports whether this process holds CAP_SYS_RESOURCE,
// which the kernel requires for an online ext4 resize (EXT4_IOC_RESIZE_FS).
// The node plugin runs privileged and holds it; this CI machine's container
// does not.
func hasSysResource(t *testing.T) bool {
	t.Helper()
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatal(err)
	}
	return data[0].Effective&(1<<unix.CAP_SYS_RESOURCE) != 0
}

func expand(t *testing.T, in *testdriver.Instance, id, fs string, newSize int64) {
	t.Helper()
	r, err := in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: id, CapacityRange: csitest.Range(newSize, 0), VolumeCapability: csitest.MntCapFS(fs),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !r.GetNodeExpansionRequired() {
		t.Fatal("ControllerExpandVolume of an image volume did not ask for NodeExpandVolume")
	}
}

// TestImageVolumeOnlineExpansion: ControllerExpandVolume asks for the node
// step, and NodeExpandVolume on the published path grows the mounted
// filesystem, data kept (#12 item 3).
func TestImageVolumeOnlineExpansion(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			if k.fs == "ext4" && !hasSysResource(t) {
				t.Skip("an online ext4 resize needs CAP_SYS_RESOURCE, which this test process lacks (the node plugin runs privileged); TestImageVolumeOfflineExpansion grows ext4 at stage")
			}
			in := startImageRoot(t, k.dataRoot)
			v := stagePublish(t, in, createImage(t, in, "grow", k.fs, k.size, nil), k.fs)
			data := csitest.RandomBytes(1, int(mib))
			if err := os.WriteFile(filepath.Join(v.target, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			before := statfsTotal(t, v.target)
			newSize := k.size + 100*mib
			expand(t, in, v.id, k.fs, newSize)
			if _, err := in.Node.NodeExpandVolume(csitest.Ctx(t), &csi.NodeExpandVolumeRequest{
				VolumeId: v.id, VolumePath: v.target, StagingTargetPath: v.staging,
				CapacityRange: csitest.Range(newSize, 0), VolumeCapability: csitest.MntCapFS(k.fs),
			}); err != nil {
				t.Fatal(err)
			}
			after := statfsTotal(t, v.target)
			if after-before < 90*mib {
				t.Fatalf("statfs total %d → %d bytes after growing the volume by 100 MiB", before, after)
			}
			csitest.AssertFileBytes(t, filepath.Join(v.target, "kept"), data)
		})
	}
}

// TestImageVolumeOfflineExpansion: a volume expanded while it is not
// staged has grown, data kept, when it is staged again (#12 item 3).
func TestImageVolumeOfflineExpansion(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			id := createImage(t, in, "offline", k.fs, k.size, nil)
			v := stagePublish(t, in, id, k.fs)
			data := csitest.RandomBytes(2, int(mib))
			if err := os.WriteFile(filepath.Join(v.target, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			before := statfsTotal(t, v.target)
			unpublishUnstage(t, in, v)
			expand(t, in, id, k.fs, k.size+100*mib)
			w := stagePublish(t, in, id, k.fs)
			if after := statfsTotal(t, w.target); after-before < 90*mib {
				t.Fatalf("statfs total %d → %d bytes after growing the unstaged volume by 100 MiB", before, after)
			}
			csitest.AssertFileBytes(t, filepath.Join(w.target, "kept"), data)
		})
	}
}

// fsck checks the filesystem in the image file img (e2fsck -fn,
// xfs_repair -n) and fails the test when it finds damage. A frozen XFS
// still has its log to replay (freeze covers it, it does not empty it), as
// after a crash: xfs_repair refuses to judge such a filesystem, so the log
// is replayed first by mounting it once, as the first stage would.
func fsck(t *testing.T, fs, img string) {
	t.Helper()
	var cmd *exec.Cmd
	if fs == "xfs" {
		mnt := t.TempDir()
		mustRun(t, "mount", "-o", "loop,nouuid", img, mnt) // its source is mounted too
		mustRun(t, "umount", mnt)
		cmd = exec.Command("xfs_repair", "-n", "-f", img)
	} else {
		cmd = exec.Command("e2fsck", "-fn", img)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s on the restored image: %v\n%s", cmd, err, out)
	}
}

func mustRun(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
}

func imagePath(in *testdriver.Instance, id string) string {
	return filepath.Join(in.Opts.DataRoot, "block", id+".img")
}

func record(i int) []byte { return csitest.RandomBytes(uint64(i)+100, 4096) }

func checkRecords(t *testing.T, path string, n int) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) < n*4096 {
		t.Fatalf("the restored log holds %d bytes; %d records (%d bytes) were fsync'd before CreateSnapshot", len(raw), n, n*4096)
	}
	for i := range n {
		if !bytes.Equal(raw[i*4096:(i+1)*4096], record(i)) {
			t.Fatalf("record %d of %d fsync'd before CreateSnapshot differs in the restored volume", i, n)
		}
	}
}

// TestImageSnapshotWhileWriting: a snapshot of a staged image volume that
// a writer keeps appending to (fsync after every 4 KiB record), restored
// to a larger size, passes fsck, has grown to its new size, and holds
// every record fsync'd before the CreateSnapshot call (#12 items 3 and 4).
func TestImageSnapshotWhileWriting(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			v := stagePublish(t, in, createImage(t, in, "busy", k.fs, k.size, nil), k.fs)
			f, err := os.Create(filepath.Join(v.target, "log"))
			if err != nil {
				t.Fatal(err)
			}
			synced := make(chan int, 1)
			stop := make(chan struct{})
			done := make(chan error, 1)
			go func() {
				defer f.Close()
				for i := 0; ; i++ {
					select {
					case <-stop:
						done <- nil
						return
					default:
					}
					if _, err := f.Write(record(i)); err != nil {
						done <- err
						return
					}
					if err := f.Sync(); err != nil {
						done <- err
						return
					}
					select {
					case <-synced:
					default:
					}
					synced <- i + 1
				}
			}()
			n := 0
			for n < 50 { // the writer is well under way
				n = <-synced
			}
			n = <-synced // fsync'd before the call below
			s, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{SourceVolumeId: v.id, Name: "busy-snap"})
			close(stop)
			if werr := <-done; werr != nil {
				t.Fatalf("the writer failed while the snapshot was taken: %v", werr)
			}
			if err != nil {
				t.Fatal(err)
			}
			restored := createImage(t, in, "restored", k.fs, 2*k.size, csitest.FromSnapshot(s.GetSnapshot().GetSnapshotId()))
			if k.fs == "ext4" {
				// A copy of a mounted ext4 that was not frozen has its journal
				// marked as needing recovery; a frozen one is clean.
				out, err := exec.Command("dumpe2fs", "-h", imagePath(in, restored)).CombinedOutput()
				if err != nil || bytes.Contains(out, []byte("needs_recovery")) {
					t.Fatalf("the snapshot was not taken of a frozen filesystem (dumpe2fs: %v):\n%s", err, out)
				}
			}
			fsck(t, k.fs, imagePath(in, restored))
			r := stagePublish(t, in, restored, k.fs)
			if total := statfsTotal(t, r.target); total <= k.size {
				t.Fatalf("restored to %d bytes, its filesystem has %d: not grown at stage", 2*k.size, total)
			}
			checkRecords(t, filepath.Join(r.target, "log"), n)
		})
	}
}

// TestImageVolumeAfterReboot: after a reboot (every mount gone, every loop
// device detached, the driver restarted) staging again attaches the same
// image and the data is there; the filesystem is not made again (#12
// item 5).
func TestImageVolumeAfterReboot(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			id := createImage(t, in, "persist", k.fs, k.size, nil)
			v := stagePublish(t, in, id, k.fs)
			data := csitest.RandomBytes(7, int(mib))
			if err := os.WriteFile(filepath.Join(v.target, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			// The reboot: mounts and loop devices vanish under the driver.
			in.Stop(t)
			for _, p := range []string{v.target, v.staging} {
				if err := unix.Unmount(p, 0); err != nil {
					t.Fatalf("umount %s: %v", p, err)
				}
			}
			for dev, img := range csitest.Loops(t) {
				if img == imagePath(in, id) {
					if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
						t.Fatalf("losetup -d %s: %v %s", dev, err, out)
					}
				}
			}
			in2 := testdriver.StartWith(t, in.Opts)
			in2.Dir = in.Dir
			if _, err := in2.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
				VolumeId: id, StagingTargetPath: v.staging, VolumeCapability: csitest.MntCapFS(k.fs),
			}); err != nil {
				t.Fatalf("NodeStageVolume after the reboot: %v", err)
			}
			if _, err := in2.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
				VolumeId: id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: csitest.MntCapFS(k.fs),
			}); err != nil {
				t.Fatalf("NodePublishVolume after the reboot: %v", err)
			}
			csitest.AssertFileBytes(t, filepath.Join(v.target, "kept"), data)
			loops := 0
			for _, img := range csitest.Loops(t) {
				if img == imagePath(in, id) {
					loops++
				}
			}
			if loops != 1 {
				t.Fatalf("%d loop devices back the volume's image after the new stage, want 1", loops)
			}
			unpublishUnstage(t, in2, v)
		})
	}
}

// TestStagedImageVolumeIsKept: DeleteVolume of a staged image volume and
// NodeUnstageVolume while it is still published are FAILED_PRECONDITION,
// with the image, its loop device and its mounts untouched; the data is
// there afterwards.
func TestStagedImageVolumeIsKept(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			v := stagePublish(t, in, createImage(t, in, "kept", k.fs, k.size, nil), k.fs)
			data := csitest.RandomBytes(3, int(mib))
			if err := os.WriteFile(filepath.Join(v.target, "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: v.id})
			csitest.MustCode(t, err, codes.FailedPrecondition, "DeleteVolume of a staged image volume")
			_, err = in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
			csitest.MustCode(t, err, codes.FailedPrecondition, "NodeUnstageVolume while published")
			if _, err := os.Stat(imagePath(in, v.id)); err != nil {
				t.Fatalf("image: %v", err)
			}
			csitest.AssertFileBytes(t, filepath.Join(v.target, "kept"), data)
			csitest.AssertFileBytes(t, filepath.Join(v.staging, "kept"), data)
		})
	}
}

// imageLoopDevs lists the loop devices attached to volume id's image file.
func imageLoopDevs(t *testing.T, in *testdriver.Instance, id string) []string {
	t.Helper()
	img := csitest.RealPath(imagePath(in, id))
	var devs []string
	for dev, file := range csitest.Loops(t) {
		if file == img {
			devs = append(devs, dev)
		}
	}
	return devs
}

// A NodeUnstageVolume at a staging path where the image volume is not
// staged answers OK and changes nothing: its loop device stays attached,
// without autoclear (before, the call asked the kernel to detach it at its
// last close, waited for that, and answered OK with the filesystem still
// mounted), and the publication keeps working. The real unpublish and
// unstage then detach it.
func TestUnstageAtAnotherPathKeepsTheVolume(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			v := stagePublish(t, in, createImage(t, in, "elsewhere", k.fs, k.size, nil), k.fs)
			devs := imageLoopDevs(t, in, v.id)
			if len(devs) != 1 {
				t.Fatalf("loop devices of the staged image: %v, want one", devs)
			}
			other := csitest.Mkdir(t, filepath.Join(in.Dir, "other-staging"))
			_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: other})
			csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume at a path it is not staged at")
			if got := imageLoopDevs(t, in, v.id); len(got) != 1 || got[0] != devs[0] {
				t.Fatalf("loop devices after the unstage elsewhere: %v, want %v", got, devs)
			}
			b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(devs[0]), "loop", "autoclear"))
			if err != nil || string(bytes.TrimSpace(b)) != "0" {
				t.Errorf("autoclear of %s: %q, %v; want 0", devs[0], b, err)
			}
			data := csitest.RandomBytes(7, 64<<10)
			if err := os.WriteFile(filepath.Join(v.target, "after"), data, 0o600); err != nil {
				t.Fatalf("write into the publication: %v", err)
			}
			csitest.AssertFileBytes(t, filepath.Join(v.staging, "after"), data)
			unpublishUnstage(t, in, v)
			if got := imageLoopDevs(t, in, v.id); len(got) != 0 {
				t.Errorf("loop devices after the real unpublish and unstage: %v, want none", got)
			}
		})
	}
}

// C54: one image volume staged at two staging paths (two PVs with the same
// volumeHandle on one node: the kubelet stages each PV at its own path).
// Both stages are the same filesystem on one loop device, a write through
// one publication is read through the other at once, and a publication
// still blocks the unstage of its own stage. When one pod ends, its
// unstage answers OK while the other pod (published from the other stage)
// goes on reading; in either order, the last unstage leaves nothing
// mounted or attached.
func TestTwoStagesOfOneVolume(t *testing.T) {
	for _, k := range kinds {
		t.Run(k.fs, func(t *testing.T) {
			in := startImageRoot(t, k.dataRoot)
			id := createImage(t, in, "twice", k.fs, k.size, nil)
			// Two PVs of it, each staged at its own path and published to
			// its own pod, as the kubelet does.
			var a, b *vol
			for _, pv := range []struct {
				name string
				v    **vol
			}{{"a", &a}, {"b", &b}} {
				v := &vol{id: id, staging: csitest.Mkdir(t, filepath.Join(in.Dir, "staging-"+pv.name)), target: filepath.Join(in.Dir, "target-"+pv.name)}
				if _, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
					VolumeId: id, StagingTargetPath: v.staging, VolumeCapability: csitest.MntCapFS(k.fs)}); err != nil {
					t.Fatalf("NodeStageVolume %s: %v", pv.name, err)
				}
				if _, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
					VolumeId: id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: csitest.MntCapFS(k.fs),
					VolumeContext: map[string]string{"csi.storage.k8s.io/pod.uid": "pod-" + pv.name}}); err != nil {
					t.Fatalf("NodePublishVolume %s: %v", pv.name, err)
				}
				t.Cleanup(func() { unpublishUnstage(t, in, v) })
				*pv.v = v
			}
			if devs := imageLoopDevs(t, in, a.id); len(devs) != 1 {
				t.Fatalf("loop devices of an image staged twice: %v, want one", devs)
			}
			data := csitest.RandomBytes(54, 64<<10)
			if err := os.WriteFile(filepath.Join(a.target, "shared"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			csitest.AssertFileBytes(t, filepath.Join(b.target, "shared"), data)

			// A publication still blocks the unstage of its stage.
			_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: b.id, StagingTargetPath: b.staging})
			csitest.MustCode(t, err, codes.FailedPrecondition, "NodeUnstageVolume of a stage still published")

			// Each pod ends on its own (ext4: B's first, xfs: A's first):
			// the first unstage answers OK while the other stage's
			// publication (the other pod) goes on reading.
			order := []*vol{b, a}
			if k.fs == "xfs" {
				order = []*vol{a, b}
			}
			for _, v := range order {
				if _, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.target}); err != nil {
					t.Fatalf("NodeUnpublishVolume %s: %v", v.target, err)
				}
				_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.staging})
				csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume "+v.staging+" with the volume staged elsewhere too")
				v.done = true
				if v == order[0] {
					csitest.AssertFileBytes(t, filepath.Join(order[1].target, "shared"), data)
				}
			}
			for _, p := range []string{a.staging, b.staging, a.target, b.target} {
				if ms := csitest.MountsUnder(t, p); len(ms) != 0 {
					t.Errorf("still mounted at %s: %v", p, ms)
				}
			}
			if devs := imageLoopDevs(t, in, a.id); len(devs) != 0 {
				t.Errorf("loop devices after both unstages: %v, want none", devs)
			}
		})
	}
}
