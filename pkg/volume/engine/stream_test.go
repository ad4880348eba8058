package engine

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/tests/treecmp"
)

// TestStreamTreeFidelity sends a tree holding every kind of entry and
// attribute from one filesystem and receives it on another (btrfs → XFS,
// XFS → btrfs, the disk → ext4): the copy equals the source entry by entry
// as CopyTree's does, holes stay holes, and both sides computed one digest.
func TestStreamTreeFidelity(t *testing.T) {
	pairs := [][2]copyFS{
		{copyFilesystems[3], copyFilesystems[2]},
		{copyFilesystems[2], copyFilesystems[3]},
		{copyFilesystems[0], copyFilesystems[1]},
	}
	for _, p := range pairs {
		t.Run(p[0].name+"-to-"+p[1].name, func(t *testing.T) {
			from, to := baseDir(t, p[0]), baseDir(t, p[1])
			rich := treecmp.BuildRich(t, filepath.Join(from, "src"), filepath.Join(from, "outside"))
			dst := filepath.Join(to, "dst")
			if err := os.Mkdir(dst, 0o700); err != nil {
				t.Fatal(err)
			}
			var wire bytes.Buffer
			sent, err := SendTree(rich.Root, &wire)
			if err != nil {
				t.Fatalf("SendTree: %v", err)
			}
			got, err := Receive(&wire, dst, StreamTree, 1<<40, nil)
			if err != nil {
				t.Fatalf("Receive: %v", err)
			}
			if !bytes.Equal(sent.Sum, got.Sum) || sent.Bytes != got.Bytes || sent.Entries != got.Entries {
				t.Errorf("sent %+v, received %+v", sent, got)
			}
			if sent.Bytes > int64(wire.Cap()) || sent.Bytes > 8*treecmp.MiB {
				t.Errorf("sent %d data bytes: the sparse file's holes crossed the wire", sent.Bytes)
			}
			_, cp := treecmp.Compare(t, rich.Root, dst, treecmp.Options{})
			if alloc := cp[rich.Sparse].Blocks * 512; alloc > 6*treecmp.MiB {
				t.Errorf("sparse file received with %d bytes allocated for 2 MiB of data", alloc)
			}
			assertNoSecret(t, dst, rich.SecretContent)
		})
	}
}

