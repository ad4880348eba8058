package volume

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
)

// Volume and snapshot ids are generated here and nowhere else. They are the
// only strings from which a path under the data root is ever built, and every
// path-building function checks them against these patterns first, so a
// caller-supplied "../x", absolute path or NUL byte can never reach the
// filesystem.
var (
	volumeIDPattern   = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)
	snapshotIDPattern = regexp.MustCompile(`^snap-[0-9a-f]{32}$`)
)

// ValidVolumeID reports whether id has the shape of a volume_id this driver
// issues: "vol-" followed by 32 lowercase hex digits.
func ValidVolumeID(id string) bool { return volumeIDPattern.MatchString(id) }

// ValidSnapshotID reports whether id has the shape of a snapshot_id this
// driver issues: "snap-" followed by 32 lowercase hex digits.
func ValidSnapshotID(id string) bool { return snapshotIDPattern.MatchString(id) }

func newID(prefix string) string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}

// NewVolumeID returns a fresh random volume_id.
func NewVolumeID() string { return newID("vol-") }

// NewSnapshotID returns a fresh random snapshot_id.
func NewSnapshotID() string { return newID("snap-") }
