package reliability

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// procClients starts the driver binary (all mode, dir engine) on dataRoot
// with the filesystem's size as its capacity, waits until it is ready
// (startProc), and returns it with its clients.
func procClients(t *testing.T, dir, dataRoot string) (*testdriver.Proc, csi.ControllerClient, csi.NodeClient) {
	t.Helper()
	p := startProc(t, dir, "--data-root="+dataRoot, "--capacity=0")
	return p.Proc, p.controller, p.node
}

// writeBlocks reports whether a small write into dir stays blocked for
// wait (the filesystem is frozen); the write goes on in the background and
// its result arrives on done.
func writeBlocks(dir string, wait time.Duration) (blocked bool, done <-chan error) {
	ch := make(chan error, 1)
	go func() {
		ch <- os.WriteFile(filepath.Join(dir, fmt.Sprintf("probe-%d", time.Now().UnixNano())), []byte("x"), 0o600)
	}()
	select {
	case err := <-ch:
		ch <- err
		return false, ch
	case <-time.After(wait):
		return true, ch
	}
}

// TestKillDuringImageSnapshotLeavesNothingFrozen: the driver is SIGKILLed
// while a snapshot of a staged ext4 image volume holds its filesystem
// frozen (on an ext4 data root the image is copied, so the freeze lasts
// the copy); the pod's writes block until the driver starts again, which
// thaws it (#12 items 4 and 5). A kill that missed the freeze is tried
// again with another delay.
func TestKillDuringImageSnapshotLeavesNothingFrozen(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	dataRoot := filepath.Join(testfs.New(t, testfs.Ext4, 2<<30), "data")
	p, ctl, node := procClients(t, dir, dataRoot)
	r, err := ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: "frozen", CapacityRange: csitest.Range(512*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS("ext4")},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	staging, target := csitest.Mkdir(t, filepath.Join(dir, "staging")), filepath.Join(dir, "target")
	if _, err := node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.MntCapFS("ext4")}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.MntCapFS("ext4")}); err != nil {
		t.Fatal(err)
	}
	// Never leave a test's filesystem frozen; the mounts of a failed run
	// are removed by TempDir's check.
	t.Cleanup(func() { _ = exec.Command("fsfreeze", "--unfreeze", staging).Run() })
	if n, err := csitest.FillUntilFull(t, target, 300*csitest.Mi); err != nil || n != 300*csitest.Mi {
		t.Fatalf("writing 300 MiB to copy: %d, %v", n, err)
	}
	for attempt := range 12 {
		delay := time.Duration(5+attempt*15) * time.Millisecond
		go func() {
			_, _ = ctl.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{SourceVolumeId: id, Name: fmt.Sprintf("s%d", attempt)})
		}()
		time.Sleep(delay)
		p.Kill()
		blocked, done := writeBlocks(target, time.Second)
		p, ctl, node = procClients(t, dir, dataRoot)
		if !blocked {
			continue // the kill missed the freeze: try another moment
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("the write blocked by the freeze failed after the restart: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the filesystem is still frozen 10 s after the driver restarted")
		}
		if blocked, _ := writeBlocks(target, time.Second); blocked {
			t.Fatal("a new write blocks after the restart: the filesystem is still frozen")
		}
		if ents, err := os.ReadDir(filepath.Join(dataRoot, "frozen")); err != nil || len(ents) != 0 {
			t.Fatalf("freeze records left after the restart: %v %v", ents, err)
		}
		t.Logf("killed %v into CreateSnapshot (attempt %d) with the filesystem frozen; the restart thawed it", delay, attempt+1)
		if _, err := node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatal("no kill landed while the filesystem was frozen in 12 attempts: the race this test needs never happened")
}
