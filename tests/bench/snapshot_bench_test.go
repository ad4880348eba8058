package bench

// Snapshot and restore benchmarks: CreateSnapshot of a mount volume holding
// 200 MiB of random data (200 files of 1 MiB), CreateVolume from that
// snapshot (the restore), and the latency of an unrelated CreateVolume
// issued while a snapshot of the big volume is in flight, on three data
// roots:
//
//	BenchmarkSnapshotRestoreDirDisk      dir engine on the machine's disk (a full copy)
//	BenchmarkSnapshotRestoreDirXFSReflink dir engine on a loop-mounted XFS with reflink=1 (shared extents)
//	BenchmarkSnapshotRestoreBtrfs        btrfs engine on a loop-mounted btrfs with quotas (subvolume snapshots)
//
// Figures (b.ReportMetric, medians over b.N when -benchtime > 1x):
//
//	snapshot-ms          CreateSnapshot, as the client sees it
//	restore-ms           CreateVolume with the snapshot as content source
//	snapshot-sync-ms     syncfs(2) of the data root right after the snapshot
//	restore-sync-ms      returned, and after the restore: the writeback of
//	                     the copied data, which the driver leaves to the
//	                     kernel (it does not fsync the copy)
//	idle-create-ms       an unrelated 1 MiB CreateVolume with nothing else
//	                     running (median of 5), for comparison
//	unrelated-create-ms  an unrelated 1 MiB CreateVolume issued while a second
//	                     snapshot of the 200 MiB volume is in flight
//	concurrent-snapshot-ms  that second snapshot
//	overlapped           1 when the unrelated create was issued and
//	                     answered while that snapshot was still in flight
//	                     (0 when the snapshot was over first: btrfs
//	                     snapshots can be too quick to overlap)
//
// Targets (reported, not asserted): btrfs snapshot and restore ≤ 50 ms each,
// reflink XFS ≤ 200 ms each, the unrelated create ≤ 10 ms in every case.
//
// The data is written straight into <data root>/volumes/<id>/ and synced
// (sync(2)) before anything is timed; every timed phase starts after a sync,
// so none pays for an earlier one's writeback. Correctness is checked on the
// way: ready_to_use and size_bytes of the snapshot, the restored volume's
// file names and sizes and the SHA-256 of a spread of its files, btrfs
// subvolumes where the btrfs engine is asked for, shared extents on reflink
// XFS (the snapshot must not take the 200 MiB), and at the end no volume,
// snapshot or data directory left.

