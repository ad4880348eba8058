package reliability

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// Valid requests that conflict, raced (case C34 and its kind): a restore
// against the deletion of its snapshot, a clone against the deletion of its
// source, a snapshot against the deletion of its source, an expansion
// against a snapshot, and a block restore against the deletion of its
// snapshot. Each pair is sent concurrently, the second call 0–25 ms after
// the first (or first), for many rounds, on the dir engine, on btrfs, and in
// cluster mode (controller and node plugin meeting through the API server,
// where the node's reconcilers do the disk work).
//
// Every answer must be one the CSI spec allows for the conflict (OK,
// ABORTED, NOT_FOUND for a source already gone), and nothing is ever
// acknowledged with partial data: every volume or snapshot a call
// acknowledged is compared byte for byte, file by file, with its source's
// content. A delete refused with ABORTED succeeds when sent again once the
// reader is done. At the end everything is deleted and the data root holds
// nothing: no volume, snapshot, in-flight entry or orphaned data.
//
// Before the fix a snapshot deleted during a restore was acknowledged to
// both callers and the restored volume held part of the snapshot's files.

const (
	conflictFiles    = 100 // in 10 directories
	conflictFileSize = 24 << 10
	conflictVolSize  = 8 * csitest.Mi
)

type conflictEnv struct {
	t       *testing.T
	root    string // the node's data root
	ctrl    csi.ControllerClient
	cluster bool
	r       *rand.Rand
	seq     int
	counts  map[string]int // outcome → rounds
}

func TestConflictingRequests(t *testing.T) {
	rounds := setting("LOCALDIR_CONFLICT_ROUNDS", 10, 150)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d, %d rounds per pair (LOCALDIR_CONFLICT_ROUNDS)", seed, rounds)
	for _, kind := range []string{"dir", "btrfs", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			e := &conflictEnv{t: t, r: rand.New(rand.NewPCG(seed, 7)), counts: map[string]int{}}
			switch kind {
			case "dir", "btrfs":
				e.startAllMode(kind)
			case "cluster":
				e.startCluster()
			}
			e.run(rounds)
		})
	}
}

func (e *conflictEnv) startAllMode(engine string) {
	t := e.t
	dir := tempDir(t)
	base := dir
	if engine == "btrfs" {
		base = loopFS(t, dir, testfs.Btrfs, 1<<30)
	}
	e.root = filepath.Join(base, "data")
	ep := "unix://" + filepath.Join(dir, "csi.sock")
	p := waitReady(t, launchArgs(t, []string{"--endpoint=" + ep, "--data-root=" + e.root, "--node-id=n1",
		"--capacity=2Gi", "--engine=" + engine}), ep)
	t.Cleanup(func() { p.stop(t); p.checkRaces(t) })
	e.ctrl = p.controller
}

func (e *conflictEnv) startCluster() {
	t := e.t
	env := clustertest.Start(t)
	ctrlID, nodeID := env.ControllerIdentity(t), env.NodeIdentity(t, "n1")
	dir := tempDir(t)
	e.root, e.cluster = filepath.Join(dir, "data"), true
	ctrlEP, nodeEP := "unix://"+filepath.Join(dir, "controller.sock"), "unix://"+filepath.Join(dir, "node.sock")
	node := waitReady(t, launchArgs(t, []string{"--mode=node", "--endpoint=" + nodeEP, "--kubeconfig=" + nodeID.Kubeconfig,
		"--data-root=" + e.root, "--node-id=n1", "--capacity=2Gi", "--engine=dir",
		"--kubelet-root=" + filepath.Join(dir, "co")}), nodeEP)
	env.WaitLocalNode(t, "n1")
	ctrl := waitReady(t, launchArgs(t, []string{"--mode=controller", "--endpoint=" + ctrlEP, "--kubeconfig=" + ctrlID.Kubeconfig}), ctrlEP)
	t.Cleanup(func() {
		ctrl.stop(t)
		node.stop(t)
		ctrl.checkRaces(t)
		node.checkRaces(t)
	})
	e.ctrl = ctrl.controller
}

