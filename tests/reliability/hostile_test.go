package reliability

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// hostileEnv is an in-process all-mode driver with real volumes staged and
// published, a stand-in /etc and /srv/keep, and a watcher over the whole
// temp dir (data root included, its state files compared by inode only).
type hostileEnv struct {
	t    *testing.T
	in   *testdriver.Instance
	dir  string // the temp dir: socket, data root, CO paths, stand-ins
	root string // data root

	etc, keep string // stand-ins for /etc and /srv/keep

	x, y, z, b         string // mount volumes X (published), Y (published), Z (not staged); block B (published)
	sX, tX, sY, tY     string
	sB, tB             string
	pods               string // where fresh target paths go
	seq                int
	w                  *watcher
	cases              int
	byRPC              map[string]int
	volsBefore, before []string
}

func newHostileEnv(t *testing.T) *hostileEnv {
	in := testdriver.Start(t, func(o *driver.Options) { o.Engine = "dir" })
	e := &hostileEnv{t: t, in: in, dir: csitest.RealPath(in.Dir), byRPC: map[string]int{}}
	e.root = csitest.RealPath(in.Opts.DataRoot)
	e.etc = csitest.Mkdir(t, filepath.Join(e.dir, "etc"))
	writeSyncedWithDir(t, filepath.Join(e.etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"))
	csitest.Mkdir(t, filepath.Join(e.etc, "ssl"))
	writeSyncedWithDir(t, filepath.Join(e.etc, "ssl", "key.pem"), []byte("secret"))
	e.keep = csitest.Mkdir(t, filepath.Join(e.dir, "srv", "keep"))
	writeSyncedWithDir(t, filepath.Join(e.keep, "file"), []byte("keep me"))
	e.pods = csitest.Mkdir(t, filepath.Join(e.dir, "pods"))

	e.x = e.create("hostile-x", false)
	e.y = e.create("hostile-y", false)
	e.z = e.create("hostile-z", false)
	e.b = e.create("hostile-b", true)
	e.sX, e.tX = e.attach(e.x, false)
	e.sY, e.tY = e.attach(e.y, false)
	e.sB, e.tB = e.attach(e.b, true)
	writeSyncedWithDir(t, filepath.Join(e.tX, "x-data"), []byte("x"))
	writeSyncedWithDir(t, filepath.Join(e.tY, "y-data"), []byte("y"))
	if err := writeDevAtZero(e.tB, []byte("block data")); err != nil {
		t.Fatal(err)
	}

	e.w = &watcher{t: t,
		roots: []string{e.dir},
		skip:  []string{filepath.Join(e.dir, "csi.sock")},
	}
	return e
}

func (e *hostileEnv) create(name string, block bool) string {
	resp, err := e.in.Controller.CreateVolume(csitest.Ctx(e.t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: csitest.Range(4*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
	})
	csitest.MustCode(e.t, err, codes.OK, "CreateVolume "+name)
	return resp.GetVolume().GetVolumeId()
}

// attach stages and publishes a volume at fresh paths.
func (e *hostileEnv) attach(id string, block bool) (staging, target string) {
	e.seq++
	staging = csitest.Mkdir(e.t, filepath.Join(e.dir, "staging", fmt.Sprint(e.seq)))
	target = filepath.Join(e.pods, fmt.Sprintf("t%d", e.seq))
	_, err := e.in.Node.NodeStageVolume(csitest.Ctx(e.t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.CapOf(block)})
	csitest.MustCode(e.t, err, codes.OK, "NodeStageVolume "+id)
	_, err = e.in.Node.NodePublishVolume(csitest.Ctx(e.t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.CapOf(block)})
	csitest.MustCode(e.t, err, codes.OK, "NodePublishVolume "+id)
	return staging, target
}

// fresh returns a path under pods/ that does not exist.
func (e *hostileEnv) fresh() string {
	e.seq++
	return filepath.Join(e.pods, fmt.Sprintf("new%d", e.seq))
}

// hcase is one hostile call: the code it must answer, and what it may
// change besides nothing.
type hcase struct {
	rpc, input string
	want       codes.Code
	call       func(context.Context) error
	// dataRoot: the call may change the data root (a create that is
	// allowed); after must then undo it and check the result.
	dataRoot bool
	may      []string // paths (and everything below) the call may change
	after    func(t *testing.T)
}

// run runs one case under the watcher: exact code, then nothing outside
// the data root and c.may (and, unless c.dataRoot, inside it) changed. The
// state files are compared by inode only (their content changes with every
// committed call, but they must never be removed or replaced).
func (e *hostileEnv) run(c hcase) {
	t := e.t
	t.Helper()
	e.cases++
	e.byRPC[c.rpc]++
	w := *e.w
	w.skip = append(slices.Clone(w.skip), c.may...)
	for _, m := range c.may {
		w.loose = append(w.loose, filepath.Dir(m))
	}
	// The state file and whatever the store keeps beside it (a log).
	stateFiles, _ := filepath.Glob(filepath.Join(e.root, state.FileName+"*"))
	if c.dataRoot {
		w.skip = append(w.skip, filepath.Join(e.root, "volumes"), filepath.Join(e.root, "block"), filepath.Join(e.root, "snapshots"))
	}
	w.skip = append(w.skip, stateFiles...)
	inodes := func() []uint64 {
		var out []uint64
		for _, p := range stateFiles {
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				out = append(out, 0)
				continue
			}
			out = append(out, st.Ino)
		}
		return out
	}
	ino := inodes()
	before := w.snap()
	c2, cancel := context.WithTimeout(context.Background(), csitest.RPCTimeout)
	err := c.call(c2)
	cancel()
	what := c.rpc + " " + c.input
	if got := status.Code(err); got != c.want {
		t.Errorf("%s: got %s (%v), want %s", what, got, err, c.want)
	}
	if got := inodes(); !slices.Equal(got, ino) {
		t.Errorf("%s: the state files were removed or replaced (inodes %v, were %v)", what, got, ino)
	}
	if c.after != nil {
		c.after(t)
	}
	for _, d := range before.diff(w.snap()) {
		t.Errorf("%s changed what it must not touch: %s", what, d)
	}
}

// hostileIDs are ids and names no CO should send: path-like, absolute,
// NUL and control characters, over-long, 4-byte UTF-8 at the 128-byte
// limit, and ids of the driver's own shape that were never issued.
func hostileIDs(e *hostileEnv) []string {
	emoji := "\U0001F600" // 4 bytes in UTF-8
	ids := []string{
		"..", ".", "../..", "../../..", "../../etc", "../../../../../../../etc/passwd", "./vol",
		"/", "/etc", "/etc/passwd", e.etc, e.keep, e.root, filepath.Join(e.root, "volumes", e.x),
		filepath.Join(e.root, state.FileName),
		"volumes/" + e.x, e.x + "/..", e.x + "/../" + e.y, "vol-../../x", "snap-../../x",
		"a\x00b", "\x00", e.x + "\x00", "\x00" + e.x, "a\nb", "a\rb", "a\tb", "\x1b[31m", "\x7f", "\u0085", "\u2028",
		" " + e.x, e.x + " ", e.x + "\n", strings.ToUpper(e.x), e.x + "0", e.x[:len(e.x)-1],
		strings.Repeat("a", 128), strings.Repeat("a", 129), strings.Repeat("a", 4096), strings.Repeat("/..", 2000),
		strings.Repeat("a", 124) + emoji, strings.Repeat("a", 125) + emoji, strings.Repeat(emoji, 32), strings.Repeat(emoji, 33),
		"vol-0123456789abcdef0123456789abcdef", "vol-ffffffffffffffffffffffffffffffff",
		"snap-0123456789abcdef0123456789abcdef", contract.NewVolumeID(), contract.NewSnapshotID(),
		"csi-0123456789abcdef", "pvc-0a1b2c3d", "*", "vol-*", "%2e%2e%2f", "..%2f..%2f", "\\..\\..",
	}
	return ids
}

// validName mirrors the CSI name rules the driver enforces: 1-128 bytes of
// UTF-8 without control characters.
func validName(s string) bool {
	// The spec bans U+0000–0008, U+000B, U+000C, U+000E–001F and
	// U+007F–009F: tab, LF and CR are allowed (case C49).
	return s != "" && len(s) <= 128 && utf8.ValidString(s) &&
		strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' }) < 0
}

// validEphemeralID: what kubelet-style inline volume ids the driver takes.
func validEphemeralID(s string) bool {
	if len(s) == 0 || len(s) > 128 || strings.Contains(s, "..") || contract.ValidVolumeID(s) {
		return false
	}
	for i, r := range s {
		ok := r < 128 && (unicode.IsLetter(r) || unicode.IsDigit(r) || (i > 0 && strings.ContainsRune("._-", r)))
		if !ok {
			return false
		}
	}
	return true
}

// TestHostileInputCorpus sends every RPC hostile ids, names, node paths,
// parameters and contexts, asserts the exact gRPC code of each call, and
// proves with the watcher that nothing outside the data root and the paths
// a call was given was created, changed or removed (and, for calls that
// must fail, nothing inside the data root either). It ends with snapshot
// contents holding symlinks out of the volume and device nodes.
func TestHostileInputCorpus(t *testing.T) {
	e := newHostileEnv(t)
	ids := hostileIDs(e)
	e.volsBefore = csitest.DirNames(t, filepath.Join(e.root, "volumes"))

	t.Run("ids", func(t *testing.T) { e.t = t; e.idCases(ids) })
	t.Run("node paths", func(t *testing.T) { e.t = t; e.pathCases() })
	t.Run("parameters and contexts", func(t *testing.T) { e.t = t; e.contextCases() })
	t.Run("snapshot contents", func(t *testing.T) { e.t = t; e.snapshotContents() })
	e.t = t

	var rpcs []string
	for r, n := range e.byRPC {
		rpcs = append(rpcs, fmt.Sprintf("%s=%d", r, n))
	}
	slices.Sort(rpcs)
	t.Logf("hostile corpus: %d calls over %d RPCs (%d hostile ids): %s", e.cases, len(e.byRPC), len(ids), strings.Join(rpcs, " "))

	// Everything the corpus created is gone again; X, Y and B are intact.
	if got := csitest.DirNames(t, filepath.Join(e.root, "volumes")); !slices.Equal(got, e.volsBefore) {
		t.Errorf("volumes after the corpus: %v, want %v", got, e.volsBefore)
	}
	csitest.AssertFileBytes(t, filepath.Join(e.tX, "x-data"), []byte("x"))
	csitest.AssertFileBytes(t, filepath.Join(e.tY, "y-data"), []byte("y"))
	e.teardown()
}

func (e *hostileEnv) teardown() {
	t, in := e.t, e.in
	for _, v := range []struct {
		id, s, tg string
	}{{e.x, e.sX, e.tX}, {e.y, e.sY, e.tY}, {e.b, e.sB, e.tB}} {
		_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: v.id, TargetPath: v.tg})
		csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume "+v.id)
		_, err = in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: v.id, StagingTargetPath: v.s})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume "+v.id)
	}
	for _, id := range []string{e.x, e.y, e.z, e.b} {
		_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
	for _, d := range []string{"volumes", "block", "snapshots"} {
		if n := csitest.DirNames(t, filepath.Join(e.root, d)); len(n) != 0 {
			t.Errorf("%s holds %v after every volume was deleted", d, n)
		}
	}
}

