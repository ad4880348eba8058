package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// TestConcurrentClients: 16 clients hammer an in-process driver (run the
// package with -race: CI does) with CreateVolume on 4 shared names,
// DeleteVolume, ControllerExpandVolume, CreateSnapshot on 3 shared names,
// restores, DeleteSnapshot, and stage/publish/unpublish/unstage on shared
// paths, all on the same few objects. Every call must answer OK or a code
// the spec allows for the collision (ABORTED, NOT_FOUND for an object
// deleted meanwhile, ALREADY_EXISTS for a snapshot name taken by another
// source, FAILED_PRECONDITION for a volume in use or not staged), never
// INTERNAL. The run is bounded; a call or client that does not finish in
// time is a deadlock, reported with every goroutine's stack. Afterwards: no
// two volumes for one name and no two snapshots for one name, records and
// data one-to-one, every volume exactly as large as the largest expansion
// acknowledged for it, and GetCapacity consistent with the sizes.
func TestConcurrentClients(t *testing.T) {
	const clients = 16
	opsPerClient := setting("LOCALDIR_CONCURRENCY_OPS", 500, 5000)
	const capacity = 1 << 30
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = capacity; o.Engine = "dir" })
	dir := csitest.RealPath(in.Dir)
	root := csitest.RealPath(in.Opts.DataRoot)
	t.Cleanup(func() { assertClean(t, dir) })
	names := []string{"shared-0", "shared-1", "shared-2", "shared-3"}
	snapNames := []string{"snap-0", "snap-1", "snap-2"}

	var mu sync.Mutex
	nameOf := map[string]string{}     // every volume id a CreateVolume returned → its name
	maxSize := map[string]int64{}     // id → largest capacity acknowledged
	snapOf := map[string]string{}     // snapshot id → its name
	snapSource := map[string]string{} // snapshot id → source volume
	var ids []string                  // every id seen, for the other calls to pick from
	var snapIDs []string
	codesSeen := map[string]int{}
	record := func(what string, err error) {
		mu.Lock()
		codesSeen[what+"="+status.Code(err).String()]++
		mu.Unlock()
	}
	pick := func(r *rand.Rand, from *[]string) string {
		mu.Lock()
		defer mu.Unlock()
		if len(*from) == 0 {
			return ""
		}
		// Mostly the newest (likely still alive), now and then any.
		if r.IntN(5) == 0 {
			return (*from)[r.IntN(len(*from))]
		}
		return (*from)[len(*from)-1-r.IntN(min(len(*from), 6))]
	}
	staging := func(id string) string { return filepath.Join(dir, "s", id) }
	target := func(id string, k int) string { return filepath.Join(dir, "t", id, fmt.Sprint(k)) }

	allowed := func(t *testing.T, what string, err error, ok ...codes.Code) {
		t.Helper()
		record(what, err)
		c := status.Code(err)
		if c == codes.OK || slices.Contains(ok, c) {
			return
		}
		t.Errorf("%s: %s (%v), want OK or one of %v", what, c, err, ok)
	}

	// created records an acknowledged CreateVolume of name: a volume id is
	// never returned for two names, and its largest size is kept.
	created := func(t *testing.T, name string, v *csi.Volume) {
		t.Helper()
		id := v.GetVolumeId()
		mu.Lock()
		n, seen := nameOf[id]
		if seen && n != name {
			t.Errorf("CreateVolume %s returned %s, the volume of %s", name, id, n)
		}
		if !seen {
			ids = append(ids, id)
		}
		nameOf[id] = name
		maxSize[id] = max(maxSize[id], v.GetCapacityBytes())
		mu.Unlock()
		_ = os.MkdirAll(staging(id), 0o750)
	}

	deadline := time.Now().Add(time.Duration(setting("LOCALDIR_CONCURRENCY_SECONDS", 60, 600)) * time.Second)
	runCtx, cancel := context.WithDeadline(context.Background(), deadline.Add(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(c), uint64(time.Now().UnixNano())))
			for i := 0; i < opsPerClient && time.Now().Before(deadline); i++ {
				cx, cancelCall := context.WithTimeout(runCtx, 30*time.Second)
				switch x := r.IntN(100); {
				case x < 20:
					name := names[r.IntN(len(names))]
					resp, err := in.Controller.CreateVolume(cx, &csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
					// ALREADY_EXISTS: the name holds a volume restored from a
					// snapshot, which this request does not name.
					allowed(t, "CreateVolume", err, codes.Aborted, codes.AlreadyExists)
					if err == nil {
						created(t, name, resp.GetVolume())
					}
				case x < 30:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					_, err := in.Controller.DeleteVolume(cx, &csi.DeleteVolumeRequest{VolumeId: id})
					allowed(t, "DeleteVolume", err, codes.Aborted, codes.FailedPrecondition)
				case x < 45:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					size := int64(1+r.IntN(16)) * csitest.Mi
					resp, err := in.Controller.ControllerExpandVolume(cx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(size, 0)})
					allowed(t, "ControllerExpandVolume", err, codes.Aborted, codes.NotFound)
					if err == nil {
						mu.Lock()
						if got := resp.GetCapacityBytes(); got < size {
							t.Errorf("ControllerExpandVolume %s to %d: capacity %d", id, size, got)
						}
						maxSize[id] = max(maxSize[id], resp.GetCapacityBytes())
						mu.Unlock()
					}
				case x < 55:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					name := snapNames[r.IntN(len(snapNames))]
					resp, err := in.Controller.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
					allowed(t, "CreateSnapshot", err, codes.Aborted, codes.NotFound, codes.AlreadyExists)
					if err == nil {
						sid := resp.GetSnapshot().GetSnapshotId()
						mu.Lock()
						if n, seen := snapOf[sid]; seen && n != name {
							t.Errorf("CreateSnapshot %s returned %s, the snapshot of %s", name, sid, n)
						}
						if src, seen := snapSource[sid]; seen && src != id {
							t.Errorf("CreateSnapshot %s of %s returned %s, a snapshot of %s", name, id, sid, src)
						}
						if _, seen := snapOf[sid]; !seen {
							snapIDs = append(snapIDs, sid)
						}
						snapOf[sid], snapSource[sid] = name, id
						mu.Unlock()
					}
				case x < 60:
					sid := pick(r, &snapIDs)
					if sid == "" {
						break
					}
					_, err := in.Controller.DeleteSnapshot(cx, &csi.DeleteSnapshotRequest{SnapshotId: sid})
					allowed(t, "DeleteSnapshot", err, codes.Aborted)
				case x < 63:
					sid := pick(r, &snapIDs)
					if sid == "" {
						break
					}
					name := names[r.IntN(len(names))]
					resp, err := in.Controller.CreateVolume(cx, &csi.CreateVolumeRequest{Name: name, VolumeContentSource: csitest.FromSnapshot(sid), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
					// The name may hold a volume made without this source
					// (ALREADY_EXISTS); the snapshot may be gone (NOT_FOUND).
					allowed(t, "CreateVolume(restore)", err, codes.Aborted, codes.AlreadyExists, codes.NotFound, codes.OutOfRange)
					if err == nil {
						created(t, name, resp.GetVolume())
					}
				case x < 73:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					_, err := in.Node.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging(id), VolumeCapability: csitest.MntCap()})
					allowed(t, "NodeStageVolume", err, codes.Aborted, codes.NotFound)
				case x < 85:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					tg := target(id, r.IntN(2))
					_ = os.MkdirAll(filepath.Dir(tg), 0o750)
					_, err := in.Node.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging(id), TargetPath: tg, VolumeCapability: csitest.MntCap()})
					allowed(t, "NodePublishVolume", err, codes.Aborted, codes.NotFound, codes.FailedPrecondition)
				case x < 95:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					_, err := in.Node.NodeUnpublishVolume(cx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target(id, r.IntN(2))})
					allowed(t, "NodeUnpublishVolume", err)
				default:
					id := pick(r, &ids)
					if id == "" {
						break
					}
					_, err := in.Node.NodeUnstageVolume(cx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging(id)})
					allowed(t, "NodeUnstageVolume", err, codes.Aborted)
				}
				cancelCall()
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Until(deadline) + 60*time.Second):
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 2)
		t.Fatalf("the clients did not finish 60s after the deadline: deadlock? goroutines:\n%s", b.String())
	}
	if t.Failed() {
		t.FailNow()
	}

	// Quiet now. Records, data and the model.
	resp, err := in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	csitest.MustCode(t, err, codes.OK, "ListVolumes")
	perName := map[string][]string{}
	var listed []string
	var sum int64
	for _, e := range resp.GetEntries() {
		v := e.GetVolume()
		listed = append(listed, v.GetVolumeId())
		sum += v.GetCapacityBytes()
		name, ok := nameOf[v.GetVolumeId()]
		if !ok {
			t.Errorf("volume %s is listed but no CreateVolume returned it", v.GetVolumeId())
		}
		perName[name] = append(perName[name], v.GetVolumeId())
		if v.GetCapacityBytes() != maxSize[v.GetVolumeId()] {
			t.Errorf("volume %s: capacity %d, the largest acknowledged is %d (a lost update)", v.GetVolumeId(), v.GetCapacityBytes(), maxSize[v.GetVolumeId()])
		}
	}
	for name, vs := range perName {
		if len(vs) > 1 {
			t.Errorf("name %s has %d volumes: %v", name, len(vs), vs)
		}
	}
	slices.Sort(listed)
	if got := csitest.DirNames(t, filepath.Join(root, "volumes")); !slices.Equal(got, listed) {
		t.Errorf("volumes/ holds %v, ListVolumes %v", got, listed)
	}
	sresp, err := in.Controller.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
	csitest.MustCode(t, err, codes.OK, "ListSnapshots")
	perSnapName := map[string]int{}
	var snapListed []string
	for _, e := range sresp.GetEntries() {
		sid := e.GetSnapshot().GetSnapshotId()
		snapListed = append(snapListed, sid)
		perSnapName[snapOf[sid]]++
	}
	for name, n := range perSnapName {
		if n > 1 {
			t.Errorf("snapshot name %s has %d snapshots", name, n)
		}
	}
	slices.Sort(snapListed)
	if got := csitest.DirNames(t, filepath.Join(root, "snapshots")); !slices.Equal(got, snapListed) {
		t.Errorf("snapshots/ holds %v, ListSnapshots %v", got, snapListed)
	}
	c, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
	csitest.MustCode(t, err, codes.OK, "GetCapacity")
	assertAvailable(t, c.GetAvailableCapacity(), capacity, sum, root, "after the run")

	// Clean up through the driver: nothing may be left.
	for _, id := range ids {
		for k := range 2 {
			_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target(id, k)})
			csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume "+id)
		}
		_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging(id)})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume "+id)
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
	for _, sid := range snapIDs {
		_, err := in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: sid})
		csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot "+sid)
	}
	for _, d := range []string{"volumes", "block", "snapshots"} {
		if n := csitest.DirNames(t, filepath.Join(root, d)); len(n) != 0 {
			t.Errorf("%s holds %v after everything was deleted", d, n)
		}
	}
	c, err = in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
	csitest.MustCode(t, err, codes.OK, "GetCapacity")
	assertAvailable(t, c.GetAvailableCapacity(), capacity, 0, root, "after everything was deleted")
	var hist []string
	total := 0
	for k, n := range codesSeen {
		hist = append(hist, fmt.Sprintf("%s:%d", k, n))
		total += n
	}
	slices.Sort(hist)
	t.Logf("%d calls from %d clients; %d volumes and %d snapshots made; %s", total, clients, len(ids), len(snapIDs), strings.Join(hist, " "))
}