func (e *conflictEnv) run(rounds int) {
	t := e.t
	src := e.newFilled("src", false)
	bsrc := e.newFilled("bsrc", true)
	for i := range rounds {
		e.restoreVsDeleteSnapshot(src, false)
		e.restoreVsDeleteSnapshot(bsrc, true)
		e.readerVsDeleteVolume(true)
		e.readerVsDeleteVolume(false)
		e.expandVsSnapshot(src)
		if t.Failed() {
			t.Fatalf("round %d failed", i)
		}
	}
	e.deleteVolume(src.id)
	e.deleteVolume(bsrc.id)
	e.assertEmpty()
	var list []string
	for k, n := range e.counts {
		list = append(list, fmt.Sprintf("%s=%d", k, n))
	}
	sort.Strings(list)
	t.Logf("outcomes: %s", strings.Join(list, " "))
}

// cvol is a volume of the test and the seed of its content.
type cvol struct {
	id    string
	block bool
	seed  uint64
	size  int64
}

func (e *conflictEnv) name(what string) string {
	e.seq++
	return fmt.Sprintf("%s-%d", what, e.seq)
}

// newFilled creates a volume and writes its content straight into its data
// on the node: 100 files of 24 KiB in 10 directories, or 1 MiB at the
// start of a block volume's image.
func (e *conflictEnv) newFilled(what string, block bool) *cvol {
	t := e.t
	resp, err := e.ctrl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: e.name(what), CapacityRange: csitest.Range(conflictVolSize, 0),
		VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
	})
	csitest.MustCode(t, err, codes.OK, "CreateVolume "+what)
	v := &cvol{id: resp.GetVolume().GetVolumeId(), block: block, seed: e.r.Uint64(), size: resp.GetVolume().GetCapacityBytes()}
	if block {
		f, err := os.OpenFile(filepath.Join(e.root, "block", v.id+".img"), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(csitest.RandomBytes(v.seed, 1<<20), 0); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		return v
	}
	dir := filepath.Join(e.root, "volumes", v.id)
	for i := range conflictFiles {
		p := filepath.Join(dir, fmt.Sprintf("d%d", i%10), fmt.Sprintf("f%03d", i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, csitest.RandomBytes(v.seed+uint64(i), conflictFileSize), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return v
}

// checkContent compares the data at p (a volume's or snapshot's) with the
// content of v, byte for byte: every file, nothing more.
func (e *conflictEnv) checkContent(p string, v *cvol, what string) {
	t := e.t
	t.Helper()
	if v.block {
		f, err := os.Open(p)
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		defer f.Close()
		got := make([]byte, 1<<20)
		if _, err := f.ReadAt(got, 0); err != nil {
			t.Errorf("%s: read %s: %v", what, p, err)
		} else if !bytes.Equal(got, csitest.RandomBytes(v.seed, 1<<20)) {
			t.Errorf("%s: the image %s differs from its source's content", what, p)
		}
		return
	}
	n := 0
	err := filepath.WalkDir(p, func(q string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		n++
		var i int
		if _, err := fmt.Sscanf(d.Name(), "f%03d", &i); err != nil {
			return fmt.Errorf("unexpected file %s", q)
		}
		got, err := os.ReadFile(q)
		if err != nil {
			return err
		}
		if !bytes.Equal(got, csitest.RandomBytes(v.seed+uint64(i), conflictFileSize)) {
			return fmt.Errorf("%s differs from the source's", q)
		}
		return nil
	})
	if err != nil {
		t.Errorf("%s: %v", what, err)
	}
	if n != conflictFiles {
		t.Errorf("%s: %s holds %d of the source's %d files (acknowledged with partial data)", what, p, n, conflictFiles)
	}
}

func (e *conflictEnv) volPath(v *cvol, id string) string {
	if v.block {
		return filepath.Join(e.root, "block", id+".img")
	}
	return filepath.Join(e.root, "volumes", id)
}

func (e *conflictEnv) snapPath(v *cvol, id string) string {
	if v.block {
		return filepath.Join(e.root, "snapshots", id+".img")
	}
	return filepath.Join(e.root, "snapshots", id)
}

// race runs a, then b after 0–25 ms (or b first), concurrently, and waits.
func (e *conflictEnv) race(a, b func()) {
	delay := time.Duration(e.r.IntN(25000)) * time.Microsecond
	if e.r.IntN(5) == 0 {
		a, b = b, a
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); a() }()
	time.Sleep(delay)
	go func() { defer wg.Done(); b() }()
	wg.Wait()
}

// allowed fails the test unless err's code is one of want.
func (e *conflictEnv) allowed(err error, what string, want ...codes.Code) codes.Code {
	e.t.Helper()
	c := status.Code(err)
	if !slices.Contains(want, c) {
		e.t.Errorf("%s: got %s (%v), want one of %v", what, c, err, want)
	}
	return c
}

// retried sends a call again until it is no longer ABORTED (the reader it
// conflicted with is done), as a CO does; it must then succeed.
func (e *conflictEnv) retried(what string, call func() error) {
	t := e.t
	t.Helper()
	err := call()
	for i := 0; status.Code(err) == codes.Aborted && i < 600; i++ {
		time.Sleep(50 * time.Millisecond)
		err = call()
	}
	csitest.CodeIs(t, err, codes.OK, what+" (sent again)")
}

func (e *conflictEnv) snapshot(v *cvol) string {
	t := e.t
	resp, err := e.ctrl.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: e.name("snap"), SourceVolumeId: v.id})
	csitest.MustCode(t, err, codes.OK, "CreateSnapshot")
	return resp.GetSnapshot().GetSnapshotId()
}

