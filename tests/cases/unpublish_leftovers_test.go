package cases

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C06: NodeUnpublishVolume answers OK for a target that is published (twice),
// one whose mount was removed by hand, and one that never existed; it removes
// the directories it created and never fails on EINVAL/ENOENT.
func TestC06UnpublishUnmountedOrMissingPath(t *testing.T) {
	in := testdriver.Start(t, nil)
	x := createVolume(t, in, "c06", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(in.Dir, "staging"))
	stage(t, in, x, staging)
	data := csitest.RandomBytes(6, 4096)
	writeFileSynced(t, filepath.Join(volDir(in, x), "keep"), data)

	unpub := func(t *testing.T, target string) {
		t.Helper()
		_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: target})
		csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume "+target)
		assertMountCount(t, target, 0)
		csitest.AssertGone(t, target)
	}

	t.Run("1 published, unpublished twice", func(t *testing.T) {
		target := filepath.Join(in.Dir, "T")
		publish(t, in, x, staging, target)
		csitest.AssertFileBytes(t, filepath.Join(target, "keep"), data)
		unpub(t, target)
		unpub(t, target)
	})

	t.Run("2 unmounted by hand", func(t *testing.T) {
		target := filepath.Join(in.Dir, "T2")
		publish(t, in, x, staging, target)
		if err := unix.Unmount(target, 0); err != nil {
			t.Fatalf("umount %s: %v", target, err)
		}
		assertMountCount(t, target, 0)
		assertDir(t, target)
		unpub(t, target)
		unpub(t, target)
	})

	t.Run("3 never existed", func(t *testing.T) {
		unpub(t, filepath.Join(in.Dir, "T3"))
		unpub(t, filepath.Join(in.Dir, "no-such-parent", "T3"))
	})

	t.Run("empty directory that was never mounted", func(t *testing.T) {
		target := csitest.Mkdir(t, filepath.Join(in.Dir, "T4"))
		unpub(t, target)
	})

	t.Run("stacked mounts", func(t *testing.T) {
		// Something else mounted on top of the target (a tmpfs here) is
		// removed too: the driver must not leave the target half mounted.
		target := filepath.Join(in.Dir, "T5")
		publish(t, in, x, staging, target)
		if err := unix.Mount("c06", target, "tmpfs", 0, "size=1m"); err != nil {
			t.Fatal(err)
		}
		assertMountCount(t, target, 2)
		unpub(t, target)
	})

	// The volume's data and the staging mount are untouched by all of it.
	assertShowsVolume(t, in, staging, x)
	csitest.AssertFileBytes(t, filepath.Join(volDir(in, x), "keep"), data)
	unstage(t, in, x, staging)
	deleteVolume(t, in, x)
}

