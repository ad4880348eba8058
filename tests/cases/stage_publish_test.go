package cases

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C26: a capability the volume cannot serve is FAILED_PRECONDITION; mount
// flags reach the target's mount (and are enforced); an unknown flag is
// INVALID_ARGUMENT and leaves nothing mounted; ValidateVolumeCapabilities
// leaves confirmed unset for blk and is NOT_FOUND for an unknown volume.
//
// Not covered here (mount volumes only): publishing a block volume with mnt
// (the other direction) belongs to the raw block feature.
func TestC26CapabilityAndMountFlags(t *testing.T) {
	in := testdriver.Start(t, nil)
	dir := in.Dir
	x := createVolume(t, in, "c26", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(dir, "S"))
	stage(t, in, x, staging)

	t.Run("blk capability", func(t *testing.T) {
		tb := filepath.Join(dir, "TB")
		_, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
			VolumeId: x, StagingTargetPath: staging, TargetPath: tb, VolumeCapability: csitest.BlkCap(),
		})
		csitest.CodeIs(t, err, codes.FailedPrecondition, "NodePublishVolume mount volume as blk")
		assertMountCount(t, tb, 0)
		csitest.AssertGone(t, tb)

		s2 := csitest.Mkdir(t, filepath.Join(dir, "SB"))
		_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: s2, VolumeCapability: csitest.BlkCap()})
		csitest.CodeIs(t, err, codes.FailedPrecondition, "NodeStageVolume mount volume as blk")
		assertMountCount(t, s2, 0)
	})

	t.Run("noexec,nodev", func(t *testing.T) {
		plain := filepath.Join(dir, "T0")
		target := filepath.Join(dir, "T")
		publish(t, in, x, staging, plain)
		publish(t, in, x, staging, target, "noexec", "nodev")
		// Repeating the publish with the same flags is OK and adds nothing.
		publish(t, in, x, staging, target, "noexec", "nodev")

		plainOpts, opts := mountOptions(t, plain), mountOptions(t, target)
		for _, f := range []string{"noexec", "nodev"} {
			if slices.Contains(plainOpts, f) {
				t.Fatalf("precondition: the data root's filesystem is already %s (%v); the flag cannot be told apart", f, plainOpts)
			}
			if !slices.Contains(opts, f) {
				t.Errorf("%s: mount options %v lack %s", target, opts, f)
			}
		}

		// The flags are enforced, not only shown: a script runs through the
		// plain mount and not through the noexec one; a device node opens
		// through the plain mount and not through the nodev one.
		writeFileSynced(t, filepath.Join(volDir(in, x), "run.sh"), []byte("#!/bin/sh\nexit 0\n"))
		if err := os.Chmod(filepath.Join(volDir(in, x), "run.sh"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := runRetryingTxtBsy(filepath.Join(plain, "run.sh")); err != nil {
			t.Errorf("script on the plain mount: %v", err)
		}
		if err := runRetryingTxtBsy(filepath.Join(target, "run.sh")); !errors.Is(err, syscall.EACCES) {
			t.Errorf("script on the noexec mount: got %v, want permission denied", err)
		}
		if err := unix.Mknod(filepath.Join(volDir(in, x), "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			t.Fatal(err)
		}
		if f, err := os.OpenFile(filepath.Join(plain, "null"), os.O_WRONLY, 0); err != nil {
			t.Errorf("device node on the plain mount: %v", err)
		} else {
			f.Close()
		}
		if f, err := os.OpenFile(filepath.Join(target, "null"), os.O_WRONLY, 0); !errors.Is(err, syscall.EACCES) {
			t.Errorf("device node on the nodev mount: got %v, want permission denied", err)
			if f != nil {
				f.Close()
			}
		}

		// The same target with other flags is a different publish.
		_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(x, staging, target))
		csitest.CodeIs(t, err, codes.AlreadyExists, "NodePublishVolume at T without the flags")
		assertMountCount(t, target, 1)
		if got := mountOptions(t, target); !slices.Equal(got, opts) {
			t.Errorf("mount options changed %v -> %v", opts, got)
		}

		unpublish(t, in, x, target)
		unpublish(t, in, x, plain)
	})

	t.Run("unknown flag", func(t *testing.T) {
		for _, flags := range [][]string{{"no-such-opt"}, {"noexec", "no-such-opt"}, {"nodev,no-such-opt"}, {"noatime", "relatime"}} {
			t3 := filepath.Join(dir, "T3")
			_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(x, staging, t3, flags...))
			csitest.CodeIs(t, err, codes.InvalidArgument, "NodePublishVolume with flags "+filepath.Join(flags...))
			assertMountCount(t, t3, 0)
			csitest.AssertGone(t, t3)

			s3 := csitest.Mkdir(t, filepath.Join(dir, "S3"))
			_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: s3, VolumeCapability: csitest.MntCap(flags...)})
			csitest.CodeIs(t, err, codes.InvalidArgument, "NodeStageVolume with flags "+filepath.Join(flags...))
			assertMountCount(t, s3, 0)

			// Refused already at CreateVolume (a StorageClass's
			// mountOptions), and nothing is created.
			name := "c26-flags-" + filepath.Base(filepath.Join(flags...))
			_, err = in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
				Name: name, CapacityRange: csitest.Range(4*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap(flags...)},
			})
			csitest.CodeIs(t, err, codes.InvalidArgument, "CreateVolume with flags "+filepath.Join(flags...))
		}
		list, err := in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
		if csitest.CodeIs(t, err, codes.OK, "ListVolumes") && len(list.GetEntries()) != 1 {
			t.Errorf("CreateVolume with unknown flags created volumes: %d listed, want 1", len(list.GetEntries()))
		}
		// Flags a bind mount applies, or accepts without effect, are fine.
		v, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name: "c26-good-flags", CapacityRange: csitest.Range(4*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap("noatime", "rw,nodev")},
		})
		if csitest.CodeIs(t, err, codes.OK, "CreateVolume with flags noatime, rw,nodev") {
			deleteVolume(t, in, v.GetVolume().GetVolumeId())
		}
	})

	t.Run("ValidateVolumeCapabilities", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			id        string
			caps      []*csi.VolumeCapability
			want      codes.Code
			confirmed bool
		}{
			{"mnt", x, []*csi.VolumeCapability{csitest.MntCap()}, codes.OK, true},
			{"blk", x, []*csi.VolumeCapability{csitest.BlkCap()}, codes.OK, false},
			{"mnt and blk", x, []*csi.VolumeCapability{csitest.MntCap(), csitest.BlkCap()}, codes.OK, false},
			{"unknown volume", "nope", []*csi.VolumeCapability{csitest.MntCap()}, codes.NotFound, false},
			{"unknown well-formed id", unknownID, []*csi.VolumeCapability{csitest.MntCap()}, codes.NotFound, false},
		} {
			resp, err := in.Controller.ValidateVolumeCapabilities(csitest.Ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: tc.id, VolumeCapabilities: tc.caps})
			csitest.CodeIs(t, err, tc.want, "ValidateVolumeCapabilities "+tc.name)
			if err != nil {
				continue
			}
			if got := resp.GetConfirmed() != nil; got != tc.confirmed {
				t.Errorf("ValidateVolumeCapabilities %s: confirmed set = %v, want %v (message %q)", tc.name, got, tc.confirmed, resp.GetMessage())
			}
			if !tc.confirmed && resp.GetMessage() == "" {
				t.Errorf("ValidateVolumeCapabilities %s: not confirmed and no message saying why", tc.name)
			}
		}
	})

	assertShowsVolume(t, in, staging, x)
	unstage(t, in, x, staging)
	deleteVolume(t, in, x)
}

