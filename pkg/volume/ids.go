package volume

import (
	"crypto/rand"
	"encoding/hex"
	"regexp"
	"time"
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

// newID returns prefix + 32 hex digits: the first 12 are the creation time
// in milliseconds, the other 20 random (the layout of a UUIDv7). Ids made
// later sort later, so new records land at the end of the state file's
// B-tree instead of in random pages: a commit writes fewer pages, and its
// cost does not grow with the number of volumes.
func newID(prefix string) string {
	var b [16]byte
	if _, err := rand.Read(b[6:]); err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	ms := uint64(time.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	return prefix + hex.EncodeToString(b[:])
}

// NewVolumeID returns a fresh volume_id (time-ordered, 80 random bits).
func NewVolumeID() string { return newID("vol-") }

// NewSnapshotID returns a fresh random snapshot_id.
func NewSnapshotID() string { return newID("snap-") }