// idCases: every RPC that takes an id or a name, with each hostile one.
func (e *hostileEnv) idCases(ids []string) {
	in := e.in
	c, n := in.Controller, in.Node
	sm := csi.NewSnapshotMetadataClient(in.Conn)
	for _, id := range ids {
		q := quote(id)
		// Names: a valid one makes a volume (whose id is the driver's own,
		// never the name) that is deleted again.
		wantName := codes.InvalidArgument
		if validName(id) {
			wantName = codes.OK
		}
		var made string
		e.run(hcase{rpc: "CreateVolume", input: "name=" + q, want: wantName, dataRoot: true,
			call: func(cx context.Context) error {
				r, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: id, CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				made = r.GetVolume().GetVolumeId()
				return err
			},
			after: func(t *testing.T) {
				if made == "" {
					return
				}
				if !contract.ValidVolumeID(made) {
					t.Errorf("CreateVolume name=%s returned id %q, not of the driver's shape", q, made)
					return
				}
				if !mayExist(filepath.Join(e.root, "volumes", made)) {
					t.Errorf("CreateVolume name=%s: no data for %s", q, made)
				}
				_, err := c.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: made})
				csitest.CodeIs(t, err, codes.OK, "DeleteVolume of the volume named "+q)
				e.assertVolumes(t)
			}})
		var snapMade string
		e.run(hcase{rpc: "CreateSnapshot", input: "name=" + q, want: wantName, dataRoot: true,
			call: func(cx context.Context) error {
				r, err := c.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: id, SourceVolumeId: e.z})
				snapMade = r.GetSnapshot().GetSnapshotId()
				return err
			},
			after: func(t *testing.T) {
				if snapMade == "" {
					return
				}
				if !contract.ValidSnapshotID(snapMade) {
					t.Errorf("CreateSnapshot name=%s returned id %q", q, snapMade)
				}
				_, err := c.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snapMade})
				csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot of the snapshot named "+q)
				if s := csitest.DirNames(t, filepath.Join(e.root, "snapshots")); len(s) != 0 {
					t.Errorf("snapshots left: %v", s)
				}
			}})

		// Ids: never issued, so unknown: deletes OK, lookups NOT_FOUND.
		for _, k := range []struct {
			rpc  string
			want codes.Code
			call func(cx context.Context) error
		}{
			{"DeleteVolume", codes.OK, func(cx context.Context) error {
				_, err := c.DeleteVolume(cx, &csi.DeleteVolumeRequest{VolumeId: id})
				return err
			}},
			{"ControllerGetVolume", codes.NotFound, func(cx context.Context) error {
				_, err := c.ControllerGetVolume(cx, &csi.ControllerGetVolumeRequest{VolumeId: id})
				return err
			}},
			{"ValidateVolumeCapabilities", codes.NotFound, func(cx context.Context) error {
				_, err := c.ValidateVolumeCapabilities(cx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				return err
			}},
			{"ControllerExpandVolume", codes.NotFound, func(cx context.Context) error {
				_, err := c.ControllerExpandVolume(cx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(8*csitest.Mi, 0)})
				return err
			}},
			{"ControllerGetVolumeHealth", codes.NotFound, func(cx context.Context) error {
				_, err := c.ControllerGetVolumeHealth(cx, &csi.ControllerGetVolumeHealthRequest{VolumeId: id})
				return err
			}},
			{"ControllerPublishVolume", codes.Unimplemented, func(cx context.Context) error {
				_, err := c.ControllerPublishVolume(cx, &csi.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "n1", VolumeCapability: csitest.MntCap()})
				return err
			}},
			{"CreateVolume from volume", codes.NotFound, func(cx context.Context) error {
				_, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: "hostile-clone", VolumeContentSource: csitest.FromVolume(id), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				return err
			}},
			{"CreateVolume from snapshot", codes.NotFound, func(cx context.Context) error {
				_, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: "hostile-restore", VolumeContentSource: csitest.FromSnapshot(id), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				return err
			}},
			{"CreateSnapshot source", codes.NotFound, func(cx context.Context) error {
				_, err := c.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: "hostile-snap", SourceVolumeId: id})
				return err
			}},
			{"DeleteSnapshot", codes.OK, func(cx context.Context) error {
				_, err := c.DeleteSnapshot(cx, &csi.DeleteSnapshotRequest{SnapshotId: id})
				return err
			}},
			{"GetSnapshot", codes.NotFound, func(cx context.Context) error {
				_, err := c.GetSnapshot(cx, &csi.GetSnapshotRequest{SnapshotId: id})
				return err
			}},
			{"ListSnapshots snapshot_id", codes.OK, func(cx context.Context) error {
				r, err := c.ListSnapshots(cx, &csi.ListSnapshotsRequest{SnapshotId: id})
				if err == nil && len(r.GetEntries()) != 0 {
					return status.Errorf(codes.Internal, "listed %d snapshots for an unknown id", len(r.GetEntries()))
				}
				return err
			}},
			{"ListSnapshots source_volume_id", codes.OK, func(cx context.Context) error {
				r, err := c.ListSnapshots(cx, &csi.ListSnapshotsRequest{SourceVolumeId: id})
				if err == nil && len(r.GetEntries()) != 0 {
					return status.Errorf(codes.Internal, "listed %d snapshots for an unknown source", len(r.GetEntries()))
				}
				return err
			}},
			{"GetMetadataAllocated", codes.NotFound, func(cx context.Context) error {
				st, err := sm.GetMetadataAllocated(cx, &csi.GetMetadataAllocatedRequest{SnapshotId: id})
				if err == nil {
					_, err = st.Recv()
				}
				return err
			}},
			{"GetMetadataDelta", codes.NotFound, func(cx context.Context) error {
				st, err := sm.GetMetadataDelta(cx, &csi.GetMetadataDeltaRequest{BaseSnapshotId: id, TargetSnapshotId: id})
				if err == nil {
					_, err = st.Recv()
				}
				return err
			}},
			{"NodeGetVolumeStats", codes.NotFound, func(cx context.Context) error {
				_, err := n.NodeGetVolumeStats(cx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: e.tX})
				return err
			}},
			{"NodeExpandVolume", codes.NotFound, func(cx context.Context) error {
				_, err := n.NodeExpandVolume(cx, &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: e.tX})
				return err
			}},
			{"NodeGetVolumeHealth", codes.NotFound, func(cx context.Context) error {
				_, err := n.NodeGetVolumeHealth(cx, &csi.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: e.tX})
				return err
			}},
			{"NodeStageVolume", codes.NotFound, func(cx context.Context) error {
				_, err := n.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: e.sX, VolumeCapability: csitest.MntCap()})
				return err
			}},
			{"NodeUnstageVolume", codes.OK, func(cx context.Context) error {
				// A staging path that exists and holds no mount.
				_, err := n.NodeUnstageVolume(cx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: e.pods})
				return err
			}},
			{"NodePublishVolume", codes.NotFound, func(cx context.Context) error {
				_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: e.sX, TargetPath: e.fresh(), VolumeCapability: csitest.MntCap()})
				return err
			}},
			{"NodeUnpublishVolume", codes.OK, func(cx context.Context) error {
				_, err := n.NodeUnpublishVolume(cx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: e.fresh()})
				return err
			}},
		} {
			e.run(hcase{rpc: k.rpc, input: "id=" + q, want: k.want, call: k.call})
		}

		// Page tokens: the raw id and "v1:"+id in base64 are tokens this
		// driver never issued (the right-shaped ids excepted: those are
		// valid positions to continue after).
		tokWant := codes.Aborted
		if contract.ValidVolumeID(id) {
			tokWant = codes.OK
		}
		tok := base64.RawURLEncoding.EncodeToString([]byte("v1:" + id))
		e.run(hcase{rpc: "ListVolumes", input: "starting_token=" + q, want: codes.Aborted, call: func(cx context.Context) error {
			_, err := c.ListVolumes(cx, &csi.ListVolumesRequest{StartingToken: id})
			return err
		}})
		e.run(hcase{rpc: "ListVolumes", input: "starting_token=b64(v1:" + q + ")", want: tokWant, call: func(cx context.Context) error {
			_, err := c.ListVolumes(cx, &csi.ListVolumesRequest{StartingToken: tok})
			return err
		}})
		snapTokWant := codes.Aborted
		if contract.ValidSnapshotID(id) {
			snapTokWant = codes.OK
		}
		e.run(hcase{rpc: "ListSnapshots", input: "starting_token=b64(v1:" + q + ")", want: snapTokWant, call: func(cx context.Context) error {
			_, err := c.ListSnapshots(cx, &csi.ListSnapshotsRequest{StartingToken: tok})
			return err
		}})
		e.run(hcase{rpc: "ControllerListVolumeHealth", input: "starting_token=" + q, want: codes.Aborted, call: func(cx context.Context) error {
			_, err := c.ControllerListVolumeHealth(cx, &csi.ControllerListVolumeHealthRequest{StartingToken: id})
			return err
		}})

		// An ephemeral inline volume under this id: path-like, control
		// characters and driver-shaped ids are refused; kubelet-shaped ones
		// work and leave nothing after their unpublish.
		ephWant := codes.InvalidArgument
		if validEphemeralID(id) {
			ephWant = codes.OK
		}
		target := e.fresh()
		e.run(hcase{rpc: "NodePublishVolume ephemeral", input: "id=" + q, want: ephWant, dataRoot: true, may: []string{target},
			call: func(cx context.Context) error {
				_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: csitest.MntCap(),
					VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true", "size": "1Mi"}})
				return err
			},
			after: func(t *testing.T) {
				if ephWant == codes.OK {
					writeSyncedWithDir(t, filepath.Join(target, "f"), []byte("ephemeral"))
				}
				_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
				csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume of ephemeral "+q)
				csitest.AssertGone(t, target)
				e.assertVolumes(t)
			}})
	}
}