// runRetryingTxtBsy executes p. ETXTBSY (a forked child elsewhere in this
// multi-threaded test binary still holding the script's write fd for a
// moment) is retried.
func runRetryingTxtBsy(p string) error {
	var err error
	for range 50 {
		err = exec.Command(p).Run()
		if !errors.Is(err, syscall.ETXTBSY) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
	return err
}

// C27: NodeStageVolume is idempotent for the same arguments, ALREADY_EXISTS
// for other flags or a foreign mount (which it leaves alone); publish
// without stage is FAILED_PRECONDITION; unstage of an unstaged volume is OK.
func TestC27NodeStageIdempotencyAndMismatch(t *testing.T) {
	in := testdriver.Start(t, nil)
	dir := in.Dir
	x := createVolume(t, in, "c27-x", 4*csitest.Mi).GetVolumeId()
	y := createVolume(t, in, "c27-y", 4*csitest.Mi).GetVolumeId()
	z := createVolume(t, in, "c27-z", 4*csitest.Mi).GetVolumeId()
	s := csitest.Mkdir(t, filepath.Join(dir, "S"))

	t.Run("stage twice", func(t *testing.T) {
		stage(t, in, x, s)
		stage(t, in, x, s)
		assertMountCount(t, s, 1)
	})

	t.Run("stage with other flags", func(t *testing.T) {
		before := mountOptions(t, s)
		if slices.Contains(before, "noatime") {
			t.Fatalf("precondition: the staging mount is already noatime (%v)", before)
		}
		for _, flags := range [][]string{{"noatime"}, {"noexec"}, {"ro"}} {
			_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: s, VolumeCapability: csitest.MntCap(flags...)})
			csitest.CodeIs(t, err, codes.AlreadyExists, "NodeStageVolume X with "+flags[0])
			assertMountCount(t, s, 1)
			if got := mountOptions(t, s); !slices.Equal(got, before) {
				t.Errorf("staging mount options changed %v -> %v", before, got)
			}
		}
	})

	t.Run("stage another volume at the same path", func(t *testing.T) {
		_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: y, StagingTargetPath: s, VolumeCapability: csitest.MntCap()})
		csitest.CodeIs(t, err, codes.AlreadyExists, "NodeStageVolume Y where X is staged")
		assertShowsVolume(t, in, s, x)
	})

	t.Run("stage onto a foreign tmpfs", func(t *testing.T) {
		s2 := csitest.Mkdir(t, filepath.Join(dir, "S2"))
		if err := unix.Mount("t", s2, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		defer func() {
			if err := unix.Unmount(s2, 0); err != nil {
				t.Errorf("umount tmpfs: %v", err)
			}
		}()
		writeFileSynced(t, filepath.Join(s2, "marker"), []byte("tmpfs"))
		for range 2 {
			_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: y, StagingTargetPath: s2, VolumeCapability: csitest.MntCap()})
			csitest.CodeIs(t, err, codes.AlreadyExists, "NodeStageVolume Y onto a tmpfs")
		}
		ms := csitest.MountsAt(t, s2)
		if len(ms) != 1 || ms[0].FSType != "tmpfs" || ms[0].Source != "t" {
			t.Errorf("%s: want only the tmpfs mounted, got %d mounts", s2, len(ms))
		}
		csitest.AssertFileBytes(t, filepath.Join(s2, "marker"), []byte("tmpfs"))
		if got := csitest.DirNames(t, volDir(in, y)); len(got) != 0 {
			t.Errorf("volume Y got entries %v", got)
		}
	})

	t.Run("publish a volume never staged", func(t *testing.T) {
		s3 := csitest.Mkdir(t, filepath.Join(dir, "S3"))
		target := filepath.Join(dir, "TZ")
		for _, staging := range []string{s3, s, filepath.Join(dir, "no-such-staging")} {
			_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(z, staging, target))
			csitest.CodeIs(t, err, codes.FailedPrecondition, "NodePublishVolume of unstaged Z with staging "+staging)
			assertMountCount(t, target, 0)
			csitest.AssertGone(t, target)
		}
	})

	t.Run("unstage what is not staged", func(t *testing.T) {
		s4 := csitest.Mkdir(t, filepath.Join(dir, "S4"))
		for _, staging := range []string{s4, filepath.Join(dir, "no-such-staging")} {
			for range 2 {
				_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: z, StagingTargetPath: staging})
				csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume of unstaged Z at "+staging)
			}
		}
		assertDir(t, s4)
		assertMountCount(t, s4, 0)
		// Unknown to the driver altogether: still OK.
		_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: unknownID, StagingTargetPath: s4})
		csitest.CodeIs(t, err, codes.OK, "NodeUnstageVolume of an unknown volume")
	})

	unstage(t, in, x, s)
	unstage(t, in, x, s)
	for _, id := range []string{x, y, z} {
		deleteVolume(t, in, id)
	}
	assertListMatchesDisk(t, in)
}