import (
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

const (
	// snapFiles files of snapFileSize random bytes make the source volume.
	snapFiles    = 200
	snapFileSize = 1 << 20
	// snapVolumeSize is the source volume's capacity: room for the data and
	// the metadata the btrfs qgroup limit counts too.
	snapVolumeSize = 256 << 20
	// snapFSSize is the size of the loop-backed filesystems (a sparse image
	// on the machine's disk): the source, two snapshots and a restore must
	// fit even where the copy is a full one.
	snapFSSize = 2 << 30
	// hashedFiles is how many files of the restored volume are hashed and
	// compared with the source's (all are compared by name and size).
	hashedFiles = 8
	// inflightWait bounds the wait for the concurrent snapshot to show its
	// directory under <data root>/snapshots before the unrelated create is
	// issued anyway.
	inflightWait = 5 * time.Millisecond
)

// BenchmarkSnapshotRestoreDirDisk: the dir engine on the machine's disk;
// snapshot and restore are full copies (copy_file_range).
func BenchmarkSnapshotRestoreDirDisk(b *testing.B) { benchSnapshot(b, "", "dir") }

// BenchmarkSnapshotRestoreDirXFSReflink: the dir engine on XFS made with
// reflink=1; snapshot and restore share extents (FICLONE).
func BenchmarkSnapshotRestoreDirXFSReflink(b *testing.B) {
	benchSnapshot(b, testfs.XFSReflink, "dir")
}

// BenchmarkSnapshotRestoreBtrfs: the btrfs engine on btrfs with quotas;
// snapshot and restore are subvolume snapshots.
func BenchmarkSnapshotRestoreBtrfs(b *testing.B) { benchSnapshot(b, testfs.Btrfs, "btrfs") }

// snapFigures are the measurements of one iteration.
type snapFigures struct {
	snapshot, restore, snapshotSync, restoreSync time.Duration
	idleCreate, unrelated, concurrentSnapshot    time.Duration
	overlapped                                   bool
}

func benchSnapshot(b *testing.B, fsKind, engine string) {
	b.StopTimer()
	in := startSnapshotDriver(b, fsKind, engine)
	root := in.Opts.DataRoot
	c := in.Controller
	// Runs before the driver stops (cleanups are last-in first-out): delete
	// whatever a failed iteration left. Deleting unknown ids succeeds.
	var vols, snaps []string
	b.Cleanup(func() {
		if err := deleteAll(c, &vols, &snaps); err != nil {
			b.Errorf("cleanup: %v", err)
		}
	})

	var figs []snapFigures
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		figs = append(figs, snapshotCycle(b, in, n, fsKind, engine, &vols, &snaps))
		if err := deleteAll(c, &vols, &snaps); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()

	// Everything is gone: records and data.
	expectVolumes(b, c, 0, nil)
	ctx, cancel := call()
	ls, err := c.ListSnapshots(ctx, &csi.ListSnapshotsRequest{})
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	if len(ls.GetEntries()) != 0 {
		b.Fatalf("ListSnapshots shows %d snapshots after all were deleted", len(ls.GetEntries()))
	}
	for _, d := range []string{"volumes", "snapshots"} {
		if left := dirNames(b, filepath.Join(root, d)); len(left) > 0 {
			b.Fatalf("%s/%s still holds %v after every volume and snapshot was deleted", root, d, left)
		}
	}

	med := func(f func(snapFigures) time.Duration) float64 {
		ds := make([]time.Duration, len(figs))
		for i, fg := range figs {
			ds[i] = f(fg)
		}
		return percentile(ds, 50)
	}
	overlapped := 0.0
	for _, fg := range figs {
		if fg.overlapped {
			overlapped++
		}
	}
	overlapped /= float64(len(figs))
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.snapshot }), "snapshot-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.restore }), "restore-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.snapshotSync }), "snapshot-sync-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.restoreSync }), "restore-sync-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.idleCreate }), "idle-create-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.unrelated }), "unrelated-create-ms")
	b.ReportMetric(med(func(f snapFigures) time.Duration { return f.concurrentSnapshot }), "concurrent-snapshot-ms")
	b.ReportMetric(overlapped, "overlapped")
	// ns/op is the time of snapshot + restore (the only timed part).
}

// startSnapshotDriver runs a driver with the engine on a data root on the
// machine's disk (fsKind "") or on a fresh testfs filesystem, and checks
// that the data root is on the filesystem meant.
func startSnapshotDriver(b *testing.B, fsKind, engine string) *testdriver.Instance {
	b.Helper()
	testdriver.RequireRoot(b)
	var fsRoot string
	if fsKind != "" {
		// Registered first, so unmounted after the driver stopped.
		fsRoot = testfs.New(b, fsKind, snapFSSize)
	}
	in := testdriver.Start(b, func(o *driver.Options) {
		o.Engine = contract.Engine(engine)
		if fsRoot != "" {
			o.DataRoot = filepath.Join(fsRoot, "data")
		}
	})
	var sfs unix.Statfs_t
	if err := unix.Statfs(in.Opts.DataRoot, &sfs); err != nil {
		b.Fatalf("statfs %s: %v", in.Opts.DataRoot, err)
	}
	typ := int64(sfs.Type)
	switch {
	case typ == unix.TMPFS_MAGIC || typ == unix.RAMFS_MAGIC:
		b.Fatalf("data root %s is on tmpfs/ramfs: copies and syncs would cost nothing; set TMPDIR to a directory on disk", in.Opts.DataRoot)
	case fsKind == testfs.XFSReflink && typ != unix.XFS_SUPER_MAGIC,
		fsKind == testfs.Btrfs && typ != unix.BTRFS_SUPER_MAGIC:
		b.Fatalf("data root %s is on filesystem type %#x, not %s", in.Opts.DataRoot, typ, fsKind)
	}
	return in
}

