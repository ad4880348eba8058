package datacases

import (
	"slices"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// tmpfsRoot runs the driver on a 50 MiB tmpfs with a configured capacity
// far above it, so that the disk, not the capacity setting, runs out.
func tmpfsRoot(t *testing.T) *env {
	return start(t, testfs.Tmpfs, 50*csitest.Mi, func(o *driver.Options) { o.CapacityBytes = 1 << 30 })
}

// TestC12FailedCreateLeavesNothing: C12. On a 50 MiB disk, block volume A
// takes 40 MiB; a 20 MiB block volume "b" then fails with
// RESOURCE_EXHAUSTED and leaves no image file, no loop device and no record,
// and GetCapacity does not change. After A is deleted the retry of "b"
// succeeds with a single backing file.
func TestC12FailedCreateLeavesNothing(t *testing.T) {
	e := tmpfsRoot(t)
	a := e.create("a", 40*csitest.Mi, true)
	avail := e.available()
	if avail >= 20*csitest.Mi {
		t.Fatalf("GetCapacity after a 40Mi block volume on a 50Mi disk: %d bytes available, want < 20Mi: the volume does not own its space", avail)
	}
	reqB := &csi.CreateVolumeRequest{Name: "b", CapacityRange: csitest.Range(20*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}}
	_, err := e.createReq(reqB)
	csitest.CodeIs(t, err, codes.ResourceExhausted, "CreateVolume b (20Mi) with 40Mi of 50Mi taken")
	e.assertVolumes(a.GetVolumeId())
	if l := loopDevsUnder(t, e.root); len(l) != 0 {
		t.Errorf("loop devices attached from the data root after the failed create: %v", l)
	}
	if got := e.available(); got != avail {
		t.Errorf("GetCapacity changed by a failed create: %d, was %d", got, avail)
	}

	e.deleteVolume(a.GetVolumeId())
	b, err := e.createReq(reqB)
	csitest.MustCode(t, err, codes.OK, "retry of CreateVolume b after deleting A")
	if b.GetCapacityBytes() != 20*csitest.Mi {
		t.Errorf("b: capacity %d, want 20Mi", b.GetCapacityBytes())
	}
	e.assertBacking(b.GetVolumeId(), true, 20*csitest.Mi)
	e.assertVolumes(b.GetVolumeId())
	// The retry is the same volume on a repeat.
	again, err := e.createReq(reqB)
	csitest.MustCode(t, err, codes.OK, "repeat of CreateVolume b")
	if again.GetVolumeId() != b.GetVolumeId() {
		t.Errorf("repeat of b returned %s, want %s", again.GetVolumeId(), b.GetVolumeId())
	}
	e.deleteVolume(b.GetVolumeId())
	e.assertVolumes()
}

// TestC12ConcurrentCreatesOverfillDisk: two 30 MiB block volumes created at
// once on a 50 MiB disk. Both may pass the capacity check before either
// allocates, so the loser can fail while allocating its image: exactly one
// succeeds, the other gets RESOURCE_EXHAUSTED, and nothing of it remains.
func TestC12ConcurrentCreatesOverfillDisk(t *testing.T) {
	e := tmpfsRoot(t)
	before := e.available()
	var wg sync.WaitGroup
	vols := make([]*csi.Volume, 2)
	errs := make([]error, 2)
	for i, name := range []string{"c1", "c2"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vols[i], errs[i] = e.createReq(&csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(30*csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}})
		}()
	}
	wg.Wait()
	codesGot := []codes.Code{status.Code(errs[0]), status.Code(errs[1])}
	slices.Sort(codesGot)
	if !slices.Equal(codesGot, []codes.Code{codes.OK, codes.ResourceExhausted}) {
		t.Fatalf("two 30Mi creates on a 50Mi disk: codes %v (%v, %v), want one OK and one ResourceExhausted", codesGot, errs[0], errs[1])
	}
	winner := vols[0]
	if errs[0] != nil {
		winner = vols[1]
	}
	e.assertBacking(winner.GetVolumeId(), true, 30*csitest.Mi)
	e.assertVolumes(winner.GetVolumeId())
	e.deleteVolume(winner.GetVolumeId())
	e.assertVolumes()
	// The state file may have grown by a page or two meanwhile.
	if got := e.available(); got < before-csitest.Mi {
		t.Errorf("GetCapacity after deleting everything: %d, want about %d as at the start: space was not returned", got, before)
	}
}
