// Package image checks what the container image relies on: the binary the
// Dockerfile builds (`make static`, the same command) is static and serves
// volumes from an otherwise empty root filesystem — no shell, no mount(8),
// no losetup, no btrfs-progs — for directory and raw block volumes. No Docker
// engine runs here, so the test runs the binary in a chroot holding only
// itself, /etc/passwd and the kernel filesystems a container runtime
// provides (/proc, /sys, /dev).
package image

import (
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

func TestStaticBinaryServesVolumesOnEmptyUserland(t *testing.T) {
	testdriver.RequireRoot(t)
	root := clustertest.Root(t)
	makeTarget(t, root, "static")
	bin := filepath.Join(root, "_output", "static", "localdir-csi")

	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatal("the image binary has an ELF interpreter: it is not static")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Fatalf("the image binary needs shared libraries %v", libs)
	}
	f.Close()

	// The root filesystem of the "container": like a container runtime's
	// rootfs it is a mount point of its own.
	chroot := testdriver.TempDir(t)
	if err := unix.Mount(chroot, chroot, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(chroot, unix.MNT_DETACH) })
	for _, d := range []string{"proc", "sys", "dev", "etc", "data", "stage", "pods"} {
		if err := os.Mkdir(filepath.Join(chroot, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chroot, "localdir-csi"), raw, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(chroot, "etc", "passwd"), []byte("root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"proc", "sys", "dev"} {
		target := filepath.Join(chroot, d)
		if err := unix.Mount("/"+d, target, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(target, unix.MNT_DETACH) })
	}
	for _, tool := range []string{"sh", "mount", "losetup", "btrfs", "umount"} {
		if _, err := os.Stat(filepath.Join(chroot, "bin", tool)); err == nil {
			t.Fatalf("%s present in the test root", tool)
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "/localdir-csi", "--mode=all", "--endpoint=unix:///csi.sock",
		"--data-root=/data", "--node-id=image-test", "--capacity=1Gi")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: chroot}
	cmd.Dir = "/"
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	sock := filepath.Join(chroot, "csi.sock")
	for deadline := time.Now().Add(15 * time.Second); ; {
		if fi, err := os.Stat(sock); err == nil && fi.Mode()&os.ModeSocket != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver did not start in the empty root:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc, nc := csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	bg := context.Background()

	// A filesystem volume and a raw block volume, staged and published:
	// bind mounts, loop devices, all from syscalls.
	for _, block := range []bool{false, true} {
		capab := &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
		target := "/pods/mnt"
		if block {
			capab.AccessType = &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}}
			target = "/pods/blk"
		} else {
			capab.AccessType = &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}
		}
		var vol *csi.CreateVolumeResponse
		for deadline := time.Now().Add(5 * time.Second); ; {
			vol, err = cc.CreateVolume(bg, &csi.CreateVolumeRequest{Name: target, VolumeCapabilities: []*csi.VolumeCapability{capab},
				CapacityRange: &csi.CapacityRange{RequiredBytes: 8 << 20}})
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("CreateVolume (block=%v): %v\n%s", block, err, logs.String())
		}
		id := vol.GetVolume().GetVolumeId()
		if _, err := nc.NodeStageVolume(bg, &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: "/stage", VolumeCapability: capab}); err != nil {
			t.Fatalf("NodeStageVolume (block=%v): %v\n%s", block, err, logs.String())
		}
		if _, err := nc.NodePublishVolume(bg, &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: "/stage", TargetPath: target, VolumeCapability: capab}); err != nil {
			t.Fatalf("NodePublishVolume (block=%v): %v\n%s", block, err, logs.String())
		}
		hostTarget := filepath.Join(chroot, target)
		if block {
			var st unix.Stat_t
			if err := unix.Stat(hostTarget, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
				t.Fatalf("published block target is not a device: %v", err)
			}
		} else {
			if err := os.WriteFile(filepath.Join(hostTarget, "f"), []byte("x"), 0o644); err != nil {
				t.Fatalf("write through the published volume: %v", err)
			}
			if _, err := os.Stat(filepath.Join(chroot, "data", "volumes", id, "f")); err != nil {
				t.Fatalf("the write did not land in the volume: %v", err)
			}
		}
		if _, err := nc.NodeUnpublishVolume(bg, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.NodeUnstageVolume(bg, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: "/stage"}); err != nil {
			t.Fatal(err)
		}
		if _, err := cc.DeleteVolume(bg, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume (block=%v): %v", block, err)
		}
	}
	out, _ := exec.Command("losetup", "-a").Output()
	if strings.Contains(string(out), chroot) {
		t.Fatalf("loop device left attached: %s", out)
	}
}

// makeTarget runs `make -s target` in the repository at root.
func makeTarget(t *testing.T, root, target string) {
	t.Helper()
	cmd := exec.Command("make", "-s", target)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make %s: %v\n%s", target, err, out)
	}
}
