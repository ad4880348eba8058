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
	run := &ccRun{
		in:        in,
		dir:       csitest.RealPath(in.Dir),
		root:      csitest.RealPath(in.Opts.DataRoot),
		names:     []string{"shared-0", "shared-1", "shared-2", "shared-3"},
		snapNames: []string{"snap-0", "snap-1", "snap-2"},
		m:         newCCModel(),
	}
	t.Cleanup(func() { assertClean(t, run.dir) })

	deadline := time.Now().Add(time.Duration(setting("LOCALDIR_CONCURRENCY_SECONDS", 60, 600)) * time.Second)
	run.clients(t, clients, opsPerClient, deadline)
	if t.Failed() {
		t.FailNow()
	}

	// Quiet now. Records, data and the model.
	var sum int64
	t.Run("volumes", func(t *testing.T) { sum = run.checkVolumes(t) })
	t.Run("snapshots", run.checkSnapshots)
	t.Run("capacity", func(t *testing.T) {
		c, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
		csitest.MustCode(t, err, codes.OK, "GetCapacity")
		assertAvailable(t, c.GetAvailableCapacity(), capacity, sum, run.root, "after the run")
	})
	// Clean up through the driver: nothing may be left.
	t.Run("cleanup", func(t *testing.T) { run.cleanup(t, capacity) })
	total, hist := run.m.histogram()
	t.Logf("%d calls from %d clients; %d volumes and %d snapshots made; %s", total, clients, len(run.m.ids), len(run.m.snapIDs), strings.Join(hist, " "))
}

// ccModel is what TestConcurrentClients' clients were told, to check the
// driver's records against once they are done.
type ccModel struct {
	mu         sync.Mutex
	nameOf     map[string]string // every volume id a CreateVolume returned → its name
	maxSize    map[string]int64  // id → largest capacity acknowledged
	snapOf     map[string]string // snapshot id → its name
	snapSource map[string]string // snapshot id → source volume
	ids        []string          // every id seen, for the other calls to pick from
	snapIDs    []string
	codesSeen  map[string]int
}

func newCCModel() *ccModel {
	return &ccModel{nameOf: map[string]string{}, maxSize: map[string]int64{}, snapOf: map[string]string{},
		snapSource: map[string]string{}, codesSeen: map[string]int{}}
}

func (m *ccModel) record(what string, err error) {
	m.mu.Lock()
	m.codesSeen[what+"="+status.Code(err).String()]++
	m.mu.Unlock()
}

// pick returns an id of from: mostly the newest (likely still alive), now
// and then any; "" when there is none yet.
func (m *ccModel) pick(r *rand.Rand, from *[]string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(*from) == 0 {
		return ""
	}
	if r.IntN(5) == 0 {
		return (*from)[r.IntN(len(*from))]
	}
	return (*from)[len(*from)-1-r.IntN(min(len(*from), 6))]
}

// allowed records the call's code and fails unless it is OK or one of ok.
func (m *ccModel) allowed(t *testing.T, what string, err error, ok ...codes.Code) {
	t.Helper()
	m.record(what, err)
	c := status.Code(err)
	if c == codes.OK || slices.Contains(ok, c) {
		return
	}
	t.Errorf("%s: %s (%v), want OK or one of %v", what, c, err, ok)
}

// created records an acknowledged CreateVolume of name: a volume id is
// never returned for two names, and its largest size is kept.
func (m *ccModel) created(t *testing.T, name string, v *csi.Volume) {
	t.Helper()
	id := v.GetVolumeId()
	m.mu.Lock()
	defer m.mu.Unlock()
	n, seen := m.nameOf[id]
	if seen && n != name {
		t.Errorf("CreateVolume %s returned %s, the volume of %s", name, id, n)
	}
	if !seen {
		m.ids = append(m.ids, id)
	}
	m.nameOf[id] = name
	m.maxSize[id] = max(m.maxSize[id], v.GetCapacityBytes())
}

