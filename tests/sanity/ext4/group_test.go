package ext4

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

func capOf(fsType string) *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: fsType}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// startDir starts the driver in all mode with the dir engine on a data
// root in a temp dir, and returns it, its options and the temp dir.
func startDir(t *testing.T) (*testdriver.Instance, driver.Options, string) {
	t.Helper()
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.Engine = "dir"
	return testdriver.StartWith(t, o), o, dir
}

// inUse creates a volume of fsType ("" for a directory volume), stages and
// publishes it below dir (for no pod), and returns its id and the
// published path (unpublished and unstaged when the test ends).
func inUse(t *testing.T, in *testdriver.Instance, dir, name, fsType string) (string, string) {
	t.Helper()
	return forPod(t, in, dir, name, capOf(fsType), "", nil)
}

// writeSeq replaces path with a file holding n: written to path.tmp,
// fsynced, renamed over path. (Truncating path in place would let a cut
// between the truncation and the write show an empty file: a state the
// writer did pass through, but not a number.)
func writeSeq(path string, n int) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(strconv.Itoa(n)); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// seqIn mounts the ext4 image of snapshot data at img read-only (a loop
// device) and reads the number its writer left in seq.
func seqIn(t *testing.T, img, mnt string) int {
	t.Helper()
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-o", "ro,loop,noload", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", img, err, out)
	}
	defer func() {
		if out, err := exec.Command("umount", "-d", mnt).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", mnt, err, out)
		}
	}()
	b, err := os.ReadFile(filepath.Join(mnt, "seq"))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("seq in %s: %q", img, b)
	}
	return n
}

// Volume group snapshots of two ext4 image volumes in use, taken while a
// writer writes the same number to the first, then to the second, each
// write synced before the next: in every group the second volume holds
// the first's number or the one before, never a later one (the members
// are cut at one point in time: both filesystems frozen together). A
// directory volume in use cannot be frozen: a group with it is
// FAILED_PRECONDITION; one nobody uses can be in a group. The group is
// found by id, deleted with its snapshot ids, and a delete naming
// another snapshot is INVALID_ARGUMENT.
func TestGroupSnapshotWriteOrder(t *testing.T) {
	in, o, dir := startDir(t)
	gc := csi.NewGroupControllerClient(in.Conn)
	ctx := context.Background()
	a, pubA := inUse(t, in, dir, "first", "ext4")
	b, pubB := inUse(t, in, dir, "second", "ext4")

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var werr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if werr = writeSeq(filepath.Join(pubA, "seq"), i); werr != nil {
				return
			}
			if werr = writeSeq(filepath.Join(pubB, "seq"), i); werr != nil {
				return
			}
		}
	}()
	var groups []*csi.VolumeGroupSnapshot
	for i := range 6 {
		time.Sleep(30 * time.Millisecond)
		r, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: fmt.Sprintf("g%d", i), SourceVolumeIds: []string{b, a}})
		if err != nil {
			close(stop)
			wg.Wait()
			t.Fatal(err)
		}
		groups = append(groups, r.GetGroupSnapshot())
	}
	close(stop)
	wg.Wait()
	if werr != nil {
		t.Fatalf("the writer: %v", werr)
	}
	for i, g := range groups {
		seq := map[string]int{}
		for _, s := range g.GetSnapshots() {
			if s.GetGroupSnapshotId() != g.GetGroupSnapshotId() || !s.GetReadyToUse() {
				t.Errorf("group %d member %+v: want its group id and ready", i, s)
			}
			seq[s.GetSourceVolumeId()] = seqIn(t, filepath.Join(o.DataRoot, "snapshots", s.GetSnapshotId()+".img"), filepath.Join(dir, "check"))
		}
		if len(seq) != 2 || (seq[b] != seq[a] && seq[b] != seq[a]-1) {
			t.Errorf("group %d: first volume at %d, second at %d; the second must be at the first's number or the one before", i, seq[a], seq[b])
		}
		t.Logf("group %d: first %d, second %d", i, seq[a], seq[b])
	}

	// A member restores like any snapshot.
	member := groups[0].GetSnapshots()[0]
	if _, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", VolumeCapabilities: []*csi.VolumeCapability{capOf("ext4")},
		VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: member.GetSnapshotId()}}}}); err != nil {
		t.Errorf("restore of group member %s: %v", member.GetSnapshotId(), err)
	}

	// The same name and volumes: the same group.
	again, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g0", SourceVolumeIds: []string{a, b}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != groups[0].GetGroupSnapshotId() {
		t.Errorf("a repeated create: %v, %v; want group %s", again, err, groups[0].GetGroupSnapshotId())
	}
	if _, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "g0", SourceVolumeIds: []string{a}}); status.Code(err) != codes.AlreadyExists {
		t.Errorf("the name of a group of other volumes: %v, want ALREADY_EXISTS", err)
	}
	// deletionPolicy, as the Kubernetes e2e suite's classes carry it, is
	// accepted; any other parameter is not.
	for params, want := range map[string]codes.Code{
		`{"deletionPolicy":"Delete"}`: codes.OK, `{"deletionPolicy":"Maybe"}`: codes.InvalidArgument, `{"consistency":"crash"}`: codes.InvalidArgument,
	} {
		var p map[string]string
		if err := json.Unmarshal([]byte(params), &p); err != nil {
			t.Fatal(err)
		}
		_, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "params", SourceVolumeIds: []string{a, b}, Parameters: p})
		if status.Code(err) != want {
			t.Errorf("group snapshot with parameters %s: %v, want %v", params, err, want)
		}
	}
	dirVol, _ := inUse(t, in, dir, "plain", "")
	if _, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "with-dir", SourceVolumeIds: []string{a, dirVol}}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("a group with a directory volume in use: %v, want FAILED_PRECONDITION", err)
	}
	idle, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "idle", VolumeCapabilities: []*csi.VolumeCapability{capOf("")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: "with-idle", SourceVolumeIds: []string{a, idle.GetVolume().GetVolumeId()}}); err != nil {
		t.Errorf("a group with a directory volume nobody uses: %v", err)
	}

	g := groups[1]
	var ids []string
	for _, s := range g.GetSnapshots() {
		ids = append(ids, s.GetSnapshotId())
	}
	got, err := gc.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids})
	if err != nil || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("GetVolumeGroupSnapshot: %v, %v", got, err)
	}
	other := groups[2].GetSnapshots()[0].GetSnapshotId()
	if _, err := gc.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: []string{ids[0], other}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("delete naming another group's snapshot: %v, want INVALID_ARGUMENT", err)
	}
	if _, err := gc.DeleteVolumeGroupSnapshot(ctx, &csi.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId(), SnapshotIds: ids}); err != nil {
		t.Fatal(err)
	}
	if _, err := gc.GetVolumeGroupSnapshot(ctx, &csi.GetVolumeGroupSnapshotRequest{GroupSnapshotId: g.GetGroupSnapshotId()}); status.Code(err) != codes.NotFound {
		t.Errorf("the deleted group: %v, want NOT_FOUND", err)
	}
	for _, id := range ids {
		if _, err := os.Stat(filepath.Join(o.DataRoot, "snapshots", id+".img")); !os.IsNotExist(err) {
			t.Errorf("snapshot %s of the deleted group still has data: %v", id, err)
		}
	}
}

