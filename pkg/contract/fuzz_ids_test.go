package contract

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzIDs: whatever passes ValidVolumeID or ValidSnapshotID is a single,
// plain path component (no separator, no dot, no NUL), so joining it onto
// the data root can never leave the directory it is joined to; and no
// string is both.
func FuzzIDs(f *testing.F) {
	for _, s := range []string{
		"", "vol-", NewVolumeID(), NewSnapshotID(), "vol-0123456789abcdef0123456789abcdef", "vol-0123456789ABCDEF0123456789ABCDEF",
		"vol-0123456789abcdef0123456789abcdef/..", "../vol-0123456789abcdef0123456789abcdef", "vol-0123456789abcdef0123456789abcde\x00",
		"vol-0123456789abcdef0123456789abcdef\n", "snap-../../../../../../../../../x", EphemeralName("csi-x"),
	} {
		f.Add(s)
	}
	root := "/var/lib/localdir"
	f.Fuzz(func(t *testing.T, s string) {
		v, sn := ValidVolumeID(s), ValidSnapshotID(s)
		if v && sn {
			t.Fatalf("%q is both a volume and a snapshot id", s)
		}
		if !v && !sn {
			return
		}
		if strings.ContainsAny(s, "/.\x00\n") || filepath.Base(s) != s {
			t.Fatalf("%q is accepted as an id but is not a plain name", s)
		}
		for _, dir := range []string{"volumes", "block", "snapshots"} {
			p := filepath.Join(root, dir, s+".img")
			if filepath.Dir(p) != filepath.Join(root, dir) {
				t.Fatalf("id %q leaves %s: %s", s, dir, p)
			}
		}
	})
}
