package reliability

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// TestDamagedStateRefused extends tests/cases C09b (cut to 37 bytes, empty,
// first page overwritten, missing) with damage that gets further into the
// file: cut short in the middle, every data page garbled behind intact
// header pages, one record's JSON garbled in place, and a directory where
// the file should be. The state is left by a SIGKILLed binary, as after a
// crash. The driver, in-process and as the binary, must refuse to start
// with a message naming the state file and what to do, and must leave the
// file byte for byte, and every volume's data, as they were.
func TestDamagedStateRefused(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string, data []byte)
		// clean: stop the driver with SIGTERM instead of SIGKILL, so that
		// every record is in the state file itself.
		clean bool
	}{
		{name: "cut short by a page", damage: func(t *testing.T, path string, data []byte) {
			if err := os.Truncate(path, usedBytes(t, data)-4096); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "cut to the header pages", damage: func(t *testing.T, path string, data []byte) {
			if err := os.Truncate(path, 2*4096); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "data pages garbled", damage: func(t *testing.T, path string, data []byte) {
			junk := bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef, 0x13, 0x37, 0x00, 0xff}, (len(data)-2*4096)/8)
			if err := os.WriteFile(path, append(bytes.Clone(data[:2*4096]), junk...), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a record garbled", clean: true, damage: func(t *testing.T, path string, data []byte) {
			// The JSON of the volume records: `{"id":"vol-…` → `{"id":@vol-…`
			// (every copy: pages of older transactions hold some too).
			d := bytes.ReplaceAll(data, []byte(`{"id":"vol-`), []byte(`{"id":@vol-`))
			if bytes.Equal(d, data) {
				t.Fatal("no volume record found in the state file")
			}
			if err := os.WriteFile(path, d, 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a directory in its place", damage: func(t *testing.T, path string, data []byte) {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(path, 0o700); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := tempDir(t)
			root := filepath.Join(dir, "data")
			p := startProc(t, dir)
			var ids []string
			for _, name := range []string{"a", "b", "c"} {
				r, err := p.controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
				csitest.MustCode(t, err, codes.OK, "CreateVolume "+name)
				ids = append(ids, r.GetVolume().GetVolumeId())
				writeSyncedWithDir(t, filepath.Join(root, "volumes", r.GetVolume().GetVolumeId(), "keep"), []byte(name))
			}
			r, err := p.controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "blk", CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}})
			csitest.MustCode(t, err, codes.OK, "CreateVolume blk")
			blk := r.GetVolume().GetVolumeId()
			_, err = p.controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: ids[2]})
			csitest.MustCode(t, err, codes.OK, "DeleteVolume c")
			ids = ids[:2]
			if tc.clean {
				p.stop(t)
			} else {
				p.kill()
			}

			path := filepath.Join(root, state.FileName)
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			tc.damage(t, path, data)
			before := snapshotFiles(t, root)

			check := func(when, msg string) {
				t.Helper()
				if !strings.Contains(msg, path) {
					t.Errorf("%s: the message does not name %s:\n%s", when, path, msg)
				}
				if !strings.Contains(msg, "restore") && !strings.Contains(msg, "move") {
					t.Errorf("%s: the message does not say what to do (restore or move the file):\n%s", when, msg)
				}
				after := snapshotFiles(t, root)
				for p, b := range before {
					if a, ok := after[p]; !ok {
						t.Errorf("%s: %s was removed", when, p)
					} else if a != b {
						t.Errorf("%s: %s was changed", when, p)
					}
				}
				for p := range after {
					if _, ok := before[p]; !ok {
						t.Errorf("%s: %s was created", when, p)
					}
				}
				for i, id := range ids {
					csitest.AssertFileBytes(t, filepath.Join(root, "volumes", id, "keep"), []byte([]string{"a", "b"}[i]))
				}
				if !mayExist(filepath.Join(root, "block", blk+".img")) {
					t.Errorf("%s: the block volume's image was removed", when)
				}
			}

			o := testdriver.DefaultOptions(dir)
			o.Engine = "dir"
			d, _, err := app.NewDriver(o, nil)
			if err == nil {
				_ = d.Close()
				t.Fatal("driver.New started on a damaged state file")
			}
			if tc.name != "a directory in its place" && !errors.Is(err, state.ErrCorrupt) {
				t.Errorf("driver.New error does not wrap state.ErrCorrupt: %v", err)
			}
			check("driver.New", err.Error())

			out, err := exec.Command(driverBinary(t), procArgs(dir)...).CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Errorf("the binary on a damaged state file: %v (want exit status 1); output:\n%s", err, out)
			}
			if strings.Contains(string(out), "panic") || strings.Contains(string(out), "goroutine ") {
				t.Errorf("the binary panicked instead of refusing:\n%s", out)
			}
			check("the binary", string(out))
			if _, err := os.Lstat(filepath.Join(dir, "csi.sock")); err == nil {
				// The killed process left its socket; the refused one must
				// not have served on it. It is the only acceptable file.
				_ = os.Remove(filepath.Join(dir, "csi.sock"))
			}
		})
	}
}

// snapshotFiles maps every path below root to its content (or "dir").
func snapshotFiles(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			out[p] = "dir"
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[p] = string(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// usedBytes is the size a bbolt file's valid meta page says it needs: the
// high-water page id (meta field "pgid", at offset 16+40 of the page) times
// the page size (offset 16+8), from the meta page with the higher txid.
func usedBytes(t *testing.T, data []byte) int64 {
	t.Helper()
	var best, txid uint64
	for _, off := range []int{0, 4096} {
		m := data[off+16:]
		pageSize := uint64(binary.LittleEndian.Uint32(m[8:]))
		pgid := binary.LittleEndian.Uint64(m[40:])
		tx := binary.LittleEndian.Uint64(m[48:])
		if tx >= txid {
			txid, best = tx, pgid*pageSize
		}
	}
	if best < 3*4096 || best > uint64(len(data)) {
		t.Fatalf("state file: meta says %d bytes, file has %d", best, len(data))
	}
	return int64(best)
}
