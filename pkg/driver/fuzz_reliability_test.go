package driver

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/keylock"
	"github.com/localdir-csi/localdir/pkg/mount"
)

// Fuzz targets for the parts of request validation fuzz_test.go does not
// reach: ephemeral volume attributes, node paths and --kubelet-root, and
// whole Controller requests decoded from arbitrary bytes. `make fuzz` runs
// every target for a few seconds; a failing input is kept by go test under
// testdata/fuzz/<target>/ and runs as a seed from then on.

func FuzzParseEphemeral(f *testing.F) {
	f.Add("csi-0a1b2c", "size", "10Mi", "dirMode", "0770", false, int64(0))
	f.Add("csi-x", "size", "0", "", "", false, int64(0))
	f.Add("csi-x", "size", "1e30", "", "", false, int64(0))
	f.Add("csi-x", "size", "9223372036854775807", "", "", false, int64(1<<30))
	f.Add("../../etc", "", "", "", "", false, int64(0))
	f.Add("vol-0123456789abcdef0123456789abcdef", "", "", "", "", false, int64(0))
	f.Add("csi-x", "path", "/etc", "csi.storage.k8s.io/pod.name", "../..", false, int64(0))
	f.Add("csi-x", "dirMode", "/etc", "", "", true, int64(0))
	f.Add("a\x00b", "size", "1Mi\x00", "", "", false, int64(0))
	f.Fuzz(func(t *testing.T, id, k1, v1, k2, v2 string, block bool, maxBytes int64) {
		if maxBytes < 0 {
			t.Skip("Options.Validate refuses it")
		}
		vc := map[string]string{k1: v1, k2: v2}
		size, attrs, params, err := parseEphemeral(id, block, vc, maxBytes)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.OutOfRange {
				t.Fatalf("parseEphemeral(%q, %v) = %v, want InvalidArgument or OutOfRange", id, vc, err)
			}
			if msg := status.Convert(err).Message(); !utf8.ValidString(msg) {
				t.Fatalf("error message %q is not valid UTF-8", msg)
			}
			return
		}
		// Accepted: an id that can never be a path nor a driver id, a
		// positive size within the maximum, only known attributes.
		if block || id == "" || strings.ContainsAny(id, "/\x00") || strings.Contains(id, "..") || filepath.Base(id) != id || contract.ValidVolumeID(id) {
			t.Fatalf("parseEphemeral accepted id %q (block %v)", id, block)
		}
		if size <= 0 || (maxBytes > 0 && size > maxBytes) {
			t.Fatalf("parseEphemeral(%v): size %d (max %d)", vc, size, maxBytes)
		}
		if size%4096 != 0 && size <= math.MaxInt64-4095 {
			t.Fatalf("parseEphemeral(%v): size %d is not a multiple of 4 KiB", vc, size)
		}
		for k := range attrs {
			if k != ParamDirMode {
				t.Fatalf("parseEphemeral kept attribute %q", k)
			}
		}
		for k := range vc {
			if k != "" && !strings.HasPrefix(k, reservedPrefix) && k != AttrSize && k != ParamDirMode {
				t.Fatalf("parseEphemeral accepted unknown attribute %q", k)
			}
		}
		if params.DirMode > 0o7777 {
			t.Fatalf("dirMode %o", params.DirMode)
		}
	})
}

func FuzzCheckNodePath(f *testing.F) {
	for _, s := range []string{
		"", "/", "/a", "/a/", "/a//b", "/a/../b", "/a/./b", "a/b", "./a", "/a\x00b",
		"/" + strings.Repeat("a", 255), "/" + strings.Repeat("a", 256), "/" + strings.Repeat("a/", 2047), "/" + strings.Repeat("a/", 2048),
		"/var/lib/kubelet/pods/0a1b/volumes/kubernetes.io~csi/pvc-1/mount",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		err := checkNodePath("target_path", p)
		c := filepath.Clean(p)
		want := p != "" && filepath.IsAbs(p) && (c == p || c+"/" == p) && !strings.ContainsRune(p, 0) && len(p) < unix.PathMax
		for _, n := range strings.Split(p, "/") {
			want = want && len(n) <= 255
		}
		if (err == nil) != want {
			t.Fatalf("checkNodePath(%q) = %v, want accepted=%v", p, err, want)
		}
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("checkNodePath(%q) = %v, want InvalidArgument", p, err)
		}
	})
}

