package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/localdir-csi/localdir/tests/treecmp"
)

// writeAt writes b at off of the file at path.
func writeAt(t *testing.T, path string, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// TestStreamFileDelta: a 1 GiB image with 64 MiB of data, then a new
// version of it with 16 MiB changed (rewritten, zeroed, written where the
// base has a hole) and 1 MiB more at its end, sent as its difference from
// the base on each filesystem: about 16 MiB cross, the received image
// reads as the new one, and a receiver whose base differs from the
// sender's refuses the result.
func TestStreamFileDelta(t *testing.T) {
	for _, fs := range []copyFS{copyFilesystems[0], copyFilesystems[2], copyFilesystems[3]} {
		t.Run(fs.name, func(t *testing.T) {
			dir := baseDir(t, fs)
			base, cur := filepath.Join(dir, "base.img"), filepath.Join(dir, "cur.img")
			if err := os.WriteFile(base, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(base, 1<<30); err != nil {
				t.Fatal(err)
			}
			writeAt(t, base, treecmp.RandomBytes(1, 64<<20), 100<<20)
			// The new version: a copy of the base, changed.
			var wire bytes.Buffer
			if _, err := SendFile(base, &wire); err != nil {
				t.Fatal(err)
			}
			if _, err := Receive(&wire, cur, StreamFile, 1<<31, nil); err != nil {
				t.Fatal(err)
			}
			writeAt(t, cur, treecmp.RandomBytes(2, 6<<20), 110<<20)   // rewritten
			writeAt(t, cur, make([]byte, 4<<20), 130<<20)             // zeroed
			writeAt(t, cur, treecmp.RandomBytes(3, 6<<20+5), 500<<20) // in the base's hole
			writeAt(t, cur, treecmp.RandomBytes(4, 1<<20), 1<<30)     // past the base's end
			wire.Reset()
			sent, err := SendFileDelta(cur, base, &wire)
			if err != nil {
				t.Fatal(err)
			}
			if wire.Len() > 16<<20+1<<20+64<<10*4 {
				t.Errorf("%d bytes on the wire for about 13 MiB of changed data and 4 MiB zeroed", wire.Len())
			}
			onWire := wire.Len()
			dst := filepath.Join(dir, "dst.img")
			got, err := ReceiveImage(&wire, dst, base, 1<<31, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.Sum, sent.Sum) {
				t.Errorf("received %+v, sent %+v", got, sent)
			}
			a, _ := treecmp.Describe(cur)
			b, _ := treecmp.Describe(dst)
			if a.SHA256 != b.SHA256 || a.Size != b.Size {
				t.Errorf("received image differs: %+v vs %+v", b, a)
			}
			t.Logf("%s: %d bytes on the wire, %d data bytes; received image allocates %d bytes", fs.name, onWire, sent.Bytes, b.Blocks*512)

			// The receiver's base is not the sender's: refused.
			wrong := filepath.Join(dir, "wrong.img")
			wire.Reset()
			if _, err := SendFile(base, &wire); err != nil {
				t.Fatal(err)
			}
			if _, err := Receive(&wire, wrong, StreamFile, 1<<31, nil); err != nil {
				t.Fatal(err)
			}
			writeAt(t, wrong, []byte{1}, 900<<20)
			wire.Reset()
			if _, err := SendFileDelta(cur, base, &wire); err != nil {
				t.Fatal(err)
			}
			if _, err := ReceiveImage(&wire, filepath.Join(dir, "bad.img"), wrong, 1<<31, nil); err == nil || !strings.Contains(err.Error(), "image checksum mismatch") {
				t.Errorf("a delta applied to another base: %v, want an image checksum mismatch", err)
			}
			// A delta stream is refused without a base.
			wire.Reset()
			if _, err := SendFileDelta(cur, base, &wire); err != nil {
				t.Fatal(err)
			}
			if _, err := ReceiveImage(&wire, filepath.Join(dir, "nobase.img"), "", 1<<31, nil); err == nil {
				t.Errorf("a delta stream received without a base")
			}
			if _, err := os.Stat(filepath.Join(dir, "nobase.img")); !os.IsNotExist(err) {
				t.Errorf("a refused delta created its file (%v)", err)
			}
		})
	}
}