// assertVolumes: the data root holds exactly the corpus's own volumes.
func (e *hostileEnv) assertVolumes(t *testing.T) {
	t.Helper()
	if got := csitest.DirNames(t, filepath.Join(e.root, "volumes")); !slices.Equal(got, e.volsBefore) {
		t.Errorf("volumes now %v, want %v: something was left behind or removed", got, e.volsBefore)
	}
}

// pathCases: staging and target paths that are symlinks (to the stand-in
// /etc, to another volume's mount, to a file), that lie inside another
// volume's mount or inside the data root, that do not exist or are not
// paths at all.
func (e *hostileEnv) pathCases() {
	t, n := e.t, e.in.Node
	mk := func(name string, f func(p string) error) string {
		p := filepath.Join(e.dir, "links", name)
		csitest.Mkdir(t, filepath.Dir(p))
		if err := f(p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	symlink := func(target string) func(string) error { return func(p string) error { return os.Symlink(target, p) } }
	linkEtc := mk("to-etc", symlink(e.etc))
	linkEtcRel := mk("to-etc-rel", symlink("../etc"))
	linkTY := mk("to-other-volume", symlink(e.tY))
	linkFile := mk("to-file", symlink(filepath.Join(e.etc, "passwd")))
	linkDangling := mk("dangling", symlink(filepath.Join(e.dir, "nowhere")))
	linkRoot := mk("to-data-root", symlink(e.root))
	linkVolumes := mk("to-volumes", symlink(filepath.Join(e.root, "volumes")))
	plainFile := mk("plain-file", func(p string) error { return os.WriteFile(p, []byte("f"), 0o644) })
	fullDir := mk("full-dir", func(p string) error {
		if err := os.Mkdir(p, 0o750); err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(p, "f"), []byte("f"), 0o644)
	})
	stateDB := filepath.Join(e.root, state.FileName)
	insideY := filepath.Join(e.tY, "y-data") // a file inside Y's published mount
	insideYDir := filepath.Join(e.tY, "sub") // a fresh path inside Y's mount
	blockImg := filepath.Join(e.root, "block", e.b+".img")
	zDir := filepath.Join(e.root, "volumes", e.z)
	long := "/" + strings.Repeat("a/", 2100) + "t"
	longName := filepath.Join(e.pods, strings.Repeat("n", 256))

	pub := func(target string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: e.x, StagingTargetPath: e.sX, TargetPath: target, VolumeCapability: csitest.MntCap()})
			return err
		}
	}
	stageAt := func(staging string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: e.z, StagingTargetPath: staging, VolumeCapability: csitest.MntCap()})
			return err
		}
	}
	unpub := func(target string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodeUnpublishVolume(cx, &csi.NodeUnpublishVolumeRequest{VolumeId: e.z, TargetPath: target})
			return err
		}
	}
	unstageAt := func(staging string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodeUnstageVolume(cx, &csi.NodeUnstageVolumeRequest{VolumeId: e.z, StagingTargetPath: staging})
			return err
		}
	}
	stats := func(p string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodeGetVolumeStats(cx, &csi.NodeGetVolumeStatsRequest{VolumeId: e.x, VolumePath: p})
			return err
		}
	}
	nexpand := func(p string) func(cx context.Context) error {
		return func(cx context.Context) error {
			_, err := n.NodeExpandVolume(cx, &csi.NodeExpandVolumeRequest{VolumeId: e.x, VolumePath: p})
			return err
		}
	}
	ia, ok, nf := codes.InvalidArgument, codes.OK, codes.NotFound

	// Publish and stage onto what must be refused, and must stay as it is.
	// Never a real system path here ("/", "/proc"): without the checks
	// under test a node call could unmount it. e.dir, the data root's
	// parent, stands for every directory above the data root.
	refused := []struct {
		name, p string
		pub     codes.Code // NodePublishVolume of X there
		stage   codes.Code // NodeStageVolume of Z there
	}{
		{"symlink to /etc", linkEtc, ia, ia},
		{"relative symlink to /etc", linkEtcRel, ia, ia},
		{"symlink to another volume's mount", linkTY, ia, ia},
		{"symlink to a file", linkFile, ia, ia},
		{"dangling symlink", linkDangling, ia, ia},
		{"symlink to the data root", linkRoot, ia, ia},
		{"a regular file", plainFile, ia, ia},
		{"another volume's mount", e.tY, codes.AlreadyExists, codes.AlreadyExists},
		{"another volume's staging mount", e.sY, codes.AlreadyExists, codes.AlreadyExists},
		{"a file inside another volume's mount", insideY, ia, ia},
		{"a new path inside another volume's mount", insideYDir, ia, ia},
		{"the data root", e.root, ia, ia},
		{"the state file", stateDB, ia, ia},
		{"the volumes directory", filepath.Join(e.root, "volumes"), ia, ia},
		{"a volume's data directory", zDir, ia, ia},
		{"a block image", blockImg, ia, ia},
		{"a new path inside the data root", filepath.Join(e.root, "volumes", "evil"), ia, ia},
		{"the data root's parent", e.dir, ia, ia},
		{"below a symlink to the data root's volumes", filepath.Join(linkVolumes, e.z), ia, ia},
		{"parent does not exist", filepath.Join(e.dir, "no", "such", "t"), ia, ia},
		{"relative", "pods/t", ia, ia},
		{"unclean", e.pods + "/../etc", ia, ia},
		{"double slash", e.pods + "//t", ia, ia},
		{"NUL", e.pods + "/t\x00x", ia, ia},
		{"longer than PATH_MAX", long, ia, ia},
		{"a 256-byte name", longName, ia, ia},
	}
	for _, r := range refused {
		e.run(hcase{rpc: "NodePublishVolume", input: "target " + r.name, want: r.pub, call: pub(r.p)})
		e.run(hcase{rpc: "NodeStageVolume", input: "staging " + r.name, want: r.stage, call: stageAt(r.p)})
	}
	// Publish at a path that does not exist yet works (kubelet's usual
	// case) and unpublish removes it.
	fresh := e.fresh()
	e.run(hcase{rpc: "NodePublishVolume", input: "target that does not exist", want: ok, may: []string{fresh}, call: pub(fresh),
		after: func(t *testing.T) {
			csitest.AssertFileBytes(t, filepath.Join(fresh, "x-data"), []byte("x"))
			_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: e.x, TargetPath: fresh})
			csitest.CodeIs(t, err, ok, "NodeUnpublishVolume "+fresh)
			csitest.AssertGone(t, fresh)
		}})

	// Unpublish and unstage: a symlink is removed, never followed; nothing
	// inside the data root or another volume is touched.
	unrefused := []struct {
		name, p  string
		unpub    codes.Code
		unstage  codes.Code
		mayUnpub bool // the path itself goes away (it is ours to remove)
	}{
		{"symlink to /etc", linkEtc, ok, ok, true},
		{"symlink to another volume's mount", linkTY, ok, ok, true},
		{"symlink to the data root", linkRoot, ok, ok, true},
		{"a file inside another volume's mount", insideY, ia, ia, false},
		{"a new path inside another volume's mount", insideYDir, ia, ia, false},
		{"the data root", e.root, ia, ia, false},
		{"the state file", stateDB, ia, ia, false},
		{"the volumes directory", filepath.Join(e.root, "volumes"), ia, ia, false},
		{"an unstaged volume's data directory", zDir, ia, ia, false},
		{"a block image", blockImg, ia, ia, false},
		{"below a symlink to the data root's volumes", filepath.Join(linkVolumes, e.z), ia, ia, false},
		{"the data root's parent", e.dir, ia, ia, false},
		{"a non-empty directory that is not a mount", fullDir, codes.FailedPrecondition, ok, false},
		{"does not exist", filepath.Join(e.dir, "no", "such", "t"), ok, ok, false},
		{"relative", "pods/t", ia, ia, false},
		{"unclean", e.pods + "/../etc", ia, ia, false},
		{"NUL", e.pods + "/t\x00x", ia, ia, false},
		{"longer than PATH_MAX", long, ia, ia, false},
	}
	for _, r := range unrefused {
		var may []string
		if r.mayUnpub {
			may = []string{r.p}
		}
		e.run(hcase{rpc: "NodeUnstageVolume", input: "staging " + r.name, want: r.unstage, may: may, call: unstageAt(r.p)})
		e.run(hcase{rpc: "NodeUnpublishVolume", input: "target " + r.name, want: r.unpub, may: may, call: unpub(r.p)})
	}
	for _, l := range []string{linkEtc, linkTY, linkRoot} {
		csitest.AssertGone(t, l)
	}
	csitest.AssertFileBytes(t, filepath.Join(e.tY, "y-data"), []byte("y"))
	if ms := csitest.MountsAt(t, e.tY); len(ms) != 1 {
		t.Errorf("Y's target holds %d mounts, want 1", len(ms))
	}

	// Stats and node expansion only read: paths that do not show the
	// volume are NOT_FOUND.
	for _, r := range []struct {
		name, p string
		want    codes.Code
	}{
		{"relative", "some/path", nf},
		{"does not exist", filepath.Join(e.dir, "no", "such"), nf},
		{"NUL", e.tX + "\x00", nf},
		{"another volume's mount", e.tY, nf},
		{"symlink to /etc", filepath.Join(e.dir, "links", "to-etc-rel"), nf},
		{"longer than PATH_MAX", long, nf},
	} {
		e.run(hcase{rpc: "NodeGetVolumeStats", input: "volume_path " + r.name, want: r.want, call: stats(r.p)})
	}
	for _, r := range []struct {
		name, p string
		want    codes.Code
	}{
		{"relative", "some/path", nf},
		{"does not exist", filepath.Join(e.dir, "no", "such"), nf},
		{"NUL", e.tX + "\x00", nf},
		{"longer than PATH_MAX", long, nf},
	} {
		e.run(hcase{rpc: "NodeExpandVolume", input: "volume_path " + r.name, want: r.want, call: nexpand(r.p)})
	}
}

