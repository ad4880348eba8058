package engine

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/tests/testfs"
)

// encoded tells whether every extent of the file at p carries
// FIEMAP_EXTENT_ENCODED (btrfs: compressed), and how many it has.
func encoded(t *testing.T, p string) (bool, int) {
	t.Helper()
	flags := extentFlags(t, p)
	all := len(flags) > 0
	for _, f := range flags {
		all = all && f&extentEncoded != 0
	}
	return all, len(flags)
}

// extentFlags are the FIEMAP flags of the file's extents, in file order.
func extentFlags(t *testing.T, p string) []uint32 {
	t.Helper()
	fd, err := unix.Open(p, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	exts, err := extents(fd, 0, st.Size)
	if err != nil {
		t.Fatalf("%s: %v", p, err)
	}
	var out []uint32
	for _, x := range exts {
		out = append(out, x.flags)
	}
	return out
}

// SetCompression on a real btrfs: data written afterwards, to a new file
// in a directory that existed before and to a file that existed before,
// is stored compressed (FIEMAP reports its extents encoded); data written
// before stays as it was; "none" stops it again; a symlink in the tree is
// not followed to the file it names.
func TestSetCompression(t *testing.T) {
	mnt := testfs.New(t, testfs.Btrfs, 512<<20)
	vol := filepath.Join(mnt, "vol")
	if err := (btrfsEngine{}).Create(vol, 256<<20, 0o777); err != nil {
		t.Fatal(err)
	}
	outside := filepath.Join(mnt, "outside")
	if err := os.WriteFile(outside, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(vol, "a", "b")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("localdir compresses this line well\n"), 1<<15) // ~1.1 MiB
	before := filepath.Join(sub, "before")
	if err := os.WriteFile(before, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(sub, "link")); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mkfifo(filepath.Join(sub, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if enc, _ := encoded(t, before); enc {
		t.Fatal("data written before any compression property is stored compressed: the filesystem compresses on its own; the test proves nothing")
	}

	if err := SetCompression(vol, "zstd"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{vol, sub, before} {
		if got, err := Compression(p); err != nil || got != "zstd" {
			t.Errorf("compression property of %s: %q (%v), want zstd", p, got, err)
		}
	}
	if got, _ := Compression(outside); got != "" {
		t.Errorf("the file a symlink in the volume names got compression %q: the walk followed the link", got)
	}
	if enc, _ := encoded(t, before); enc {
		t.Error("data written before the change was rewritten compressed; only later writes should be")
	}
	newFile := filepath.Join(sub, "new")
	if err := os.WriteFile(newFile, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(before, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if enc, n := encoded(t, newFile); !enc {
		t.Errorf("a new file written after compression=zstd: %d extents, not all encoded", n)
	}
	if fl := extentFlags(t, before); len(fl) < 2 || fl[0]&extentEncoded != 0 || fl[len(fl)-1]&extentEncoded == 0 {
		t.Errorf("the file written before, then appended to after compression=zstd: extent flags %#x, want the first plain and the last encoded", fl)
	}

	if err := SetCompression(vol, "none"); err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join(sub, "plain")
	if err := os.WriteFile(plain, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if enc, _ := encoded(t, plain); enc {
		t.Error("a file written after compression=none is stored compressed")
	}
	if err := SetCompression(t.TempDir(), "zstd"); err == nil && !onBtrfs(os.TempDir()) {
		t.Error("SetCompression on a directory that is not on btrfs succeeded")
	}
}