// snapshotCycle makes one source volume full of random data, snapshots it
// (timed), restores the snapshot (timed), checks the restored data, then
// measures an unrelated create during a second snapshot. The ids it makes
// are appended to vols and snaps for deletion.
func snapshotCycle(b *testing.B, in *testdriver.Instance, n int, fsKind, engine string, vols, snaps *[]string) snapFigures {
	b.Helper()
	c := in.Controller
	root := in.Opts.DataRoot
	var f snapFigures

	// The source volume and its data, written directly into its directory.
	ctx, cancel := call()
	src, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               fmt.Sprintf("snap-source-%d", n),
		CapacityRange:      &csi.CapacityRange{RequiredBytes: snapVolumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
	})
	cancel()
	if err != nil {
		b.Fatalf("CreateVolume (source): %v", err)
	}
	srcID, srcSize := src.GetVolume().GetVolumeId(), src.GetVolume().GetCapacityBytes()
	*vols = append(*vols, srcID)
	srcDir := filepath.Join(root, "volumes", srcID)
	if engine == "btrfs" {
		expectSubvolume(b, srcDir)
	}
	want := fillVolume(b, srcDir, uint64(n))
	syncAll()
	freeBefore := freeBytesRoot(b, root)

	// Snapshot.
	snapName := fmt.Sprintf("snap-%d", n)
	b.StartTimer()
	snap, took, err := createSnapshot(c, snapName, srcID)
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	f.snapshot = took
	*snaps = append(*snaps, snap.GetSnapshotId())
	checkSnapshot(b, snap, srcID, srcSize)
	f.snapshotSync = timedSyncfs(b, root)
	if engine == "btrfs" {
		expectSubvolume(b, filepath.Join(root, "snapshots", snap.GetSnapshotId()))
	}
	if fsKind == testfs.XFSReflink {
		// Shared extents: the snapshot takes (almost) no space. A full copy
		// would take the 200 MiB.
		if used := freeBefore - freeBytesRoot(b, root); used > snapFiles*snapFileSize/4 {
			b.Fatalf("the snapshot took %d MiB of the reflink XFS: its data was copied, not shared", used>>20)
		}
	}
	syncAll()

	// Restore.
	ctx, cancel = call()
	t0 := time.Now()
	b.StartTimer()
	rv, err := c.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name:               fmt.Sprintf("snap-restore-%d", n),
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
			Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: snap.GetSnapshotId()},
		}},
	})
	b.StopTimer()
	f.restore = time.Since(t0)
	cancel()
	if err != nil {
		b.Fatalf("CreateVolume from snapshot %s: %v", snap.GetSnapshotId(), err)
	}
	restored := rv.GetVolume()
	*vols = append(*vols, restored.GetVolumeId())
	if got := restored.GetContentSource().GetSnapshot().GetSnapshotId(); got != snap.GetSnapshotId() {
		b.Fatalf("restored volume's content source is snapshot %q, want %s", got, snap.GetSnapshotId())
	}
	if restored.GetCapacityBytes() != srcSize {
		b.Fatalf("restored volume has capacity %d, want the snapshot's %d", restored.GetCapacityBytes(), srcSize)
	}
	f.restoreSync = timedSyncfs(b, root)
	restoredDir := filepath.Join(root, "volumes", restored.GetVolumeId())
	if engine == "btrfs" {
		expectSubvolume(b, restoredDir)
	}
	checkRestored(b, restoredDir, want)
	syncAll()

	// An unrelated create with nothing else running, for comparison.
	idle := make([]time.Duration, 5)
	for i := range idle {
		t0 := time.Now()
		id, err := createVolumeErr(c, fmt.Sprintf("idle-%d-%d", n, i))
		idle[i] = time.Since(t0)
		if err != nil {
			b.Fatal(err)
		}
		if err := deleteVolumeErr(c, id); err != nil {
			b.Fatal(err)
		}
	}
	slices.Sort(idle)
	f.idleCreate = idle[len(idle)/2]
	syncAll()

	// An unrelated create while a second snapshot of the big volume runs.
	f.unrelated, f.concurrentSnapshot, f.overlapped = createDuringSnapshot(b, in, n, srcID, srcSize, vols, snaps)
	return f
}

