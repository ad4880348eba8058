package volume

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Modify changes only the keys given, on the data and in the record (which
// survives a restart); a parameter a volume cannot take is refused with
// ErrInvalid naming it, and changes nothing.
func TestModify(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	v := create(t, m, "dir")
	mode := func() os.FileMode {
		t.Helper()
		fi, err := os.Stat(m.volDir(v.ID))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm()
	}
	if _, err := m.Modify(v.ID, map[string]string{"dirMode": "0750"}); err != nil {
		t.Fatal(err)
	}
	if got := mode(); got != 0o750 {
		t.Errorf("mode after dirMode=0750: %o", got)
	}
	for _, c := range []struct {
		params map[string]string
		names  string
	}{
		{map[string]string{"compression": "zstd"}, "compression"}, // not btrfs
		{map[string]string{"dirMode": "0700", "speed": "fast"}, "speed"},
		{map[string]string{"compression": "brotli"}, "compression"},
		{map[string]string{"dirMode": "999"}, "dirMode"},
	} {
		_, err := m.Modify(v.ID, c.params)
		if !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), c.names) {
			t.Errorf("Modify %v: %v, want ErrInvalid naming %s", c.params, err, c.names)
		}
	}
	if got := mode(); got != 0o750 {
		t.Errorf("a refused modify changed the mode to %o", got)
	}
	if _, err := m.Modify("vol-0123456789abcdef0123456789abcdef", map[string]string{"dirMode": "0700"}); !errors.Is(err, contract.ErrNotFound) {
		t.Errorf("Modify of an unknown volume: %v, want ErrNotFound", err)
	}
	blk, err := m.Create(contract.CreateSpec{Name: "blk", SizeBytes: 1 << 20, AccessType: contract.AccessBlock})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Modify(blk.ID, map[string]string{"dirMode": "0700"}); !errors.Is(err, contract.ErrInvalid) || !strings.Contains(err.Error(), "raw block") {
		t.Errorf("dirMode on a raw block volume: %v, want ErrInvalid saying why", err)
	}
	if err := contract.CheckMutableKind("", contract.AccessMount, "ext4", map[string]string{"compression": "zstd"}); !errors.Is(err, contract.ErrInvalid) {
		t.Errorf("compression for a new image volume: %v, want ErrInvalid", err)
	}
	m.Close()
	m = openTest(t, root)
	got, err := m.Get(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.MutableParameters["dirMode"] != "0750" || len(got.MutableParameters) != 1 {
		t.Errorf("recorded mutable parameters after a restart: %v, want dirMode 0750 only", got.MutableParameters)
	}
}