// dirMode on an image volume: the StorageClass's is its filesystem root's
// mode at stage, a VolumeAttributesClass's changes it where it is staged
// and wins at every later stage.
func TestImageDirMode(t *testing.T) {
	in, _, dir := startDir(t)
	ctx := context.Background()
	c := capOf("ext4")
	r, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "img", VolumeCapabilities: []*csi.VolumeCapability{c},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, Parameters: map[string]string{"dirMode": "0750"}})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	stage := filepath.Join(dir, "stage")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	mode := func(when string, want os.FileMode) {
		t.Helper()
		if fi, err := os.Stat(stage); err != nil || fi.Mode().Perm() != want {
			t.Errorf("%s: mode of the filesystem root %v (%v), want %o", when, fi.Mode().Perm(), err, want)
		}
	}
	stageIt := func() {
		t.Helper()
		if _, err := in.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: c}); err != nil {
			t.Fatal(err)
		}
	}
	unstage := func() {
		t.Helper()
		if _, err := in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage}); err != nil {
			t.Fatal(err)
		}
	}
	stageIt()
	mode("staged with the class's dirMode 0750", 0o750)
	if _, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"dirMode": "0700"}}); err != nil {
		t.Fatal(err)
	}
	mode("modified to dirMode 0700 while staged", 0o700)
	if err := os.Chmod(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	unstage()
	stageIt()
	mode("staged again", 0o700)
	unstage()
	if _, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: map[string]string{"dirMode": "0711"}}); err != nil {
		t.Fatal(err)
	}
	stageIt()
	mode("modified to 0711 while not staged, then staged", 0o711)
	unstage()
}