func (e *conflictEnv) deleteVolume(id string) {
	e.retried("DeleteVolume "+id, func() error {
		_, err := e.ctrl.DeleteVolume(csitest.Ctx(e.t), &csi.DeleteVolumeRequest{VolumeId: id})
		return err
	})
}

func (e *conflictEnv) deleteSnapshot(id string) {
	e.retried("DeleteSnapshot "+id, func() error {
		_, err := e.ctrl.DeleteSnapshot(csitest.Ctx(e.t), &csi.DeleteSnapshotRequest{SnapshotId: id})
		return err
	})
}

func (e *conflictEnv) count(pair string, a, b codes.Code) {
	e.counts[fmt.Sprintf("%s:%s/%s", pair, a, b)]++
}

// restoreVsDeleteSnapshot: CreateVolume from snapshot S against
// DeleteSnapshot S.
func (e *conflictEnv) restoreVsDeleteSnapshot(src *cvol, block bool) {
	t := e.t
	sid := e.snapshot(src)
	name := e.name("restore")
	var cerr, derr error
	var rid string
	e.race(func() {
		resp, err := e.ctrl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: csitest.Range(src.size, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
			VolumeContentSource: csitest.FromSnapshot(sid),
		})
		cerr, rid = err, resp.GetVolume().GetVolumeId()
	}, func() {
		_, derr = e.ctrl.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: sid})
	})
	c := e.allowed(cerr, "CreateVolume from a snapshot being deleted", codes.OK, codes.Aborted, codes.NotFound)
	d := e.allowed(derr, "DeleteSnapshot of a snapshot being restored", codes.OK, codes.Aborted)
	e.count("restore-vs-deletesnapshot", c, d)
	if c == codes.OK {
		e.checkContent(e.volPath(src, rid), src, "volume "+rid+" restored while its snapshot was deleted")
		e.deleteVolume(rid)
	}
	if c == codes.NotFound && d != codes.OK {
		t.Errorf("restore answered NOT_FOUND but DeleteSnapshot %s", d)
	}
	if d != codes.OK {
		e.deleteSnapshot(sid)
	}
}