func FuzzCheckKubeletRoot(f *testing.F) {
	root := filepath.Join(f.TempDir(), "kubelet")
	if err := os.MkdirAll(filepath.Join(root, "pods", "p1"), 0o750); err != nil {
		f.Fatal(err)
	}
	out := filepath.Join(filepath.Dir(root), "outside")
	if err := os.Mkdir(out, 0o750); err != nil {
		f.Fatal(err)
	}
	if err := os.Symlink(out, filepath.Join(root, "pods", "escape")); err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{
		root, root + "/", root + "/pods/p1/mount", root + "/pods/escape/x", root + "-evil/x", filepath.Dir(root),
		root + "/pods/../../outside/x", "/", "/etc/passwd", "/proc/self/root" + root + "/pods/p1/x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if checkNodePath("target_path", p) != nil {
			return // refused earlier
		}
		err := checkKubeletRoot("target_path", p, root)
		resolved := filepath.Join(mount.ResolveExisting(filepath.Dir(filepath.Clean(p))), filepath.Base(p))
		inside := strings.HasPrefix(resolved, root+"/")
		if (err == nil) != inside {
			t.Fatalf("checkKubeletRoot(%q) = %v; it resolves to %q", p, err, resolved)
		}
		if err != nil && (status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), root)) {
			t.Fatalf("checkKubeletRoot(%q) = %v, want InvalidArgument naming the root", p, err)
		}
		// Lexically below the root without a way out: always accepted.
		if rel, rerr := filepath.Rel(root, filepath.Clean(p)); rerr == nil && !strings.HasPrefix(rel, "..") && rel != "." &&
			!strings.Contains(rel, "escape") && err != nil {
			t.Fatalf("checkKubeletRoot(%q) refused a path below the root: %v", p, err)
		}
	})
}

// memBackend is an in-memory Backend for fuzzing the Controller service's
// request handling without disk I/O.
type memBackend struct {
	mu         sync.Mutex
	vols       map[string]*contract.Volume
	byName     map[string]string
	snaps      map[string]*contract.Snapshot
	snapByName map[string]string
}

func newMemBackend() *memBackend {
	return &memBackend{vols: map[string]*contract.Volume{}, byName: map[string]string{}, snaps: map[string]*contract.Snapshot{}, snapByName: map[string]string{}}
}

func (b *memBackend) VolumeByName(_ context.Context, name string) (*contract.Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.byName[name]; ok {
		v := *b.vols[id]
		return &v, nil
	}
	return nil, nil
}

func (b *memBackend) Volume(_ context.Context, id string) (*contract.Volume, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.vols[id]; ok {
		c := *v
		return &c, nil
	}
	return nil, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
}

func (b *memBackend) ListVolumes(_ context.Context, after string, limit int) ([]*contract.Volume, string, error) {
	return nil, "", nil
}