// C07: NodeUnpublishVolume does not need the driver to know the volume.
//
// Not covered here (mount volumes only): the ephemeral half of the case (two
// concurrent unpublishes of the inline volume csi-e1, then a third, all OK)
// belongs to the ephemeral inline volumes feature. The same concurrency is
// exercised below on a persistent volume, where the per-id lock may answer
// ABORTED to the loser (STYLE.md §4) or make it wait.
func TestC07UnpublishUnknownVolume(t *testing.T) {
	in := testdriver.Start(t, nil)
	dir := in.Dir

	t.Run("concurrent unpublish, then a third", func(t *testing.T) {
		x := createVolume(t, in, "c07-x", 4*csitest.Mi).GetVolumeId()
		staging := csitest.Mkdir(t, filepath.Join(dir, "S1"))
		target := filepath.Join(dir, "T")
		stage(t, in, x, staging)
		publish(t, in, x, staging, target)

		var wg sync.WaitGroup
		errs := make([]error, 2)
		start := make(chan struct{})
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, errs[i] = in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: target})
			}()
		}
		close(start)
		wg.Wait()
		oks := 0
		for i, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				oks++
			case codes.Aborted:
			default:
				t.Errorf("concurrent unpublish %d: got %s (%v), want OK (or ABORTED while the other runs)", i, status.Code(err), err)
			}
		}
		if oks == 0 {
			t.Errorf("neither concurrent unpublish succeeded")
		}
		unpublish(t, in, x, target)
		unstage(t, in, x, staging)
		deleteVolume(t, in, x)
	})

	t.Run("record removed from the state while stopped", func(t *testing.T) {
		x := createVolume(t, in, "c07-t4", 4*csitest.Mi).GetVolumeId()
		staging := csitest.Mkdir(t, filepath.Join(dir, "S4"))
		target := filepath.Join(dir, "T4")
		stage(t, in, x, staging)
		publish(t, in, x, staging, target)
		writeFileSynced(t, filepath.Join(target, "f"), []byte("c07"))

		in.Stop(t)
		st, err := state.Open(filepath.Join(in.Opts.DataRoot, state.FileName))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Update(func(tx *state.Tx) error { return tx.DeleteVolume(x) }); err != nil {
			t.Fatal(err)
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		in = testdriver.StartWith(t, in.Opts)

		if ids := listIDs(t, in.Controller); len(ids) != 0 {
			t.Fatalf("ListVolumes after removing the record = %v, want none", ids)
		}
		// The driver must not have removed the mounted, now unclaimed data.
		assertShowsVolume(t, in, target, x)
		for i := range 2 {
			_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: target})
			csitest.CodeIs(t, err, codes.OK, fmt.Sprintf("NodeUnpublishVolume #%d of a volume the driver no longer knows", i+1))
			assertMountCount(t, target, 0)
			csitest.AssertGone(t, target)
		}
		for i := range 2 {
			_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: x, StagingTargetPath: staging})
			csitest.CodeIs(t, err, codes.OK, fmt.Sprintf("NodeUnstageVolume #%d of a volume the driver no longer knows", i+1))
			assertMountCount(t, staging, 0)
			assertDir(t, staging) // the CO's directory stays
		}
		csitest.AssertFileBytes(t, filepath.Join(volDir(in, x), "f"), []byte("c07"))
	})
}

// C11: after a "reboot" (every mount gone, directories left, driver
// restarted) stage and publish mount again instead of trusting state, and
// the data written before is visible; unpublish instead removes the
// directory.
func TestC11LeftoverMountPointsAfterReboot(t *testing.T) {
	for _, run := range []string{"publish again", "unpublish"} {
		t.Run(run, func(t *testing.T) {
			in := testdriver.Start(t, nil)
			x := createVolume(t, in, "c11", 4*csitest.Mi).GetVolumeId()
			staging := csitest.Mkdir(t, filepath.Join(in.Dir, "S"))
			target := filepath.Join(in.Dir, "T")
			data := csitest.RandomBytes(11, int(128*csitest.Ki))
			stage(t, in, x, staging)
			publish(t, in, x, staging, target)
			writeFileSynced(t, filepath.Join(target, "f"), data)

			// Simulated reboot: the mounts vanish, the directories stay, the
			// driver starts again on the same data root.
			in.Stop(t)
			for _, p := range []string{target, staging} {
				if err := unix.Unmount(p, 0); err != nil {
					t.Fatalf("umount %s: %v", p, err)
				}
			}
			dir := in.Dir
			in = testdriver.StartWith(t, in.Opts)
			in.Dir = dir
			assertDir(t, target)
			assertMountCount(t, target, 0)

			switch run {
			case "publish again":
				// Publishing before staging again must see that the staging
				// path no longer holds the volume.
				_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(x, staging, target))
				csitest.CodeIs(t, err, codes.FailedPrecondition, "NodePublishVolume while the staging mount is gone")
				assertMountCount(t, target, 0)

				stage(t, in, x, staging)
				publish(t, in, x, staging, target)
				csitest.AssertFileBytes(t, filepath.Join(target, "f"), data)
				unpublish(t, in, x, target)
				unstage(t, in, x, staging)
			case "unpublish":
				unpublish(t, in, x, target)
				unstage(t, in, x, staging)
				assertDir(t, staging)
			}
			csitest.AssertFileBytes(t, filepath.Join(volDir(in, x), "f"), data)
			deleteVolume(t, in, x)
			assertListMatchesDisk(t, in)
		})
	}
}