// contextCases: StorageClass parameters, ephemeral volume attributes,
// volume and publish contexts and secrets crafted to steer paths.
func (e *hostileEnv) contextCases() {
	c, n := e.in.Controller, e.in.Node
	ia, ok := codes.InvalidArgument, codes.OK
	for i, p := range []struct {
		params map[string]string
		want   codes.Code
	}{
		{map[string]string{"dirMode": "../../etc"}, ia},
		{map[string]string{"dirMode": "/etc"}, ia},
		{map[string]string{"dirMode": "0777; rm -rf /"}, ia},
		{map[string]string{"dirMode": "077777"}, ia},
		{map[string]string{"path": e.etc}, ia},
		{map[string]string{"dataRoot": "/"}, ia},
		{map[string]string{"engine": "../../x"}, ia},
		{map[string]string{"../..": "x"}, ia},
		{map[string]string{"": ""}, ia},
		{map[string]string{"csi.storage.k8s.io/pvc/name": "../../" + filepath.Base(e.etc)}, ok},
		{map[string]string{"csi.storage.k8s.io/pvc/namespace": e.etc, "csi.storage.k8s.io/pv/name": "\x00"}, ok},
	} {
		var made string
		in := fmt.Sprintf("parameters=%q", p.params)
		e.run(hcase{rpc: "CreateVolume", input: in, want: p.want, dataRoot: true,
			call: func(cx context.Context) error {
				r, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: fmt.Sprintf("param-%d", i), Parameters: p.params,
					CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				made = r.GetVolume().GetVolumeId()
				return err
			},
			after: func(t *testing.T) {
				if made != "" {
					_, err := c.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: made})
					csitest.CodeIs(t, err, ok, "DeleteVolume "+made)
				}
				e.assertVolumes(t)
			}})
		e.run(hcase{rpc: "GetCapacity", input: in, want: p.want, call: func(cx context.Context) error {
			_, err := c.GetCapacity(cx, &csi.GetCapacityRequest{Parameters: p.params})
			return err
		}})
		e.run(hcase{rpc: "CreateSnapshot", input: in, want: map[bool]codes.Code{true: ok, false: ia}[p.want == ok], dataRoot: true,
			call: func(cx context.Context) error {
				r, err := c.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: fmt.Sprintf("param-snap-%d", i), SourceVolumeId: e.z, Parameters: p.params})
				if id := r.GetSnapshot().GetSnapshotId(); id != "" {
					_, derr := c.DeleteSnapshot(csitest.Ctx(e.t), &csi.DeleteSnapshotRequest{SnapshotId: id})
					csitest.CodeIs(e.t, derr, ok, "DeleteSnapshot "+id)
				}
				return err
			}})
	}

	// Ephemeral inline volume attributes.
	for _, a := range []struct {
		attrs map[string]string
		want  codes.Code
	}{
		{map[string]string{"size": "../.."}, ia},
		{map[string]string{"size": "-1"}, ia},
		{map[string]string{"size": "0"}, ia},
		{map[string]string{"size": "1e30"}, ia},
		{map[string]string{"size": "9223372036854775807"}, codes.ResourceExhausted},
		{map[string]string{"size": "1Mi\x00"}, ia},
		{map[string]string{"dirMode": "/etc"}, ia},
		{map[string]string{"path": e.etc}, ia},
		{map[string]string{"volumeRoot": "/"}, ia},
		{map[string]string{"csi.storage.k8s.io/pod.name": "../../" + filepath.Base(e.etc), "size": "1Mi"}, ok},
		{map[string]string{"csi.storage.k8s.io/serviceAccount.tokens": "{\"../..\":1}", "size": "1Mi"}, ok},
	} {
		attrs := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
		for k, v := range a.attrs {
			attrs[k] = v
		}
		target := e.fresh()
		e.run(hcase{rpc: "NodePublishVolume ephemeral", input: fmt.Sprintf("volume_context=%q", a.attrs), want: a.want, dataRoot: true, may: []string{target},
			call: func(cx context.Context) error {
				_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: "csi-attrs", TargetPath: target, VolumeCapability: csitest.MntCap(), VolumeContext: attrs})
				return err
			},
			after: func(t *testing.T) {
				_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-attrs", TargetPath: target})
				csitest.CodeIs(t, err, ok, "NodeUnpublishVolume csi-attrs")
				csitest.AssertGone(t, target)
				e.assertVolumes(t)
			}})
	}

	// A persistent volume's contexts and secrets are never paths: publish
	// and stage ignore them, so X goes to the given target only.
	steer := map[string]string{"path": e.etc, "dataRoot": "/", "volumeRoot": "../..", "devicePath": "/dev/sda", "csi.storage.k8s.io/ephemeral": "false"}
	target := e.fresh()
	e.run(hcase{rpc: "NodePublishVolume", input: "volume_context/publish_context/secrets steering to /etc", want: ok, may: []string{target},
		call: func(cx context.Context) error {
			_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: e.x, StagingTargetPath: e.sX, TargetPath: target,
				VolumeCapability: csitest.MntCap(), VolumeContext: steer, PublishContext: steer, Secrets: steer})
			return err
		},
		after: func(t *testing.T) {
			csitest.AssertFileBytes(t, filepath.Join(target, "x-data"), []byte("x"))
			_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: e.x, TargetPath: target})
			csitest.CodeIs(t, err, ok, "NodeUnpublishVolume "+target)
		}})
	e.run(hcase{rpc: "NodeStageVolume", input: "volume_context/publish_context/secrets steering to /etc (repeat stage of X)", want: ok,
		call: func(cx context.Context) error {
			_, err := n.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: e.x, StagingTargetPath: e.sX, VolumeCapability: csitest.MntCap(),
				VolumeContext: steer, PublishContext: steer, Secrets: steer})
			return err
		}})
	e.run(hcase{rpc: "ValidateVolumeCapabilities", input: "volume_context steering to /etc", want: ok,
		call: func(cx context.Context) error {
			_, err := c.ValidateVolumeCapabilities(cx, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: e.x, VolumeContext: steer,
				VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, Secrets: steer})
			return err
		}})
	// Mount flags that would change what is mounted, not how.
	for _, f := range []string{"bind=/etc", "src=" + e.etc, "remount", "move", "x-mount.mkdir", "loop=/dev/loop0", "context=\"system_u:object_r:etc_t:s0\"", "../..", "\x00"} {
		target := e.fresh()
		e.run(hcase{rpc: "NodePublishVolume", input: "mount_flags=" + quote(f), want: ia, may: []string{target},
			call: func(cx context.Context) error {
				_, err := n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: e.x, StagingTargetPath: e.sX, TargetPath: target, VolumeCapability: csitest.MntCap(f)})
				return err
			},
			after: func(t *testing.T) {
				if ms := csitest.MountsAt(t, target); len(ms) != 0 {
					t.Errorf("mount_flags=%s: %s left mounted", quote(f), target)
				}
				_, _ = n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: e.x, TargetPath: target})
			}})
	}
}