func (b *memBackend) CreateVolume(_ context.Context, spec contract.CreateSpec, _ *csi.TopologyRequirement) (*contract.Volume, error) {
	if spec.SizeBytes <= 0 || checkName("name", spec.Name) != nil || (spec.AccessType != contract.AccessMount && spec.AccessType != contract.AccessBlock) ||
		spec.DirMode > 0o7777 || (spec.SourceSnapshotID != "" && spec.SourceVolumeID != "") {
		return nil, fmt.Errorf("memBackend: the controller passed an invalid spec %+v", spec)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.byName[spec.Name]; ok {
		return nil, fmt.Errorf("memBackend: a second create for name %q", spec.Name)
	}
	v := &contract.Volume{ID: contract.NewVolumeID(), Name: spec.Name, CapacityBytes: spec.SizeBytes, AccessType: spec.AccessType,
		Parameters: spec.Parameters, SourceSnapshotID: spec.SourceSnapshotID, SourceVolumeID: spec.SourceVolumeID}
	b.vols[v.ID], b.byName[v.Name] = v, v.ID
	c := *v
	return &c, nil
}

func (b *memBackend) DeleteVolume(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if v, ok := b.vols[id]; ok {
		delete(b.byName, v.Name)
		delete(b.vols, id)
	}
	return nil
}

func (b *memBackend) ExpandVolume(_ context.Context, id string, size int64) (int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.vols[id]
	if !ok {
		return 0, fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	v.CapacityBytes = max(v.CapacityBytes, size)
	return v.CapacityBytes, nil
}

func (b *memBackend) ModifyVolume(_ context.Context, id string, params map[string]string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.vols[id]
	if !ok {
		return fmt.Errorf("%w: volume %q", contract.ErrNotFound, id)
	}
	if v.MutableParameters == nil {
		v.MutableParameters = map[string]string{}
	}
	maps.Copy(v.MutableParameters, params)
	return nil
}

func (b *memBackend) Capacity(context.Context, *csi.Topology) (int64, int64, error) {
	return 1 << 40, 1 << 40, nil
}

func (b *memBackend) VolumeHealth(ctx context.Context, id string) (contract.Health, error) {
	_, err := b.Volume(ctx, id)
	return contract.Health{}, err
}

func (b *memBackend) SnapshotByName(_ context.Context, name string) (*contract.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if id, ok := b.snapByName[name]; ok {
		s := *b.snaps[id]
		return &s, nil
	}
	return nil, nil
}

func (b *memBackend) Snapshot(_ context.Context, id string) (*contract.Snapshot, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.snaps[id]; ok {
		c := *s
		return &c, nil
	}
	return nil, fmt.Errorf("%w: snapshot %q", contract.ErrNotFound, id)
}

func (b *memBackend) ListSnapshots(context.Context, string, int, string) ([]*contract.Snapshot, string, error) {
	return nil, "", nil
}

func (b *memBackend) CreateSnapshot(ctx context.Context, name, src string, _ *csi.TopologyRequirement, _ int) (*contract.Snapshot, error) {
	v, err := b.Volume(ctx, src)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := &contract.Snapshot{ID: contract.NewSnapshotID(), Name: name, SourceVolumeID: v.ID, SizeBytes: v.CapacityBytes, AccessType: v.AccessType}
	b.snaps[s.ID], b.snapByName[name] = s, s.ID
	c := *s
	return &c, nil
}

func (b *memBackend) DeleteSnapshot(_ context.Context, id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s, ok := b.snaps[id]; ok {
		delete(b.snapByName, s.Name)
		delete(b.snaps, id)
	}
	return nil
}

// FuzzControllerRequest decodes arbitrary bytes as a Controller request
// and sends it to the Controller service (over an in-memory backend that
// fails on any spec the service should have refused). No request may
// panic, be answered INTERNAL or UNKNOWN, or get an error message that is
// not valid UTF-8 (gRPC could not send it); an accepted CreateVolume gets a
// driver-shaped id and a size within its range, and the same request again
// gets the same volume.
func FuzzControllerRequest(f *testing.F) {
	add := func(kind uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(kind, b)
	}
	mnt := &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	add(0, &csi.CreateVolumeRequest{Name: "pvc-1", CapacityRange: &csi.CapacityRange{RequiredBytes: mib}, VolumeCapabilities: []*csi.VolumeCapability{mnt}})
	add(0, &csi.CreateVolumeRequest{Name: "../..", Parameters: map[string]string{"dirMode": "0770"}, VolumeCapabilities: []*csi.VolumeCapability{mnt}})
	add(0, &csi.CreateVolumeRequest{Name: "x", CapacityRange: &csi.CapacityRange{RequiredBytes: math.MaxInt64, LimitBytes: math.MaxInt64}, VolumeCapabilities: []*csi.VolumeCapability{mnt}})
	add(0, &csi.CreateVolumeRequest{Name: "x", VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "../x"}}}, VolumeCapabilities: []*csi.VolumeCapability{mnt}})
	add(1, &csi.CreateSnapshotRequest{Name: "s", SourceVolumeId: "vol-0123456789abcdef0123456789abcdef"})
	add(2, &csi.ControllerExpandVolumeRequest{VolumeId: "vol-0123456789abcdef0123456789abcdef", CapacityRange: &csi.CapacityRange{RequiredBytes: -1}})
	add(3, &csi.ListVolumesRequest{MaxEntries: -1, StartingToken: "djE6Li4"})
	add(4, &csi.ValidateVolumeCapabilitiesRequest{VolumeId: "x", VolumeCapabilities: []*csi.VolumeCapability{{}}})
	add(5, &csi.DeleteVolumeRequest{VolumeId: "/etc"})
	add(6, &csi.GetCapacityRequest{Parameters: map[string]string{"dirMode": "x"}})
	add(7, &csi.ListSnapshotsRequest{SnapshotId: "../..", StartingToken: "x"})
	opts := Options{Mode: ModeAll, DefaultVolumeBytes: gib, MaxVolumeBytes: 100 * gib}
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		d := &Driver{opts: opts, names: keylock.New(), ids: keylock.New(), backend: newMemBackend()}
		c := &controller{d: d}
		ctx := context.Background()
		var err error
		switch kind % 8 {
		case 0:
			req := &csi.CreateVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			var resp *csi.CreateVolumeResponse
			resp, err = c.CreateVolume(ctx, req)
			if err == nil {
				v := resp.GetVolume()
				cr := req.GetCapacityRange()
				if !contract.ValidVolumeID(v.GetVolumeId()) || v.GetCapacityBytes() <= 0 || v.GetCapacityBytes() < cr.GetRequiredBytes() ||
					(cr.GetLimitBytes() > 0 && v.GetCapacityBytes() > cr.GetLimitBytes()) {
					t.Fatalf("CreateVolume(%v) = %v", req, v)
				}
				again, err := c.CreateVolume(ctx, req)
				if err != nil || again.GetVolume().GetVolumeId() != v.GetVolumeId() {
					t.Fatalf("CreateVolume(%v) again = %v, %v; the first gave %s", req, again, err, v.GetVolumeId())
				}
			}
		case 1:
			req := &csi.CreateSnapshotRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.CreateSnapshot(ctx, req)
		case 2:
			req := &csi.ControllerExpandVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.ControllerExpandVolume(ctx, req)
		case 3:
			req := &csi.ListVolumesRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.ListVolumes(ctx, req)
		case 4:
			req := &csi.ValidateVolumeCapabilitiesRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.ValidateVolumeCapabilities(ctx, req)
		case 5:
			req := &csi.DeleteVolumeRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.DeleteVolume(ctx, req)
		case 6:
			req := &csi.GetCapacityRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.GetCapacity(ctx, req)
		case 7:
			req := &csi.ListSnapshotsRequest{}
			if proto.Unmarshal(data, req) != nil {
				return
			}
			_, err = c.ListSnapshots(ctx, req)
		}
		if err == nil {
			return
		}
		st, ok := status.FromError(err)
		if !ok {
			t.Fatalf("request kind %d: error without a gRPC status: %v", kind%8, err)
		}
		switch st.Code() {
		case codes.Internal, codes.Unknown, codes.Unimplemented:
			t.Fatalf("request kind %d: %v", kind%8, err)
		}
		if !utf8.ValidString(st.Message()) {
			t.Fatalf("request kind %d: message %q is not valid UTF-8", kind%8, st.Message())
		}
	})
}
