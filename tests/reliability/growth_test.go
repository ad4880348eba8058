package reliability

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/publish/loop"
	"github.com/localdir-csi/localdir/pkg/volume"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// An expansion commits the new size before it grows the data. A kill
// between the two left a record larger than its data: a raw block image
// shorter than the volume (the pod's device too small) or a btrfs qgroup
// limit below it (writes failing with EDQUOT short of the size the CO was
// told). Start-up recovery grows such data to its record's size: the image
// fully allocated and its attached loop device refreshed, the limit raised.
// An expansion sent again (the CO's retry) does the same. The crash is made
// by expanding and then putting the data back to its old size.
func TestInterruptedExpansionsAreFinishedAtStart(t *testing.T) {
	mnt := testfs.New(t, testfs.Btrfs, 512<<20)
	root := filepath.Join(mnt, "data")
	open := func() *volume.Store {
		n, err := app.OpenNode(driver.Options{DataRoot: root, CapacityBytes: 256 << 20, Engine: engine.Btrfs}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return n.Store
	}
	limits := btrfsLimits(t, mnt)
	m := open()
	mk := func(name string, access contract.AccessType) string {
		v, err := m.Create(contract.CreateSpec{Name: name, SizeBytes: 8 << 20, AccessType: access, DirMode: 0o755})
		if err != nil {
			t.Fatal(err)
		}
		return v.ID
	}
	dir, img, retried := mk("dir", contract.AccessMount), mk("img", contract.AccessBlock), mk("retried", contract.AccessMount)
	imgPath := filepath.Join(root, "block", img+".img")
	dirPath, retriedPath := filepath.Join(root, "volumes", dir), filepath.Join(root, "volumes", retried)
	dev, err := loop.Attach(imgPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = loop.Detach(imgPath) })
	// The crash: each record says 16 MiB, the data is still 8 MiB.
	for _, id := range []string{dir, img, retried} {
		if got, err := m.Expand(id, 16<<20); err != nil || got != 16<<20 {
			t.Fatalf("Expand %s: %d, %v", id, got, err)
		}
	}
	if err := unix.Truncate(imgPath, 8<<20); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dirPath, retriedPath} {
		if err := limits.Resize(p, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	m.Close()

	m = open()
	defer m.Close()
	if l := m.Leftovers(); len(l) != 0 {
		t.Fatalf("leftovers: %v", l)
	}
	var st unix.Stat_t
	if err := unix.Stat(imgPath, &st); err != nil || st.Size != 16<<20 || st.Blocks*512 < 16<<20 {
		t.Fatalf("image after recovery: %d bytes, %d allocated (%v); want 16 MiB allocated", st.Size, st.Blocks*512, err)
	}
	if n, err := blockdev.DeviceSize(dev); err != nil || n != 16<<20 {
		t.Fatalf("loop device %s after recovery: %d bytes (%v), want 16 MiB", dev, n, err)
	}
	for _, p := range []string{dirPath, retriedPath} {
		if got, err := limits.Limit(p); err != nil || got != 16<<20 {
			t.Fatalf("qgroup limit of %s after recovery: %d (%v), want 16 MiB", p, got, err)
		}
	}
	// 12 MiB fit the record's 16 MiB; the old 8 MiB limit refused them.
	if err := os.WriteFile(filepath.Join(dirPath, "f"), make([]byte, 12<<20), 0o644); err != nil {
		t.Fatalf("writing 12 MiB into the 16 MiB volume: %v", err)
	}

	// The retry path: the limit is put back to 8 MiB as if recovery had not
	// run, and the expansion to the recorded size is sent again.
	if err := limits.Resize(retriedPath, 8<<20); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Expand(retried, 16<<20); err != nil || got != 16<<20 {
		t.Fatalf("Expand sent again: %d, %v", got, err)
	}
	if got, err := limits.Limit(retriedPath); err != nil || got != 16<<20 {
		t.Fatalf("qgroup limit after the retried expansion: %d (%v), want 16 MiB", got, err)
	}
}