// createDuringSnapshot starts a snapshot of srcID, waits until it is in
// flight (its directory shows under <data root>/snapshots, or
// inflightWait passed), then times an unrelated small CreateVolume. It
// returns the create's latency, the snapshot's, and whether the create was
// issued and answered while the snapshot call was still in flight.
func createDuringSnapshot(b *testing.B, in *testdriver.Instance, n int, srcID string, srcSize int64, vols, snaps *[]string) (time.Duration, time.Duration, bool) {
	b.Helper()
	c := in.Controller
	snapRoot := filepath.Join(in.Opts.DataRoot, "snapshots")
	before := dirNames(b, snapRoot)
	type result struct {
		snap *csi.Snapshot
		took time.Duration
		end  time.Time
		err  error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		s, took, err := createSnapshot(c, fmt.Sprintf("snap-concurrent-%d", n), srcID)
		done <- result{s, took, time.Now(), err}
	}()

	// Wait until the snapshot is in flight.
	seen := "not seen within " + inflightWait.String()
	var early *result
wait:
	for time.Since(start) < inflightWait {
		select {
		case r := <-done:
			early = &r
			seen = "snapshot returned first"
			break wait
		default:
		}
		if len(dirNames(b, snapRoot)) > len(before) {
			seen = "directory seen"
			break
		}
		time.Sleep(100 * time.Microsecond)
	}

	t0 := time.Now()
	id, err := createVolumeErr(c, fmt.Sprintf("unrelated-%d", n))
	t1 := time.Now()
	if id != "" {
		*vols = append(*vols, id)
	}
	r := early
	if r == nil {
		rr := <-done
		r = &rr
	}
	if r.err != nil {
		b.Fatal(r.err)
	}
	*snaps = append(*snaps, r.snap.GetSnapshotId())
	if err != nil {
		b.Fatal(err)
	}
	checkSnapshot(b, r.snap, srcID, srcSize)

	unrelated := t1.Sub(t0)
	overlapped := early == nil && r.end.After(t1)
	b.Logf("unrelated create: %.2f ms, issued %.2f ms into a %.1f ms snapshot (%s); answered %s the snapshot returned",
		ms(unrelated), ms(t0.Sub(start)), ms(r.took), seen, map[bool]string{true: "before", false: "after"}[r.end.After(t1)])
	if !overlapped && r.took > 100*time.Millisecond {
		// A slow snapshot that the unrelated create did not finish within:
		// it waited for the snapshot (or the machine is very loaded).
		b.Logf("NOTE: the unrelated create was not answered while the %.0f ms snapshot was in flight", ms(r.took))
	}
	return unrelated, r.took, overlapped
}

// createSnapshot calls CreateSnapshot and returns the snapshot and the
// call's latency.
func createSnapshot(c csi.ControllerClient, name, srcID string) (*csi.Snapshot, time.Duration, error) {
	ctx, cancel := call()
	defer cancel()
	t0 := time.Now()
	resp, err := c.CreateSnapshot(ctx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: srcID})
	took := time.Since(t0)
	if err != nil {
		return nil, took, fmt.Errorf("CreateSnapshot %s of %s: %w", name, srcID, err)
	}
	return resp.GetSnapshot(), took, nil
}

// checkSnapshot fails the benchmark unless the snapshot is ready, of the
// source, and as large as the source volume.
func checkSnapshot(b *testing.B, s *csi.Snapshot, srcID string, srcSize int64) {
	b.Helper()
	switch {
	case s.GetSnapshotId() == "":
		b.Fatal("CreateSnapshot returned no snapshot_id")
	case !s.GetReadyToUse():
		b.Fatalf("snapshot %s: ready_to_use is false", s.GetSnapshotId())
	case s.GetSourceVolumeId() != srcID:
		b.Fatalf("snapshot %s: source_volume_id %q, want %s", s.GetSnapshotId(), s.GetSourceVolumeId(), srcID)
	case s.GetSizeBytes() != srcSize:
		b.Fatalf("snapshot %s: size_bytes %d, want the source's %d", s.GetSnapshotId(), s.GetSizeBytes(), srcSize)
	}
}

