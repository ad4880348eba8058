package datacases

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

	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testcgroup"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

func mountCaps() []*csi.VolumeCapability {
	return []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}}
}

// A VolumeAttributesClass's parameters over CSI on a btrfs data root:
// CreateVolume's mutable_parameters are in effect on the new volume's data
// (its btrfs compression property, its root's mode), ControllerModifyVolume
// changes only the keys it names, and parameters a volume cannot take are
// INVALID_ARGUMENT and change nothing.
func TestModifyVolume(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.DataRoot = filepath.Join(testfs.New(t, testfs.Btrfs, 1<<30), "data")
	o.Engine = "btrfs"
	in := testdriver.StartWith(t, o)
	ctx := context.Background()
	created, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "vac", VolumeCapabilities: mountCaps(),
		CapacityRange:     &csi.CapacityRange{RequiredBytes: 16 << 20},
		MutableParameters: map[string]string{"compression": "lzo", "dirMode": "0700"}})
	if err != nil {
		t.Fatal(err)
	}
	id := created.GetVolume().GetVolumeId()
	data := filepath.Join(o.DataRoot, "volumes", id)
	check := func(when, compression string, perm os.FileMode) {
		t.Helper()
		if got, err := engine.Compression(data); err != nil || got != compression {
			t.Errorf("%s: compression property %q (%v), want %q", when, got, err, compression)
		}
		if fi, err := os.Stat(data); err != nil || fi.Mode().Perm() != perm {
			t.Errorf("%s: mode of the volume's root %v (%v), want %o", when, fi.Mode().Perm(), err, perm)
		}
	}
	check("created with compression=lzo, dirMode=0700", "lzo", 0o700)
	if _, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id,
		MutableParameters: map[string]string{"compression": "zstd"}}); err != nil {
		t.Fatal(err)
	}
	check("modified to compression=zstd", "zstd", 0o700)
	for _, bad := range []map[string]string{{"compression": "brotli"}, {"iops": "100"}, {"dirMode": "0755", "compression": "gzip"}} {
		_, err := in.Controller.ControllerModifyVolume(ctx, &csi.ControllerModifyVolumeRequest{VolumeId: id, MutableParameters: bad})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("modify with %v: %v, want INVALID_ARGUMENT", bad, err)
		}
	}
	check("after refused modifies", "zstd", 0o700)
	_, err = in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: "image", CapacityRange: &csi.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4"}},
			AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		MutableParameters: map[string]string{"compression": "zstd"}})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("an ext4 image volume with compression=zstd: %v, want INVALID_ARGUMENT", err)
	}
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
	in, _, dir := startDirEngine(t)
	ctx := context.Background()
	pod := testcgroup.NewPod(t, "3f1c7a52-1d2e-4c11-9a50-0000000000a1")
	podDir, ctr := filepath.Dir(pod.Containers[0]), pod.Containers[0]
	if pod.V2() {
		// v2: the pod's io.max holds the limits for all its containers.
		podDir, ctr = "", podDir
	}
	id, target := forPod(t, in, dir, "raw", csitest.BlkCap(), pod.UID, map[string]string{"writeBytesPerSecond": "1Mi"})
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

	img, imgTarget := forPod(t, in, dir, "img", csitest.MntCapFS("ext4"), pod.UID, map[string]string{"readBytesPerSecond": "2Mi"})
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
		{"dir", csitest.MntCapFS(""), map[string]string{"writeIOPS": "10"}},
		{"bad", csitest.BlkCap(), map[string]string{"writeIOPS": "fast"}},
		{"negative", csitest.BlkCap(), map[string]string{"readBytesPerSecond": "-1"}},
	} {
		_, err := in.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{Name: tc.name, VolumeCapabilities: []*csi.VolumeCapability{tc.c}, MutableParameters: tc.mut})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("%s %v: %v, want INVALID_ARGUMENT", tc.name, tc.mut, err)
		}
	}
	if _, err := in.Node.NodePublishVolume(ctx, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(dir, "raw-stage"), TargetPath: target,
		VolumeCapability: csitest.BlkCap(), VolumeContext: map[string]string{"csi.storage.k8s.io/pod.uid": "../../etc"}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("a pod uid with slashes: %v, want INVALID_ARGUMENT", err)
	}
}

// dirMode on an image volume: the StorageClass's is its filesystem root's
// mode at stage, a VolumeAttributesClass's changes it where it is staged
// and wins at every later stage.
func TestImageDirMode(t *testing.T) {
	in, _, dir := startDirEngine(t)
	ctx := context.Background()
	c := csitest.MntCapFS("ext4")
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