// readerVsDeleteVolume: a clone of V (clone true) or CreateSnapshot of V
// against DeleteVolume V.
func (e *conflictEnv) readerVsDeleteVolume(clone bool) {
	t := e.t
	v := e.newFilled("src", false)
	pair, what := "snapshot-vs-deletevolume", "snapshot"
	if clone {
		pair, what = "clone-vs-deletevolume", "clone"
	}
	name := e.name(what)
	var rerr, derr error
	var id string
	e.race(func() {
		if clone {
			resp, err := e.ctrl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
				Name: name, CapacityRange: csitest.Range(v.size, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
				VolumeContentSource: csitest.FromVolume(v.id),
			})
			rerr, id = err, resp.GetVolume().GetVolumeId()
			return
		}
		resp, err := e.ctrl.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		rerr, id = err, resp.GetSnapshot().GetSnapshotId()
	}, func() {
		_, derr = e.ctrl.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: v.id})
	})
	r := e.allowed(rerr, what+" of a volume being deleted", codes.OK, codes.Aborted, codes.NotFound)
	d := e.allowed(derr, "DeleteVolume of a volume being read by a "+what, codes.OK, codes.Aborted)
	e.count(pair, r, d)
	switch {
	case r == codes.OK && clone:
		e.checkContent(e.volPath(v, id), v, "volume "+id+" cloned while its source was deleted")
		e.deleteVolume(id)
	case r == codes.OK:
		e.checkContent(e.snapPath(v, id), v, "snapshot "+id+" taken while its source was deleted")
		e.deleteSnapshot(id)
	}
	if d != codes.OK {
		e.deleteVolume(v.id)
	}
}

// expandVsSnapshot: ControllerExpandVolume of V against CreateSnapshot of
// V. The snapshot holds V's content and one of the two sizes.
func (e *conflictEnv) expandVsSnapshot(v *cvol) {
	t := e.t
	name := e.name("snap")
	newSize := v.size + csitest.Mi
	var serr, xerr error
	var snap *csi.Snapshot
	var got int64
	e.race(func() {
		resp, err := e.ctrl.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: v.id})
		serr, snap = err, resp.GetSnapshot()
	}, func() {
		resp, err := e.ctrl.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: v.id, CapacityRange: csitest.Range(newSize, 0)})
		xerr, got = err, resp.GetCapacityBytes()
	})
	s := e.allowed(serr, "CreateSnapshot of a volume being expanded", codes.OK, codes.Aborted)
	x := e.allowed(xerr, "expansion of a volume being snapshotted", codes.OK, codes.Aborted)
	e.count("expand-vs-snapshot", s, x)
	if x == codes.OK {
		if got != newSize {
			t.Errorf("expansion acknowledged %d bytes, want %d", got, newSize)
		}
		v.size = newSize
	}
	if s == codes.OK {
		if sz := snap.GetSizeBytes(); sz != v.size && sz != v.size-csitest.Mi {
			t.Errorf("snapshot of a volume being expanded to %d: size_bytes %d", newSize, sz)
		}
		e.checkContent(e.snapPath(v, snap.GetSnapshotId()), v, "snapshot taken while its source was expanded")
		e.deleteSnapshot(snap.GetSnapshotId())
	}
}

// assertEmpty waits (cluster mode: for the node plugin to carry out the
// deletes) until the data root holds no volume, snapshot, in-flight entry
// or orphaned data, and ListVolumes/ListSnapshots are empty.
func (e *conflictEnv) assertEmpty() {
	t := e.t
	var left []string
	for i := 0; i < 300; i++ {
		left = nil
		for _, d := range []string{"volumes", "block", "snapshots", "orphaned"} {
			for _, n := range csitest.DirNames(t, filepath.Join(e.root, d)) {
				left = append(left, d+"/"+n)
			}
		}
		if len(left) == 0 || !e.cluster {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(left) != 0 {
		t.Errorf("the data root holds %v after everything was deleted", left)
	}
	vols, err := e.ctrl.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	csitest.MustCode(t, err, codes.OK, "ListVolumes")
	snaps, err := e.ctrl.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
	csitest.MustCode(t, err, codes.OK, "ListSnapshots")
	if n, m := len(vols.GetEntries()), len(snaps.GetEntries()); n+m != 0 {
		t.Errorf("%d volumes and %d snapshots listed after everything was deleted", n, m)
	}
}
