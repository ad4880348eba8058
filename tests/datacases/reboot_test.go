package datacases

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

// published is a volume staged and published before the "reboot", with
// what it must still show afterwards.
type published struct {
	e               *env
	id              string
	block           bool
	staging, target string
	check           func(t *testing.T, target string)
}

// TestNodeRebootSimulation: volumes of every kind are staged, published and
// filled: a dir-engine mount volume (holding a tree with every kind of
// entry) and a block volume on the machine's disk, a btrfs mount volume and
// a block volume on a btrfs data root, and an ephemeral inline volume.
// Then the node "reboots": every mount under the test's paths is
// unmounted, every loop device of the data roots detached, an unrelated
// loop device attached first so the loop numbers shift, and both drivers
// stopped and started again. The ephemeral volume, whose mount is gone, is
// removed at start (data directory gone, capacity back), and its late
// unpublish is OK. NodeStage and NodePublish with the original arguments
// then bring every other volume back with its own data, a block volume's
// pattern read through its published device node.
func TestNodeRebootSimulation(t *testing.T) {
	disk := diskEnv(t)
	bfs := start(t, testfs.Btrfs, 1<<30, func(o *driver.Options) { o.Engine = "btrfs"; o.CapacityBytes = 256 * csitest.Mi })
	var vols []*published
	add := func(e *env, name string, size int64, block bool, fill func(t *testing.T, target string) func(*testing.T, string)) {
		v := e.create(name, size, block)
		s, tgt := e.attach(v.GetVolumeId(), block)
		vols = append(vols, &published{e: e, id: v.GetVolumeId(), block: block, staging: s, target: tgt, check: fill(t, tgt)})
	}
	blockFill := func(seed uint64, n int) func(*testing.T, string) func(*testing.T, string) {
		return func(t *testing.T, tgt string) func(*testing.T, string) {
			p := csitest.RandomBytes(seed, n)
			writeDevAt(t, tgt, 0, p)
			return func(t *testing.T, tgt string) { assertBytes(t, "block pattern after reboot", readDev(t, tgt, 0, n), p) }
		}
	}
	fileFill := func(seed uint64, n int) func(*testing.T, string) func(*testing.T, string) {
		return func(t *testing.T, tgt string) func(*testing.T, string) {
			d := csitest.RandomBytes(seed, n)
			mustWrite(t, filepath.Join(tgt, "f"), d)
			return func(t *testing.T, tgt string) { assertFile(t, filepath.Join(tgt, "f"), d) }
		}
	}
	add(disk, "dir-vol", 32*csitest.Mi, false, func(t *testing.T, tgt string) func(*testing.T, string) {
		treecmp.BuildRich(t, filepath.Join(tgt, "tree"), filepath.Join(disk.dir, "outside"))
		mustWrite(t, filepath.Join(tgt, "f"), csitest.RandomBytes(40, 12345))
		before := treecmp.Scan(t, tgt)
		return func(t *testing.T, tgt string) {
			for _, d := range treecmp.Diff(before, treecmp.Scan(t, tgt), treecmp.Options{}) {
				t.Errorf("dir volume after reboot: %s", d)
			}
		}
	})
	add(disk, "blk-disk", 8*csitest.Mi, true, blockFill(41, int(8*csitest.Mi)))
	add(bfs, "btrfs-vol", 16*csitest.Mi, false, fileFill(42, int(3*csitest.Mi)))
	add(bfs, "blk-btrfs", 4*csitest.Mi, true, blockFill(43, int(4*csitest.Mi)))

	// The ephemeral volume.
	capBeforeEph := disk.available()
	volsBeforeEph := csitest.DirNames(t, filepath.Join(disk.root, "volumes"))
	_, ephTarget := disk.paths()
	_, err := disk.node().NodePublishVolume(csitest.Ctx(t), ephemeralReq("csi-eph-reboot", ephTarget, "10Mi"))
	csitest.MustCode(t, err, codes.OK, "publish ephemeral volume")
	mustWrite(t, filepath.Join(ephTarget, "f"), []byte("ephemeral"))
	var ephDir string
	for _, n := range csitest.DirNames(t, filepath.Join(disk.root, "volumes")) {
		if !slices.Contains(volsBeforeEph, n) {
			ephDir = filepath.Join(disk.root, "volumes", n)
		}
	}
	if ephDir == "" || disk.available() != capBeforeEph-10*csitest.Mi {
		t.Fatalf("ephemeral volume: data dir %q, available %d (was %d)", ephDir, disk.available(), capBeforeEph)
	}

	oldLoops := map[string]string{}
	for _, v := range vols {
		if v.block {
			oldLoops[v.id] = loopOf(t, v.e.imagePath(v.id))
		}
	}

	// "Reboot": mounts and loop devices are gone, loop numbers shift.
	for _, e := range []*env{disk, bfs} {
		ms := csitest.MountsUnder(t, e.dir)
		for i := len(ms) - 1; i >= 0; i-- {
			if err := unix.Unmount(ms[i].Mountpoint, 0); err != nil {
				t.Fatalf("unmount %s: %v", ms[i].Mountpoint, err)
			}
		}
		for _, l := range loopDevsUnder(t, e.root) {
			detachLoop(t, l)
		}
	}
	scratch := filepath.Join(disk.dir, "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(scratch, 4*csitest.Mi); err != nil {
		t.Fatal(err)
	}
	scratchDev := attachLoop(t, scratch)
	for _, e := range []*env{disk, bfs} {
		deadline := time.Now().Add(5 * time.Second)
		for len(loopDevsUnder(t, e.root)) > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if l := loopDevsUnder(t, e.root); len(l) > 0 {
			t.Fatalf("loop devices still attached after detaching: %v", l)
		}
		if ms := csitest.MountsUnder(t, e.dir); len(ms) > 0 {
			t.Fatalf("mounts left after unmounting: %d", len(ms))
		}
	}
	disk.restart()
	bfs.restart()

	// The ephemeral volume is gone, its capacity back; its late unpublish
	// is OK and removes the target.
	csitest.AssertGone(t, ephDir)
	if got := disk.available(); got != capBeforeEph {
		t.Errorf("GetCapacity after restart: %d, want %d (the ephemeral volume's 10Mi returned)", got, capBeforeEph)
	}
	_, err = disk.node().NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-eph-reboot", TargetPath: ephTarget})
	csitest.CodeIs(t, err, codes.OK, "unpublish of the ephemeral volume removed at restart")
	csitest.AssertGone(t, ephTarget)

	for _, v := range vols {
		e := v.e
		if n := len(csitest.MountsAt(t, v.target)); n != 0 {
			t.Fatalf("%s: %d mounts before the new publish", v.target, n)
		}
		csitest.MustCode(t, e.stageReq(v.id, v.staging, v.block), codes.OK, "NodeStageVolume after reboot "+v.id)
		csitest.MustCode(t, e.publishReq(v.id, v.staging, v.target, v.block), codes.OK, "NodePublishVolume after reboot "+v.id)
		e.assertPublished(v.id, v.target, v.block)
		// A repeat is idempotent and does not stack mounts.
		csitest.MustCode(t, e.publishReq(v.id, v.staging, v.target, v.block), codes.OK, "repeated NodePublishVolume after reboot "+v.id)
		if n := len(csitest.MountsAt(t, v.target)); n != 1 {
			t.Errorf("%s: %d mounts after a repeated publish, want 1", v.target, n)
		}
		if v.block {
			dev := loopOf(t, e.imagePath(v.id))
			if dev == scratchDev {
				t.Errorf("volume %s got the scratch loop device %s", v.id, dev)
			}
			t.Logf("block volume %s: %s before the reboot, %s after", v.id, oldLoops[v.id], dev)
		}
		v.check(t, v.target)
	}
	for _, v := range vols {
		v.e.detach(v.id, v.staging, v.target)
		v.e.deleteVolume(v.id)
	}
	disk.assertVolumes()
	bfs.assertVolumes()
}