// expanded records an acknowledged expansion of id to at least size.
func (m *ccModel) expanded(t *testing.T, id string, size, got int64) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if got < size {
		t.Errorf("ControllerExpandVolume %s to %d: capacity %d", id, size, got)
	}
	m.maxSize[id] = max(m.maxSize[id], got)
}

// snapshotted records an acknowledged CreateSnapshot name of id: a
// snapshot id is never returned for two names or two sources.
func (m *ccModel) snapshotted(t *testing.T, name, id, sid string) {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	if n, seen := m.snapOf[sid]; seen && n != name {
		t.Errorf("CreateSnapshot %s returned %s, the snapshot of %s", name, sid, n)
	}
	if src, seen := m.snapSource[sid]; seen && src != id {
		t.Errorf("CreateSnapshot %s of %s returned %s, a snapshot of %s", name, id, sid, src)
	}
	if _, seen := m.snapOf[sid]; !seen {
		m.snapIDs = append(m.snapIDs, sid)
	}
	m.snapOf[sid], m.snapSource[sid] = name, id
}

// histogram returns the number of calls and "call=code:count" entries.
func (m *ccModel) histogram() (int, []string) {
	var hist []string
	total := 0
	for k, n := range m.codesSeen {
		hist = append(hist, fmt.Sprintf("%s:%d", k, n))
		total += n
	}
	slices.Sort(hist)
	return total, hist
}

// ccRun is one TestConcurrentClients run: the driver, its paths, the
// shared names and the model.
type ccRun struct {
	in               *testdriver.Instance
	dir, root        string
	names, snapNames []string
	m                *ccModel
}

func (c *ccRun) staging(id string) string { return filepath.Join(c.dir, "s", id) }
func (c *ccRun) target(id string, k int) string {
	return filepath.Join(c.dir, "t", id, fmt.Sprint(k))
}

// clients runs n clients of ops calls each until deadline. A call or
// client that does not finish in time is a deadlock, reported with every
// goroutine's stack.
func (c *ccRun) clients(t *testing.T, n, ops int, deadline time.Time) {
	runCtx, cancel := context.WithDeadline(context.Background(), deadline.Add(30*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for k := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(k), uint64(time.Now().UnixNano())))
			for i := 0; i < ops && time.Now().Before(deadline); i++ {
				cx, cancelCall := context.WithTimeout(runCtx, 30*time.Second)
				c.call(t, r, cx)
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
}

// call makes one random call: CreateVolume 20%, DeleteVolume 10%,
// ControllerExpandVolume 15%, CreateSnapshot 10%, DeleteSnapshot 5%,
// restore 3%, NodeStageVolume 10%, NodePublishVolume 12%,
// NodeUnpublishVolume 10%, NodeUnstageVolume 5%.
func (c *ccRun) call(t *testing.T, r *rand.Rand, cx context.Context) {
	switch x := r.IntN(100); {
	case x < 20:
		c.createVolume(t, r, cx)
	case x < 30:
		c.withVolume(r, func(id string) {
			_, err := c.in.Controller.DeleteVolume(cx, &csi.DeleteVolumeRequest{VolumeId: id})
			c.m.allowed(t, "DeleteVolume", err, codes.Aborted, codes.FailedPrecondition)
		})
	case x < 45:
		c.withVolume(r, func(id string) { c.expand(t, r, cx, id) })
	case x < 55:
		c.withVolume(r, func(id string) { c.snapshot(t, r, cx, id) })
	case x < 60:
		c.withSnapshot(r, func(sid string) {
			_, err := c.in.Controller.DeleteSnapshot(cx, &csi.DeleteSnapshotRequest{SnapshotId: sid})
			c.m.allowed(t, "DeleteSnapshot", err, codes.Aborted)
		})
	case x < 63:
		c.withSnapshot(r, func(sid string) { c.restore(t, r, cx, sid) })
	default:
		c.nodeCall(t, r, cx, x)
	}
}

// nodeCall makes the node call x (63 ≤ x < 100) picks.
func (c *ccRun) nodeCall(t *testing.T, r *rand.Rand, cx context.Context, x int) {
	switch {
	case x < 73:
		c.withVolume(r, func(id string) {
			_, err := c.in.Node.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: c.staging(id), VolumeCapability: csitest.MntCap()})
			c.m.allowed(t, "NodeStageVolume", err, codes.Aborted, codes.NotFound)
		})
	case x < 85:
		c.withVolume(r, func(id string) {
			tg := c.target(id, r.IntN(2))
			_ = os.MkdirAll(filepath.Dir(tg), 0o750)
			_, err := c.in.Node.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: c.staging(id), TargetPath: tg, VolumeCapability: csitest.MntCap()})
			c.m.allowed(t, "NodePublishVolume", err, codes.Aborted, codes.NotFound, codes.FailedPrecondition)
		})
	case x < 95:
		c.withVolume(r, func(id string) {
			_, err := c.in.Node.NodeUnpublishVolume(cx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: c.target(id, r.IntN(2))})
			c.m.allowed(t, "NodeUnpublishVolume", err)
		})
	default:
		c.withVolume(r, func(id string) {
			_, err := c.in.Node.NodeUnstageVolume(cx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: c.staging(id)})
			c.m.allowed(t, "NodeUnstageVolume", err, codes.Aborted)
		})
	}
}