// fillVolume writes snapFiles files of snapFileSize random bytes into dir
// and returns their SHA-256 by name.
func fillVolume(b *testing.B, dir string, seed uint64) map[string][32]byte {
	b.Helper()
	var key [32]byte
	for i := range key {
		key[i] = byte(seed>>(8*(i%8))) ^ byte(i)
	}
	key[31] ^= byte(time.Now().UnixNano())
	rng := rand.NewChaCha8(key)
	buf := make([]byte, snapFileSize)
	sums := make(map[string][32]byte, snapFiles)
	for i := 0; i < snapFiles; i++ {
		_, _ = rng.Read(buf)
		name := fmt.Sprintf("file-%03d", i)
		if err := os.WriteFile(filepath.Join(dir, name), buf, 0o644); err != nil {
			b.Fatal(err)
		}
		sums[name] = sha256.Sum256(buf)
	}
	return sums
}

// checkRestored fails the benchmark unless dir holds exactly the files of
// want with their sizes, and a spread of hashedFiles of them has the same
// SHA-256.
func checkRestored(b *testing.B, dir string, want map[string][32]byte) {
	b.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	if len(ents) != len(want) {
		b.Fatalf("restored volume holds %d entries, the source %d", len(ents), len(want))
	}
	for _, e := range ents {
		if _, ok := want[e.Name()]; !ok {
			b.Fatalf("restored volume holds %q, which the source does not", e.Name())
		}
		fi, err := e.Info()
		if err != nil {
			b.Fatal(err)
		}
		if !fi.Mode().IsRegular() || fi.Size() != snapFileSize {
			b.Fatalf("restored %s: mode %v, size %d; want a regular file of %d bytes", e.Name(), fi.Mode(), fi.Size(), snapFileSize)
		}
	}
	for k := 0; k < hashedFiles; k++ {
		name := fmt.Sprintf("file-%03d", k*(snapFiles-1)/(hashedFiles-1))
		fh, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.New()
		_, err = io.Copy(h, fh)
		fh.Close()
		if err != nil {
			b.Fatal(err)
		}
		if got := [32]byte(h.Sum(nil)); got != want[name] {
			b.Fatalf("restored %s differs from the source's (SHA-256 %x, want %x)", name, got, want[name])
		}
	}
}

// expectSubvolume fails the benchmark unless p is the root of a btrfs
// subvolume (inode 256): the btrfs engine's volumes, snapshots and restores
// are.
func expectSubvolume(b *testing.B, p string) {
	b.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		b.Fatal(err)
	}
	if st.Ino != 256 {
		b.Fatalf("%s is not a btrfs subvolume (inode %d)", p, st.Ino)
	}
}

// deleteAll deletes the volumes, then the snapshots, and empties both lists.
func deleteAll(c csi.ControllerClient, vols, snaps *[]string) error {
	for len(*vols) > 0 {
		id := (*vols)[len(*vols)-1]
		if err := deleteVolumeErr(c, id); err != nil {
			return err
		}
		*vols = (*vols)[:len(*vols)-1]
	}
	for len(*snaps) > 0 {
		id := (*snaps)[len(*snaps)-1]
		ctx, cancel := call()
		_, err := c.DeleteSnapshot(ctx, &csi.DeleteSnapshotRequest{SnapshotId: id})
		cancel()
		if err != nil {
			return fmt.Errorf("DeleteSnapshot %s: %w", id, err)
		}
		*snaps = (*snaps)[:len(*snaps)-1]
	}
	return nil
}

func dirNames(b *testing.B, dir string) []string {
	b.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, len(ents))
	for i, e := range ents {
		names[i] = e.Name()
	}
	return names
}

// syncAll flushes every filesystem; twice, so that what a loop-mounted
// filesystem pushed into its backing file in the first pass is written too.
func syncAll() {
	unix.Sync()
	unix.Sync()
}

// timedSyncfs flushes the filesystem holding dir and returns how long it took.
func timedSyncfs(b *testing.B, dir string) time.Duration {
	b.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Close(fd)
	t0 := time.Now()
	if err := unix.Syncfs(fd); err != nil {
		b.Fatalf("syncfs %s: %v", dir, err)
	}
	return time.Since(t0)
}

// freeBytesRoot is the free space of the filesystem holding dir, the blocks
// reserved for root included (statfs f_bfree).
func freeBytesRoot(b *testing.B, dir string) int64 {
	b.Helper()
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err != nil {
		b.Fatalf("statfs %s: %v", dir, err)
	}
	return int64(sfs.Bfree) * sfs.Bsize
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
