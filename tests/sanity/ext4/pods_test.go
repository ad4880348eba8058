package ext4

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/tests/testcgroup"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

func blockCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
}

// forPod creates a volume with capability c and mutable parameters mut,
// stages it and publishes it below dir for the pod with uid ("": none), as
// the kubelet does with podInfoOnMount; it returns the volume's id and target
// path (unpublished and unstaged when the test ends).
func forPod(t *testing.T, in *testdriver.Instance, dir, name string, c *csi.VolumeCapability, uid string, mut map[string]string) (string, string) {
	t.Helper()
	ctx := context.Background()
	r, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{c},
		CapacityRange: &csi.CapacityRange{RequiredBytes: 32 << 20}, MutableParameters: mut})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	stage, target := filepath.Join(dir, name+"-stage"), filepath.Join(dir, name+"-pub")
	if err := os.MkdirAll(stage, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Node.NodeStageVolume(ctx, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: stage, VolumeCapability: c}); err != nil {
		t.Fatal(err)
	}
	var vc map[string]string
	if uid != "" {
		vc = map[string]string{"csi.storage.k8s.io/pod.uid": uid}
	}
	if _, err := in.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: stage, TargetPath: target, VolumeCapability: c,
		VolumeContext: vc}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = in.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
		_, _ = in.Node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: stage})
	})
	return id, target
}

// devNum is "maj:min" of the device node at p.
func devNum(t *testing.T, p string) string {
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev))
}

// rule is the throttle rule of cgroup dir for device num in file (a v1
// blkio.throttle file such as "write_bps_device"), "" when there is none.
// On cgroup v2 it reads the matching key of dir's io.max ("max": none).
func rule(t *testing.T, dir, file, num string) string {
	v2key := map[string]string{"read_bps_device": "rbps", "write_bps_device": "wbps", "read_iops_device": "riops", "write_iops_device": "wiops"}[file]
	name := "blkio.throttle." + file
	if _, err := os.Stat(filepath.Join(dir, "io.max")); err == nil {
		name = "io.max"
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 0 || f[0] != num {
			continue
		}
		if name == "io.max" {
			for _, kv := range f[1:] {
				if v, ok := strings.CutPrefix(kv, v2key+"="); ok && v != "max" {
					return v
				}
			}
			return ""
		}
		if len(f) == 2 {
			return f[1]
		}
	}
	return ""
}

// Per-volume I/O limits (mutable parameters) on a raw block volume used by
// a pod: set on its container's cgroup at publish (cgroup v1), they slow
// the container's direct writes to the device to the limit; a
// VolumeAttributesClass change re-applies them to the running pod, a
// container started later gets them too, and unpublish removes them. A
// directory volume cannot take them, nor a rate that is not a number.
func TestIOLimits(t *testing.T) {
	in, _, dir := startDir(t)
	ctx := context.Background()
	pod := testcgroup.NewPod(t, "3f1c7a52-1d2e-4c11-9a50-0000000000a1")
	podDir, ctr := filepath.Dir(pod.Containers[0]), pod.Containers[0]
	if pod.V2() {
		// v2: the pod's io.max holds the limits for all its containers.
		podDir, ctr = "", podDir
	}
	id, target := forPod(t, in, dir, "raw", blockCap(), pod.UID, map[string]string{"writeBytesPerSecond": "1Mi"})
	num := devNum(t, target)
	if got := rule(t, ctr, "write_bps_device", num); got != "1048576" {
		t.Errorf("after publish: the container's write_bps_device for %s = %q, want 1048576", num, got)
	}
	// v1: the pod's own cgroup holds no process and gets no rule (a rule
	// there kept its containers' rules from working, pkg/volume/cgroup).
	if got := ""; podDir != "" {
		if got = rule(t, podDir, "write_bps_device", num); got != "" {
			t.Errorf("after publish: the pod's own write_bps_device for %s = %q, want none", num, got)
		}
	}
	start := time.Now()
	if err := pod.Start(t, "dd", "if=/dev/zero", "of="+target, "bs=64k", "count=32", "oflag=direct").Wait(); err != nil {
		t.Fatalf("dd in the pod: %v", err)
	}
	if took := time.Since(start); took < 900*time.Millisecond {
		t.Errorf("the pod wrote 2 MiB directly in %s under a 1 MiB/s limit", took)
	}

	if _, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: map[string]string{"writeBytesPerSecond": "0", "readIOPS": "200"}}); err != nil {
		t.Fatal(err)
	}
	if got, iops := rule(t, ctr, "write_bps_device", num), rule(t, ctr, "read_iops_device", num); got != "" || iops != "200" {
		t.Errorf("after the modify: write_bps %q (want none), read_iops %q (want 200)", got, iops)
	}
	checked := []string{ctr}
	if !pod.V2() {
		// v1: a container started later needs the rule of its own.
		late := filepath.Join(podDir, "late")
		if err := os.Mkdir(late, 0o755); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for rule(t, late, "read_iops_device", num) != "200" {
			if time.Now().After(deadline) {
				t.Fatal("a container started after publish never got the volume's limit")
			}
			time.Sleep(10 * time.Millisecond)
		}
		checked = append(checked, late)
	}

	if _, err := in.Node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	for _, d := range checked {
		if got := rule(t, d, "read_iops_device", num); got != "" {
			t.Errorf("after unpublish: %s read_iops_device = %q", d, got)
		}
	}

	img, imgTarget := forPod(t, in, dir, "img", capOf("ext4"), pod.UID, map[string]string{"readBytesPerSecond": "2Mi"})
	var st unix.Stat_t
	if err := unix.Stat(imgTarget, &st); err != nil {
		t.Fatal(err)
	}
	if got := rule(t, ctr, "read_bps_device", fmt.Sprintf("%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev))); got != strconv.Itoa(2<<20) {
		t.Errorf("ext4 volume %s: read_bps_device of its loop device = %q, want %d", img, got, 2<<20)
	}

	for _, tc := range []struct {
		name string
		c    *csi.VolumeCapability
		mut  map[string]string
	}{
		{"dir", capOf(""), map[string]string{"writeIOPS": "10"}},
		{"bad", blockCap(), map[string]string{"writeIOPS": "fast"}},
		{"negative", blockCap(), map[string]string{"readBytesPerSecond": "-1"}},
	} {
		_, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: tc.name, VolumeCapabilities: []*csi.VolumeCapability{tc.c}, MutableParameters: tc.mut})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s %v: %v, want INVALID_ARGUMENT", tc.name, tc.mut, err)
		}
	}
	if _, err := in.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(dir, "raw-stage"), TargetPath: target,
		VolumeCapability: blockCap(), VolumeContext: map[string]string{"csi.storage.k8s.io/pod.uid": "../../etc"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a pod uid with slashes: %v, want INVALID_ARGUMENT", err)
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
	in, o, dir := startDir(t)
	gc := csi.NewGroupControllerClient(in.Conn)
	ctx := context.Background()
	pod := testcgroup.NewPod(t, "3f1c7a52-1d2e-4c11-9a50-0000000000b2")
	a, pubA := forPod(t, in, dir, "files", capOf(""), pod.UID, nil)
	b, pubB := forPod(t, in, dir, "device", blockCap(), pod.UID, nil)
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