// withVolume calls f with a picked volume id, if there is one yet.
func (c *ccRun) withVolume(r *rand.Rand, f func(id string)) {
	if id := c.m.pick(r, &c.m.ids); id != "" {
		f(id)
	}
}

// withSnapshot calls f with a picked snapshot id, if there is one yet.
func (c *ccRun) withSnapshot(r *rand.Rand, f func(sid string)) {
	if sid := c.m.pick(r, &c.m.snapIDs); sid != "" {
		f(sid)
	}
}

func (c *ccRun) createVolume(t *testing.T, r *rand.Rand, cx context.Context) {
	name := c.names[r.IntN(len(c.names))]
	resp, err := c.in.Controller.CreateVolume(cx, &csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	// ALREADY_EXISTS: the name holds a volume restored from a
	// snapshot, which this request does not name.
	c.m.allowed(t, "CreateVolume", err, codes.Aborted, codes.AlreadyExists)
	if err == nil {
		c.created(t, name, resp.GetVolume())
	}
}

// created records the volume and makes its staging directory.
func (c *ccRun) created(t *testing.T, name string, v *csi.Volume) {
	c.m.created(t, name, v)
	_ = os.MkdirAll(c.staging(v.GetVolumeId()), 0o750)
}

func (c *ccRun) expand(t *testing.T, r *rand.Rand, cx context.Context, id string) {
	size := int64(1+r.IntN(16)) * csitest.Mi
	resp, err := c.in.Controller.ControllerExpandVolume(cx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(size, 0)})
	c.m.allowed(t, "ControllerExpandVolume", err, codes.Aborted, codes.NotFound)
	if err == nil {
		c.m.expanded(t, id, size, resp.GetCapacityBytes())
	}
}

func (c *ccRun) snapshot(t *testing.T, r *rand.Rand, cx context.Context, id string) {
	name := c.snapNames[r.IntN(len(c.snapNames))]
	resp, err := c.in.Controller.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: id})
	c.m.allowed(t, "CreateSnapshot", err, codes.Aborted, codes.NotFound, codes.AlreadyExists)
	if err == nil {
		c.m.snapshotted(t, name, id, resp.GetSnapshot().GetSnapshotId())
	}
}

