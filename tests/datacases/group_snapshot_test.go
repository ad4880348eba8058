package datacases

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
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testcgroup"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// inUse creates a volume of fsType ("" for a directory volume), stages and
// publishes it below dir (for no pod), and returns its id and the
// published path (unpublished and unstaged when the test ends).
func inUse(t *testing.T, in *testdriver.Instance, dir, name, fsType string) (string, string) {
	t.Helper()
	return forPod(t, in, dir, name, csitest.MntCapFS(fsType), "", nil)
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
	in, o, dir := startDirEngine(t)
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
			if werr = csitest.WriteSeq(filepath.Join(pubA, "seq"), i); werr != nil {
				return
			}
			if werr = csitest.WriteSeq(filepath.Join(pubB, "seq"), i); werr != nil {
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
	if _, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "restored", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS("ext4")},
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
	// accepted, and copies "1"; copies "2" needs cluster mode; any other
	// parameter is refused.
	for params, want := range map[string]codes.Code{
		`{"deletionPolicy":"Delete"}`: codes.OK, `{"deletionPolicy":"Maybe"}`: codes.InvalidArgument, `{"consistency":"crash"}`: codes.InvalidArgument,
		`{"copies":"1"}`: codes.OK, `{"copies":"2"}`: codes.InvalidArgument, `{"copies":"many"}`: codes.InvalidArgument,
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
	idle, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "idle", VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS("")}})
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

// Group snapshots of volumes in use by pods: a directory volume and a raw
// block volume, written by one pod in a known order (a number to the
// directory volume's file, synced and renamed into place, then to the
// block device, synced). The
// pod is frozen (its freezer cgroup) while the members are cut, so every
// group shows the block device at the directory's number or the one
// before. A pod's freeze that a killed driver left behind is thawed when
// the driver starts.
func TestGroupSnapshotFreezesPods(t *testing.T) {
	in, o, dir := startDirEngine(t)
	gc := csi.NewGroupControllerClient(in.Conn)
	ctx := context.Background()
	pod := testcgroup.NewPod(t, "3f1c7a52-1d2e-4c11-9a50-0000000000b2")
	a, pubA := forPod(t, in, dir, "files", csitest.MntCapFS(""), pod.UID, nil)
	b, pubB := forPod(t, in, dir, "device", csitest.BlkCap(), pod.UID, nil)
	// The kubelet also binds a raw block volume's device at
	// .../volumeDevices/<volume>/dev/<pod UID>: that is the pod's too.
	mapped := filepath.Join(dir, "map", "dev", pod.UID)
	if err := os.MkdirAll(filepath.Dir(mapped), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mapped, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(pubB, mapped, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mapped, unix.MNT_DETACH) })
	pod.Start(t, "sh", "-c", `i=0; while true; do i=$((i+1)); echo $i > "$0/seq.tmp"; sync "$0/seq.tmp"; mv "$0/seq.tmp" "$0/seq"; printf '%-15s\n' $i | dd of="$1" bs=16 count=1 conv=fsync,notrunc status=none; done`, pubA, pubB)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if b, _ := os.ReadFile(filepath.Join(pubA, "seq")); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pod never wrote")
		}
		time.Sleep(10 * time.Millisecond)
	}
	num := func(b []byte) int {
		n, err := strconv.Atoi(strings.TrimSpace(strings.TrimRight(string(b), "\x00")))
		if err != nil {
			t.Fatalf("not a number: %q", b)
		}
		return n
	}
	for i := range 6 {
		time.Sleep(30 * time.Millisecond)
		r, err := gc.CreateVolumeGroupSnapshot(ctx, &csi.CreateVolumeGroupSnapshotRequest{Name: fmt.Sprintf("g%d", i), SourceVolumeIds: []string{a, b}})
		if err != nil {
			t.Fatal(err)
		}
		seq := map[string]int{}
		for _, s := range r.GetGroupSnapshot().GetSnapshots() {
			p := filepath.Join(o.DataRoot, "snapshots", s.GetSnapshotId())
			var data []byte
			if s.GetSourceVolumeId() == a {
				data, err = os.ReadFile(filepath.Join(p, "seq"))
			} else {
				data, err = os.ReadFile(p + ".img")
				if len(data) > 16 {
					data = data[:16]
				}
			}
			if err != nil {
				t.Fatal(err)
			}
			seq[s.GetSourceVolumeId()] = num(data)
		}
		if seq[b] != seq[a] && seq[b] != seq[a]-1 {
			t.Errorf("group %d: directory volume at %d, block volume at %d; the block volume must be at the directory's number or the one before", i, seq[a], seq[b])
		}
		t.Logf("group %d: directory %d, block %d", i, seq[a], seq[b])
	}

	// A pod left frozen by a killed driver (its record written, the pod
	// frozen) is thawed at the next start.
	freezer := filepath.Dir(pod.Containers[len(pod.Containers)-1])
	state := "freezer.state"
	if err := os.WriteFile(filepath.Join(o.DataRoot, "frozen", "pod-"+pod.UID), []byte(freezer), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(freezer, state), []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	in.Stop(t)
	in = testdriver.StartWith(t, o)
	if got, _ := os.ReadFile(filepath.Join(freezer, state)); strings.TrimSpace(string(got)) != "THAWED" {
		t.Errorf("after the restart the pod's freezer.state is %q, want THAWED", got)
	}
	if _, err := os.Stat(filepath.Join(o.DataRoot, "frozen", "pod-"+pod.UID)); !os.IsNotExist(err) {
		t.Errorf("the freeze record is still there: %v", err)
	}
	pod.Kill(t)
	// The kubelet's teardown order: the pod's device map first, then the
	// unpublish, then the unstage (which refuses a device still mapped).
	if err := unix.Unmount(mapped, 0); err != nil {
		t.Error(err)
	}
	for id, target := range map[string]string{a: pubA, b: pubB} {
		if _, err := in.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Error(err)
		}
	}
	if _, err := in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: a, StagingTargetPath: filepath.Join(dir, "files-stage")}); err != nil {
		t.Error(err)
	}
	if _, err := in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: b, StagingTargetPath: filepath.Join(dir, "device-stage")}); err != nil {
		t.Error(err)
	}
}