// TestSnapshotDoesNotBlockOtherVolumes: while CreateSnapshot copies 200 MiB
// of a dir-engine volume, a CreateVolume and a DeleteVolume of unrelated
// volumes complete before it does, and a DeleteVolume of the snapshot's
// own source answers ABORTED at once instead of queueing.
func TestSnapshotDoesNotBlockOtherVolumes(t *testing.T) {
	e := start(t, "", 0, func(o *driver.Options) { o.CapacityBytes = 4 << 30; o.Engine = "dir" })
	big := e.create("big", 1<<30, false)
	bigID := big.GetVolumeId()
	s, tgt := e.attach(bigID, false)
	const files = 200
	for i := 0; i < files; i++ {
		if err := os.WriteFile(filepath.Join(tgt, "f"+string(rune('A'+i%26))+string(rune('a'+i/26))), csitest.RandomBytes(uint64(1000+i), int(csitest.Mi)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.detach(bigID, s, tgt)
	other := e.create("other", 4*csitest.Mi, false)

	type result struct {
		snap *csi.Snapshot
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := e.ctl().CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "big-snap", SourceVolumeId: bigID})
		done <- result{resp.GetSnapshot(), err}
	}()
	// Wait until the copy is under way: its directory appears in snapshots/.
	snapRoot := filepath.Join(e.root, "snapshots")
	deadline := time.Now().Add(30 * time.Second)
	for len(csitest.DirNames(t, snapRoot)) == 0 {
		select {
		case r := <-done:
			t.Fatalf("the snapshot finished (%v) before its copy was seen running; nothing was tested", r.err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("snapshot copy never started")
		}
		time.Sleep(200 * time.Microsecond)
	}

	v, err := e.createReq(&csi.CreateVolumeRequest{Name: "unrelated", CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.MustCode(t, err, codes.OK, "CreateVolume during a snapshot of another volume")
	_, err = e.ctl().DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: other.GetVolumeId()})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume of an unrelated volume during the snapshot")
	_, errSrc := e.ctl().DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: bigID})
	select {
	case r := <-done:
		t.Fatalf("the snapshot (%v) returned before the unrelated calls: they waited for it", r.err)
	default:
	}
	csitest.CodeIs(t, errSrc, codes.Aborted, "DeleteVolume of the snapshot's source while it is copied")

	r := <-done
	csitest.MustCode(t, r.err, codes.OK, "CreateSnapshot big-snap")
	if !r.snap.GetReadyToUse() || r.snap.GetSizeBytes() != 1<<30 {
		t.Errorf("snapshot: %v, want ready and 1Gi", r.snap)
	}
	// The snapshot holds all the data.
	names := csitest.DirNames(t, filepath.Join(snapRoot, r.snap.GetSnapshotId()))
	if len(names) != files {
		t.Errorf("snapshot holds %d files, want %d", len(names), files)
	}
	for _, n := range names {
		if fi, err := os.Stat(filepath.Join(snapRoot, r.snap.GetSnapshotId(), n)); err != nil || fi.Size() != csitest.Mi {
			t.Errorf("snapshot file %s: %v, %v", n, fi, err)
		}
	}
	e.assertVolumes(bigID, v.GetVolumeId())
	e.deleteVolume(bigID)
	e.deleteVolume(v.GetVolumeId())
	e.deleteSnapshot(r.snap.GetSnapshotId())
	if _, err := os.Lstat(filepath.Join(snapRoot, r.snap.GetSnapshotId())); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot data left after DeleteSnapshot: %v", err)
	}
}
