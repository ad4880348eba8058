package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"

	"github.com/google/uuid"
)

// Volume and snapshot ids are generated here and nowhere else. They are the
// only strings a path under the data root is ever built from, and every
// path-building function checks them against these patterns first, so a
// caller-supplied "../x", absolute path or NUL byte never reaches the disk.
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

// newID returns prefix + the hex of a UUIDv7 (time-ordered, 74 random bits):
// later ids sort later, so new records land at the end of the state file's
// B-tree, not in random pages, and a commit writes fewer pages.
func newID(prefix string) string {
	u, err := uuid.NewV7()
	if err != nil {
		panic("crypto/rand failed: " + err.Error()) // never happens on Linux
	}
	return prefix + hex.EncodeToString(u[:])
}

// NewVolumeID returns a fresh volume_id (time-ordered, 74 random bits).
func NewVolumeID() string { return newID("vol-") }

// NewSnapshotID returns a fresh snapshot_id (time-ordered, 74 random bits).
func NewSnapshotID() string { return newID("snap-") }

var groupSnapshotIDPattern = regexp.MustCompile(`^group-[0-9a-f]{32}$`)

// ValidGroupSnapshotID tells whether id has the shape of a
// group_snapshot_id.
func ValidGroupSnapshotID(id string) bool { return groupSnapshotIDPattern.MatchString(id) }

// GroupSnapshotIDFor is the group_snapshot_id for a CSI name ("group-" + a
// SHA-256 prefix), so that a retried create finds its group.
func GroupSnapshotIDFor(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "group-" + hex.EncodeToString(sum[:16])
}

var snapshotCopyPattern = regexp.MustCompile(`^(snap-[0-9a-f]{32})-copy-[0-9a-f]{8}$`)

// SnapshotCopyName is the name of the LocalSnapshot that is snapshot id's
// copy on node: id + "-copy-" + a SHA-256 prefix of the node id.
func SnapshotCopyName(id, node string) string {
	sum := sha256.Sum256([]byte(node))
	return id + "-copy-" + hex.EncodeToString(sum[:4])
}

// SnapshotOfCopy returns the snapshot_id a copy name is of, or "" when
// name is not one SnapshotCopyName makes.
func SnapshotOfCopy(name string) string {
	if m := snapshotCopyPattern.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return ""
}

var volumeMovePattern = regexp.MustCompile(`^(vol-[0-9a-f]{32})-move-[0-9a-f]{8}$`)

// VolumeMoveName is the name of the LocalVolume that moves volume id onto
// node: id + "-move-" + a SHA-256 prefix of the node id.
func VolumeMoveName(id, node string) string {
	sum := sha256.Sum256([]byte(node))
	return id + "-move-" + hex.EncodeToString(sum[:4])
}

// VolumeOfMove returns the volume_id a move name is of, or "" when name is
// not one VolumeMoveName makes.
func VolumeOfMove(name string) string {
	if m := volumeMovePattern.FindStringSubmatch(name); m != nil {
		return m[1]
	}
	return ""
}
