package contract

import (
	"strings"
	"testing"
)

func TestValidIDs(t *testing.T) {
	hex32 := "0123456789abcdef0123456789abcdef"
	tests := []struct {
		id        string
		vol, snap bool
	}{
		{"vol-" + hex32, true, false},
		{"snap-" + hex32, false, true},
		{"vol-" + strings.Repeat("0", 32), true, false},
		{"vol-" + strings.Repeat("f", 32), true, false},
		{"", false, false},
		{"vol-", false, false},
		{"snap-", false, false},
		{"vol-" + hex32[:31], false, false},
		{"vol-" + hex32 + "0", false, false},
		{"snap-" + hex32[:31], false, false},
		{"snap-" + hex32 + "a", false, false},
		{"vol-" + strings.ToUpper(hex32), false, false},
		{"vol-0123456789ABCDEF0123456789abcdef", false, false},
		{"snap-" + strings.ToUpper(hex32), false, false},
		{"VOL-" + hex32, false, false},
		{"vol_" + hex32, false, false},
		{"vol-" + hex32[:31] + "g", false, false},
		{"../x", false, false},
		{"../vol-" + hex32, false, false},
		{"vol-" + hex32 + "/..", false, false},
		{"vol-" + hex32 + "/../../etc", false, false},
		{"/vol-" + hex32, false, false},
		{"/etc/passwd", false, false},
		{"./vol-" + hex32, false, false},
		{"vol-" + hex32 + "\x00", false, false},
		{"vol-" + hex32[:16] + "\x00" + hex32[17:], false, false},
		{"vol-" + hex32 + "\n", false, false},
		{"snap-" + hex32 + "\n", false, false},
		{"\nvol-" + hex32, false, false},
		{" vol-" + hex32, false, false},
		{"vol-" + hex32 + " ", false, false},
		{"vol-vol-" + hex32[:28], false, false},
		{"snap-vol-" + hex32[:27], false, false},
		// Full-width and other Unicode digits are not hex.
		{"vol-" + hex32[:31] + "\uff10", false, false},
	}
	for _, tc := range tests {
		if got := ValidVolumeID(tc.id); got != tc.vol {
			t.Errorf("ValidVolumeID(%q) = %v, want %v", tc.id, got, tc.vol)
		}
		if got := ValidSnapshotID(tc.id); got != tc.snap {
			t.Errorf("ValidSnapshotID(%q) = %v, want %v", tc.id, got, tc.snap)
		}
	}
}

func TestNewIDs(t *testing.T) {
	const n = 5000
	seen := make(map[string]bool, 2*n)
	for i := 0; i < n; i++ {
		v, s := NewVolumeID(), NewSnapshotID()
		if !ValidVolumeID(v) || ValidSnapshotID(v) {
			t.Fatalf("NewVolumeID() = %q is not a (only a) valid volume id", v)
		}
		if !ValidSnapshotID(s) || ValidVolumeID(s) {
			t.Fatalf("NewSnapshotID() = %q is not a (only a) valid snapshot id", s)
		}
		if seen[v] || seen[s] {
			t.Fatalf("duplicate id after %d draws: %q / %q", i, v, s)
		}
		seen[v], seen[s] = true, true
	}
}

func TestVolumeMoveName(t *testing.T) {
	id := NewVolumeID()
	a, b := VolumeMoveName(id, "node-a"), VolumeMoveName(id, "node-b")
	if a == b || VolumeOfMove(a) != id || VolumeOfMove(b) != id {
		t.Fatalf("VolumeMoveName(%s): %q, %q; VolumeOfMove: %q, %q", id, a, b, VolumeOfMove(a), VolumeOfMove(b))
	}
	if ValidVolumeID(a) || SnapshotOfCopy(a) != "" {
		t.Errorf("a move name %q passes as a volume id or a copy name", a)
	}
	for _, s := range []string{id, id + "-move-", id + "-move-0123456", id + "-move-0123456789", id + "-copy-01234567",
		"snap-" + id[4:] + "-move-01234567", id + "-move-01234567/..", "../" + id + "-move-01234567"} {
		if VolumeOfMove(s) != "" {
			t.Errorf("VolumeOfMove(%q) = %q, want \"\"", s, VolumeOfMove(s))
		}
	}
}