// TestStreamFileSparse sends a 1 GiB image holding 3 MiB of data: about
// 3 MiB cross, the received file has the same bytes and is as sparse.
func TestStreamFileSparse(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src.img")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	for i, off := range []int64{0, 300 << 20, 1<<30 - 1<<20} {
		if _, err := f.WriteAt(treecmp.RandomBytes(uint64(i), 1<<20), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	var wire bytes.Buffer
	sent, err := SendFile(src, &wire)
	if err != nil {
		t.Fatal(err)
	}
	if wire.Len() > 4<<20 {
		t.Errorf("%d bytes on the wire for 3 MiB of data", wire.Len())
	}
	dst := filepath.Join(dir, "dst.img")
	var last int64
	got, err := Receive(&wire, dst, StreamFile, 1<<30, func(done, total int64) { last = done })
	if err != nil {
		t.Fatal(err)
	}
	if got.Bytes != 3<<20 || last != got.Bytes || !bytes.Equal(got.Sum, sent.Sum) {
		t.Errorf("received %+v (progress %d), sent %+v", got, last, sent)
	}
	a, _ := treecmp.Describe(src)
	b, _ := treecmp.Describe(dst)
	if a.SHA256 != b.SHA256 || a.Size != b.Size {
		t.Errorf("received image differs: %+v vs %+v", b, a)
	}
	if b.Blocks*512 > 8<<20 {
		t.Errorf("received image allocates %d bytes", b.Blocks*512)
	}
}

// TestReceiveRefuses feeds streams a sender would never write: each fails
// and nothing is created outside dst.
func TestReceiveRefuses(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	img := filepath.Join(dir, "img")
	if err := os.WriteFile(img, treecmp.RandomBytes(1, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(dir, "tree")
	if err := os.Mkdir(tree, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	stream := func(send func(w io.Writer) error) []byte {
		var b bytes.Buffer
		if err := send(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	fileStream := stream(func(w io.Writer) error { _, err := SendFile(img, w); return err })
	treeStream := stream(func(w io.Writer) error { _, err := SendTree(tree, w); return err })
	forged := func(recs ...*record) []byte {
		return stream(func(w io.Writer) error {
			s := newSender(w)
			if err := s.enc.Encode(&streamHeader{Version: streamVersion, Kind: StreamTree}); err != nil {
				return err
			}
			for _, r := range recs {
				if err := s.send(r); err != nil {
					return err
				}
			}
			_, err := s.finish()
			return err
		})
	}
	// raw encodes records as they are: a Len that no data follows.
	raw := func(recs ...*record) []byte {
		return stream(func(w io.Writer) error {
			s := newSender(w)
			if err := s.enc.Encode(&streamHeader{Version: streamVersion, Kind: StreamTree}); err != nil {
				return err
			}
			for _, r := range recs {
				if err := s.enc.Encode(r); err != nil {
					return err
				}
			}
			return s.bw.Flush()
		})
	}
	flipped := bytes.Clone(fileStream)
	flipped[len(flipped)/2] ^= 0xff
	cases := []struct {
		name  string
		data  []byte
		kind  StreamKind
		limit int64
		want  string
	}{
		{"image larger than the volume", fileStream, StreamFile, 1 << 19, "the volume has"},
		{"wrong kind", treeStream, StreamFile, 1 << 30, "want \"file\""},
		{"cut short", fileStream[:len(fileStream)/2], StreamFile, 1 << 30, "broke off"},
		{"a flipped byte", flipped, StreamFile, 1 << 30, ""},
		{"a name with a slash", forged(&record{Op: opFile, Name: "../escape"}), StreamTree, 1 << 30, "names an entry"},
		{"a hard link out of the tree", forged(&record{Op: opLink, Name: "l", Target: "../../etc/passwd"}), StreamTree, 1 << 30, "did not create"},
		{"data outside its file", forged(&record{Op: opFile, Name: "f", Size: 1}, &record{Op: opData, Off: 0, data: []byte("too long")}), StreamTree, 1 << 30, "outside the file"},
		{"more data than a record carries", raw(&record{Op: opFile, Name: "f", Size: 4 << 20}, &record{Op: opData, Len: chunk + 1}), StreamTree, 1 << 30, "carries"},
		{"data after a record that has none", raw(&record{Op: opFile, Name: "f", Size: 1, Len: 1}), StreamTree, 1 << 30, "carries"},
		{"a block device mode on a regular op", forged(&record{Op: opSpecial, Name: "n", Mode: unix.S_IFREG}), StreamTree, 1 << 30, "special file"},
		{"no end of the root", forged(&record{Op: opDir, Name: "d"}), StreamTree, 1 << 30, "inside a directory"},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := filepath.Join(dir, "dst", strings.Repeat("x", i+1))
			if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
				t.Fatal(err)
			}
			if c.kind == StreamTree {
				if err := os.Mkdir(dst, 0o700); err != nil {
					t.Fatal(err)
				}
			}
			_, err := Receive(bytes.NewReader(c.data), dst, c.kind, c.limit, nil)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Receive = %v, want an error containing %q", err, c.want)
			}
		})
	}
	if _, err := os.Lstat(filepath.Join(dir, "escape")); err == nil {
		t.Error("a forged stream created a file outside its destination")
	}
}

// TestStreamSkipsZeros: data blocks that hold only zeros (an image's
// preallocated extents read as data on btrfs and XFS) do not cross, and
// the received file reads the same.
func TestStreamSkipsZeros(t *testing.T) {
	requireRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "zeros.img")
	data := make([]byte, 16<<20)
	copy(data[5<<20+100:], treecmp.RandomBytes(3, 1<<20))
	if err := os.WriteFile(src, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var wire bytes.Buffer
	sent, err := SendFile(src, &wire)
	if err != nil {
		t.Fatal(err)
	}
	if wire.Len() > 2<<20 || sent.Bytes > 1<<20+2*zeroBlock {
		t.Errorf("%d bytes on the wire, %d data bytes sent, for 1 MiB of non-zero data", wire.Len(), sent.Bytes)
	}
	dst := filepath.Join(dir, "dst.img")
	if _, err := Receive(&wire, dst, StreamFile, 1<<30, nil); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("received file differs (%d bytes, %v)", len(got), err)
	}
}

// BenchmarkStreamFile sends a 256 MiB image of random data through a pipe
// into Receive (the stream's own cost, without TLS or the disk's flush).
func BenchmarkStreamFile(b *testing.B) {
	dir := b.TempDir()
	src := filepath.Join(dir, "src.img")
	const size = 256 << 20
	if err := os.WriteFile(src, treecmp.RandomBytes(7, size), 0o600); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst := filepath.Join(dir, "dst.img")
		pr, pw := io.Pipe()
		go func() {
			_, err := SendFile(src, pw)
			pw.CloseWithError(err)
		}()
		if _, err := Receive(pr, dst, StreamFile, size, nil); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		os.Remove(dst)
		b.StartTimer()
	}
}