// snapshotContents: a volume holding symlinks that point out of it (to the
// stand-in /etc, up the tree, to a path that does not exist), device nodes
// and a FIFO is snapshotted, restored and cloned. The copies hold the same
// links and nodes, never what they point to; nothing outside changes and
// the dangling target is not created.
func (e *hostileEnv) snapshotContents() {
	t, c, n := e.t, e.in.Controller, e.in.Node
	root := filepath.Join(e.tX, "hostile")
	csitest.Mkdir(t, filepath.Join(root, "d"))
	links := map[string]string{
		"abs-etc":    e.etc,
		"abs-file":   filepath.Join(e.etc, "passwd"),
		"rel-up":     "../../../../../../../../../etc",
		"dangling":   filepath.Join(e.dir, "nowhere", "created-through-link"),
		"d/up":       "../..",
		"d/abs-keep": e.keep,
		"self":       "self",
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(root, name)); err != nil {
			t.Fatal(err)
		}
	}
	devs := map[string]struct {
		mode uint32
		dev  int
	}{
		"null":   {unix.S_IFCHR | 0o666, int(unix.Mkdev(1, 3))},
		"mem":    {unix.S_IFCHR | 0o600, int(unix.Mkdev(1, 1))},
		"loop0":  {unix.S_IFBLK | 0o600, int(unix.Mkdev(7, 0))},
		"fifo":   {unix.S_IFIFO | 0o600, 0},
		"d/sda1": {unix.S_IFBLK | 0o600, int(unix.Mkdev(8, 1))},
	}
	for name, d := range devs {
		if err := unix.Mknod(filepath.Join(root, name), d.mode, d.dev); err != nil {
			t.Fatal(err)
		}
	}

	var snapID, restored, cloned string
	e.run(hcase{rpc: "CreateSnapshot", input: "of a volume holding symlinks out of it and device nodes", want: codes.OK, dataRoot: true,
		call: func(cx context.Context) error {
			r, err := c.CreateSnapshot(cx, &csi.CreateSnapshotRequest{Name: "hostile-contents", SourceVolumeId: e.x})
			snapID = r.GetSnapshot().GetSnapshotId()
			return err
		}})
	if snapID == "" {
		t.FailNow()
	}
	e.run(hcase{rpc: "CreateVolume", input: "restored from that snapshot", want: codes.OK, dataRoot: true,
		call: func(cx context.Context) error {
			r, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: "hostile-restored", VolumeContentSource: csitest.FromSnapshot(snapID), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
			restored = r.GetVolume().GetVolumeId()
			return err
		}})
	e.run(hcase{rpc: "CreateVolume", input: "cloned from that volume", want: codes.OK, dataRoot: true,
		call: func(cx context.Context) error {
			r, err := c.CreateVolume(cx, &csi.CreateVolumeRequest{Name: "hostile-cloned", VolumeContentSource: csitest.FromVolume(e.x), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
			cloned = r.GetVolume().GetVolumeId()
			return err
		}})
	if restored == "" || cloned == "" {
		t.FailNow()
	}
	for _, v := range []struct{ what, dir string }{
		{"snapshot", filepath.Join(e.root, "snapshots", snapID, "hostile")},
		{"restored volume", filepath.Join(e.root, "volumes", restored, "hostile")},
		{"cloned volume", filepath.Join(e.root, "volumes", cloned, "hostile")},
	} {
		for name, target := range links {
			got, err := os.Readlink(filepath.Join(v.dir, name))
			if err != nil || got != target {
				t.Errorf("%s: %s is %q (%v), want the symlink to %q, not followed", v.what, name, got, err, target)
			}
		}
		for name, d := range devs {
			var st unix.Stat_t
			if err := unix.Lstat(filepath.Join(v.dir, name), &st); err != nil {
				t.Errorf("%s: %s: %v", v.what, name, err)
				continue
			}
			if st.Mode&unix.S_IFMT != d.mode&unix.S_IFMT || (d.dev != 0 && st.Rdev != uint64(d.dev)) {
				t.Errorf("%s: %s has mode %o rdev %d, want mode %o rdev %d (a node, never its contents)", v.what, name, st.Mode, st.Rdev, d.mode, d.dev)
			}
		}
	}
	// Publish the restored volume and read through it: the links still
	// point out, the stand-in /etc is untouched (watcher), nothing was
	// created where the dangling link points.
	sR, tR := e.attach(restored, false)
	csitest.AssertGone(t, filepath.Join(e.dir, "nowhere"))
	for _, p := range []string{tR, sR} {
		_, err := n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: restored, TargetPath: tR})
		csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume restored")
		_, err = n.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: restored, StagingTargetPath: sR})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume restored")
		_ = p
	}
	if err := os.Remove(sR); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{restored, cloned} {
		_, err := c.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+id)
	}
	_, err := c.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: snapID})
	csitest.CodeIs(t, err, codes.OK, "DeleteSnapshot "+snapID)
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	e.assertVolumes(t)
	if s := csitest.DirNames(t, filepath.Join(e.root, "snapshots")); len(s) != 0 {
		t.Errorf("snapshots left: %v", s)
	}
}
