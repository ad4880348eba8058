package datacases

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// tolerance is how far a move of available_capacity may be from the
// volume sizes: the state file's own pages, written at each commit, take
// filesystem blocks too.
const tolerance = 64 << 10

// capacitySetups are the data roots of the acceptance: the dir engine on ext4 and
// on XFS, btrfs, and raw block volumes (image files) on ext4.
var capacitySetups = []struct {
	name, fs, engine string
	block            bool
}{
	{"dir-on-ext4", testfs.Ext4, "dir", false},
	{"dir-on-xfs", testfs.XFSReflink, "dir", false},
	{"btrfs", testfs.Btrfs, "btrfs", false},
	{"image-on-ext4", testfs.Ext4, "dir", true},
}

func startCapacity(t *testing.T, fs, engine string) *testdriver.Instance {
	t.Helper()
	testdriver.RequireRoot(t)
	root := testfs.New(t, fs, 320*csitest.Mi)
	return testdriver.Start(t, func(o *driver.Options) {
		o.DataRoot = root + "/data"
		o.Engine = contract.Engine(engine)
		o.CapacityBytes = 0 // the filesystem's size: the free space decides
	})
}

func availableFor(t *testing.T, in *testdriver.Instance, block bool) int64 {
	t.Helper()
	r, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{
		VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
	})
	if err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	return r.GetAvailableCapacity()
}

// assertHoldsSize checks that the volume id of size bytes can hold its size: a block
// volume's image owns all its blocks; a mount volume takes size − 1 MiB
// (its own metadata needs a little) of data written to its directory.
func assertHoldsSize(t *testing.T, root, id string, size int64, block bool) {
	t.Helper()
	if block {
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(root, "block", id+".img"), &st); err != nil {
			t.Fatal(err)
		}
		if st.Blocks*512 < size {
			t.Fatalf("image of %d bytes owns %d bytes of disk", size, st.Blocks*512)
		}
		return
	}
	f, err := os.Create(filepath.Join(root, "volumes", id, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, csitest.Mi)
	for i := range buf {
		buf[i] = byte(i) | 1 // not zeros: no filesystem may skip them
	}
	for n := int64(0); n < size-csitest.Mi; n += csitest.Mi {
		if _, err := f.Write(buf); err != nil {
			t.Fatalf("writing the acknowledged volume failed after %d of %d bytes: %v", n, size, err)
		}
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("fsync of the filled volume: %v", err)
	}
}

func createSized(in *testdriver.Instance, t *testing.T, name string, size int64, block bool) (string, error) {
	r, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      csitest.Range(size, 0),
		VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(block)},
	})
	return r.GetVolume().GetVolumeId(), err
}

// moved checks that available_capacity went from before to after by want
// bytes (negative: down).
func moved(t *testing.T, what string, before, after, want int64) {
	t.Helper()
	t.Logf("%s: moved %d (want %d)", what, after-before, want)
	if d := after - before - want; d < -tolerance || d > tolerance {
		t.Errorf("%s: available_capacity moved by %d bytes (%d → %d), want %d (± %d)", what, after-before, before, after, want, tolerance)
	}
}

// TestCapacityMovesBySizes creates 3 × 10 MiB, deletes one twice, makes a
// create fail and creates 2 × 10 MiB at once, checking each time that
// available_capacity moved by exactly the sizes involved (#12, item 6).
func TestCapacityMovesBySizes(t *testing.T) {
	for _, s := range capacitySetups {
		t.Run(s.name, func(t *testing.T) {
			in := startCapacity(t, s.fs, s.engine)
			a := availableFor(t, in, s.block)
			if a < 100*csitest.Mi {
				t.Fatalf("available_capacity %d on a fresh 320 MiB filesystem", a)
			}
			var ids []string
			for i := range 3 {
				id, err := createSized(in, t, fmt.Sprintf("v%d", i), 10*csitest.Mi, s.block)
				if err != nil {
					t.Fatalf("create %d: %v", i, err)
				}
				ids = append(ids, id)
				b := availableFor(t, in, s.block)
				moved(t, fmt.Sprintf("create %d", i), a, b, -10*csitest.Mi)
				a = b
			}
			for i := range 2 {
				if _, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: ids[0]}); err != nil {
					t.Fatalf("delete %d: %v", i, err)
				}
				b := availableFor(t, in, s.block)
				moved(t, fmt.Sprintf("delete %d", i), a, b, []int64{10 * csitest.Mi, 0}[i])
				a = b
			}
			_, err := createSized(in, t, "too-big", a+csitest.Mi, s.block)
			csitest.MustCode(t, err, codes.ResourceExhausted, "create above available_capacity")
			b := availableFor(t, in, s.block)
			moved(t, "failed create", a, b, 0)
			a = b
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = createSized(in, t, fmt.Sprintf("c%d", i), 10*csitest.Mi, s.block)
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("concurrent create %d: %v", i, err)
				}
			}
			moved(t, "two concurrent creates", a, availableFor(t, in, s.block), -20*csitest.Mi)
		})
	}
}

// TestLastRoomGoesToOneCreate: with room for one volume of S bytes but not
// two, two concurrent CreateVolumes of S bytes get OK and
// RESOURCE_EXHAUSTED, and the volume that got OK can be filled to its size
// (#12, item 6).
func TestLastRoomGoesToOneCreate(t *testing.T) {
	for _, s := range capacitySetups {
		t.Run(s.name, func(t *testing.T) {
			in := startCapacity(t, s.fs, s.engine)
			size := availableFor(t, in, s.block)*3/5/csitest.Mi*csitest.Mi + csitest.Mi
			var wg sync.WaitGroup
			errs := make([]error, 2)
			ids := make([]string, 2)
			for i := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ids[i], errs[i] = createSized(in, t, fmt.Sprintf("last%d", i), size, s.block)
				}()
			}
			wg.Wait()
			ok := 0
			for i, err := range errs {
				switch status.Code(err) {
				case codes.OK:
					ok++
				case codes.ResourceExhausted:
				default:
					t.Fatalf("create %d of %d bytes: %v", i, size, err)
				}
			}
			if ok != 1 {
				t.Fatalf("%d of two concurrent %d-byte creates succeeded (errors %v), want exactly 1", ok, size, errs)
			}
			id := ids[0]
			if errs[0] != nil {
				id = ids[1]
			}
			assertHoldsSize(t, in.Opts.DataRoot, id, size, s.block)
		})
	}
}

// TestCapacityCountsWrittenData: data a pod writes into its volume is part
// of the volume's size, not new use: once measured (at the latest when the
// driver starts), available_capacity is what it was right after the
// create (#12, item 6).
func TestCapacityCountsWrittenData(t *testing.T) {
	for _, s := range capacitySetups[:3] {
		t.Run(s.name, func(t *testing.T) {
			in := startCapacity(t, s.fs, s.engine)
			id, err := createSized(in, t, "w", 20*csitest.Mi, false)
			if err != nil {
				t.Fatal(err)
			}
			a := availableFor(t, in, false)
			assertHoldsSize(t, in.Opts.DataRoot, id, 6*csitest.Mi, false) // 5 MiB
			if s.engine == "btrfs" {
				testfs.Sync(t, in.Opts.DataRoot) // qgroup counters move at commit
			}
			in.Stop(t)
			in = testdriver.StartWith(t, in.Opts)
			moved(t, "5 MiB written, driver restarted", a, availableFor(t, in, false), 0)
		})
	}
}