func (c *ccRun) restore(t *testing.T, r *rand.Rand, cx context.Context, sid string) {
	name := c.names[r.IntN(len(c.names))]
	resp, err := c.in.Controller.CreateVolume(cx, &csi.CreateVolumeRequest{Name: name, VolumeContentSource: csitest.FromSnapshot(sid), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	// The name may hold a volume made without this source
	// (ALREADY_EXISTS); the snapshot may be gone (NOT_FOUND).
	c.m.allowed(t, "CreateVolume(restore)", err, codes.Aborted, codes.AlreadyExists, codes.NotFound, codes.OutOfRange)
	if err == nil {
		c.created(t, name, resp.GetVolume())
	}
}

// checkVolumes: no two volumes for one name, every listed volume made by
// an acknowledged CreateVolume and exactly as large as the largest
// expansion acknowledged for it, and volumes/ one-to-one with the list.
// It returns the listed capacities' sum.
func (c *ccRun) checkVolumes(t *testing.T) int64 {
	resp, err := c.in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	csitest.MustCode(t, err, codes.OK, "ListVolumes")
	perName := map[string][]string{}
	var listed []string
	var sum int64
	for _, e := range resp.GetEntries() {
		v := e.GetVolume()
		listed = append(listed, v.GetVolumeId())
		sum += v.GetCapacityBytes()
		name, ok := c.m.nameOf[v.GetVolumeId()]
		if !ok {
			t.Errorf("volume %s is listed but no CreateVolume returned it", v.GetVolumeId())
		}
		perName[name] = append(perName[name], v.GetVolumeId())
		if v.GetCapacityBytes() != c.m.maxSize[v.GetVolumeId()] {
			t.Errorf("volume %s: capacity %d, the largest acknowledged is %d (a lost update)", v.GetVolumeId(), v.GetCapacityBytes(), c.m.maxSize[v.GetVolumeId()])
		}
	}
	for name, vs := range perName {
		if len(vs) > 1 {
			t.Errorf("name %s has %d volumes: %v", name, len(vs), vs)
		}
	}
	slices.Sort(listed)
	if got := csitest.DirNames(t, filepath.Join(c.root, "volumes")); !slices.Equal(got, listed) {
		t.Errorf("volumes/ holds %v, ListVolumes %v", got, listed)
	}
	return sum
}

// checkSnapshots: no two snapshots for one name, snapshots/ one-to-one
// with ListSnapshots.
func (c *ccRun) checkSnapshots(t *testing.T) {
	sresp, err := c.in.Controller.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
	csitest.MustCode(t, err, codes.OK, "ListSnapshots")
	perSnapName := map[string]int{}
	var snapListed []string
	for _, e := range sresp.GetEntries() {
		sid := e.GetSnapshot().GetSnapshotId()
		snapListed = append(snapListed, sid)
		perSnapName[c.m.snapOf[sid]]++
	}
	for name, n := range perSnapName {
		if n > 1 {
			t.Errorf("snapshot name %s has %d snapshots", name, n)
		}
	}
	slices.Sort(snapListed)
	if got := csitest.DirNames(t, filepath.Join(c.root, "snapshots")); !slices.Equal(got, snapListed) {
		t.Errorf("snapshots/ holds %v, ListSnapshots %v", got, snapListed)
	}
}

// cleanup unpublishes, unstages and deletes every volume and deletes every
// snapshot through the driver, all answering OK; then nothing may be left
// in the data root and the whole capacity is available.
func (c *ccRun) cleanup(t *testing.T, capacity int64) {
	for _, id := range c.m.ids {
		for k := range 2 {
			_, err := c.in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: c.target(id, k)})
			csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume "+id)
		}
		_, err := c.in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: c.staging(id)})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume "+id)
		_, err = c.in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
	for _, sid := range c.m.snapIDs {
		_, err := c.in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: sid})
		csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot "+sid)
	}
	for _, d := range []string{"volumes", "block", "snapshots"} {
		if n := csitest.DirNames(t, filepath.Join(c.root, d)); len(n) != 0 {
			t.Errorf("%s holds %v after everything was deleted", d, n)
		}
	}
	resp, err := c.in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{})
	csitest.MustCode(t, err, codes.OK, "GetCapacity")
	assertAvailable(t, resp.GetAvailableCapacity(), capacity, 0, c.root, "after everything was deleted")
}
