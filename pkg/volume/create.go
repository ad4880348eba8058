package volume

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Create makes a new volume, filled from a snapshot or volume when the spec
// names one (held for the copy: holdSource), and commits its record before it
// returns (landing); a failure leaves no data, record or reservation. Errors:
// contract.ErrNoSpace, contract.ErrNotFound, contract.ErrInvalid,
// contract.ErrOutOfRange (below the source's size), contract.ErrExists (name
// taken by a concurrent create), contract.ErrBusy.
func (m *Store) Create(spec contract.CreateSpec) (*contract.Volume, error) {
	given := spec.ID != ""
	if err := checkCreateSpec(&spec); err != nil {
		return nil, err
	}
	release, err := m.lockChange("a create", spec.ID, spec.SourceVolumeID)
	if err != nil {
		return nil, err
	}
	defer release()
	if given { // the node already holds it: the reconciler's idempotency
		if v, err := m.Get(spec.ID); err == nil {
			return v, nil
		}
	}
	srcPath, releaseSrc, err := m.holdSource(spec)
	if err != nil {
		return nil, err
	}
	defer releaseSrc()
	salt, err := m.keySaltFor(spec)
	if err != nil {
		return nil, err
	}
	return m.make(spec, func(v *contract.Volume, tmp string) error {
		v.KeySalt = salt // recorded with the data it encrypts
		return m.writeData(v, tmp, srcPath, spec.DirMode)
	})
}

// make lands the volume of spec (its id checked and locked by the caller):
// it reserves the size, fill writes the data at tmp, the mutable parameters
// are applied, the record committed. A failure leaves no data, record or
// reservation.
func (m *Store) make(spec contract.CreateSpec, fill func(v *contract.Volume, tmp string) error) (*contract.Volume, error) {
	if err := m.acct.reserve(spec.ID, spec.SizeBytes); err != nil {
		return nil, err
	}
	v := m.newRecord(spec)
	err := m.land(landing{
		what: "create",
		dsts: []string{m.dataPath(v)},
		write: func(tmps []string) error {
			if err := fill(v, tmps[0]); err != nil {
				return fmt.Errorf("create volume data: %w", err)
			}
			if len(spec.MutableParameters) == 0 {
				return nil
			}
			mut, err := contract.MutableOf(spec.MutableParameters)
			if err != nil {
				return err
			}
			return m.applyMutable(v, tmps[0], mut)
		},
		commit: func(tx *state.Tx) error {
			if spec.Name != "" && tx.VolumeIDByName(spec.Name) != "" {
				return fmt.Errorf("%w: volume name %q", contract.ErrExists, spec.Name)
			}
			return tx.PutVolume(v)
		},
		uncommit: func(tx *state.Tx) error { return tx.DeleteVolume(v.ID) },
	})
	if err != nil {
		if !errors.Is(err, errLandsAtStart) { // else the record keeps its reservation
			m.acct.unreserve(spec.ID, spec.SizeBytes)
		}
		return nil, err
	}
	m.acct.measured(v)
	klog.V(2).InfoS("Volume created", "volumeID", v.ID, "size", v.CapacityBytes, "accessType", v.AccessType,
		"engine", v.Engine, "sourceSnapshot", v.SourceSnapshotID, "sourceVolume", v.SourceVolumeID)
	return v, nil
}

// checkCreateSpec refuses a size or access type no create can make
// (contract.ErrInvalid) and gives a spec without an id a fresh one.
func checkCreateSpec(spec *contract.CreateSpec) error {
	if spec.SizeBytes <= 0 {
		return fmt.Errorf("%w: size %d", contract.ErrInvalid, spec.SizeBytes)
	}
	if spec.AccessType != contract.AccessMount && spec.AccessType != contract.AccessBlock {
		return fmt.Errorf("%w: access type %q", contract.ErrInvalid, spec.AccessType)
	}
	if err := checkFsType(spec.FsType, spec.AccessType, spec.SizeBytes); err != nil {
		return err
	}
	if spec.ID == "" {
		spec.ID = contract.NewVolumeID()
	} else if !contract.ValidVolumeID(spec.ID) {
		return fmt.Errorf("%w: volume id %q", contract.ErrInvalid, spec.ID)
	}
	return nil
}

// cloneImage writes v's image at tmp: empty, or a copy of srcPath's, frozen
// while copied when the source is staged (whileFrozen).
func (m *Store) cloneImage(v *contract.Volume, tmp, srcPath string) error {
	write := func() error { return writeImage(tmp, srcPath, v.CapacityBytes) }
	if v.SourceVolumeID == "" {
		return write()
	}
	src, err := m.Get(v.SourceVolumeID)
	if err != nil {
		return err
	}
	return m.whileFrozen(src, write)
}

// checkFsType refuses an image volume this node cannot make: an fs_type not
// in contract.FsTypes, without its mkfs, or on a block volume (ErrInvalid);
// a size below its mkfs minimum (ErrOutOfRange).
func checkFsType(fsType string, accessType contract.AccessType, size int64) error {
	if fsType == "" {
		return nil
	}
	minSize, ok := contract.FsTypes[fsType]
	switch {
	case !ok:
		return fmt.Errorf("%w: fs_type %q: image volumes are made with %s", contract.ErrInvalid, fsType, fsTypeList())
	case accessType != contract.AccessMount:
		return fmt.Errorf("%w: fs_type %q on a %s volume: only mount volumes have a filesystem", contract.ErrInvalid, fsType, accessType)
	case size < minSize:
		return fmt.Errorf("%w: %d bytes is below the %d bytes mkfs.%s accepts", contract.ErrOutOfRange, size, minSize, fsType)
	}
	if _, err := exec.LookPath("mkfs." + fsType); err != nil {
		return fmt.Errorf("%w: fs_type %q: this node cannot make it (mkfs.%s is not installed)", contract.ErrInvalid, fsType, fsType)
	}
	return nil
}

func fsTypeList() string {
	return strings.Join(slices.Sorted(maps.Keys(contract.FsTypes)), ", ")
}

func (m *Store) newRecord(spec contract.CreateSpec) *contract.Volume {
	v := &contract.Volume{
		ID:               spec.ID,
		Name:             spec.Name,
		CapacityBytes:    spec.SizeBytes,
		AccessType:       spec.AccessType,
		FsType:           spec.FsType,
		Parameters:       spec.Parameters,
		SourceSnapshotID: spec.SourceSnapshotID,
		SourceVolumeID:   spec.SourceVolumeID,
		Ephemeral:        spec.Ephemeral,
		EphemeralID:      spec.EphemeralID,
		Engine:           m.eng.Name(),
		CreatedAt:        time.Now().UTC().Truncate(time.Second),
	}
	if v.Image() {
		v.Engine = "image"
	}
	if len(spec.MutableParameters) > 0 {
		v.MutableParameters = maps.Clone(spec.MutableParameters)
	}
	return v
}

// writeData makes v's data at tmp (image, restore, clone or empty directory
// of dirMode) and syncs copied data and images to disk.
func (m *Store) writeData(v *contract.Volume, tmp, srcPath string, dirMode uint32) error {
	var err error
	switch {
	case v.Image():
		err = m.cloneImage(v, tmp, srcPath)
		if err == nil {
			err = preallocate(tmp, v.CapacityBytes)
		}
	case v.EncryptedDir() && v.SourceSnapshotID != "":
		err = m.restoreEncrypted(v, srcPath, tmp)
	case v.EncryptedDir() && srcPath != "":
		err = m.copyEncrypted("volume "+v.SourceVolumeID, srcPath, tmp, false)
	case v.SourceSnapshotID != "":
		err = m.eng.Restore(srcPath, tmp, v.CapacityBytes)
	case srcPath != "":
		err = m.eng.Clone(srcPath, tmp, v.CapacityBytes)
	default:
		err = m.eng.Create(tmp, v.CapacityBytes, dirMode)
	}
	if err == nil && (srcPath != "" || v.Image()) {
		// A restore, clone or image holds data: on disk before the record
		// that acknowledges it.
		err = syncFS(tmp)
	}
	return err
}

// holdSource read-holds and checks the source a create copies from, returning
// its path and release (a no-op without one). Errors: contract.ErrBusy,
// contract.ErrNotFound, contract.ErrInvalid, contract.ErrOutOfRange.
func (m *Store) holdSource(spec contract.CreateSpec) (string, func(), error) {
	nop := func() {}
	if spec.SourceSnapshotID == "" && spec.SourceVolumeID == "" {
		return "", nop, nil
	}
	kind, id, what := "volume", spec.SourceVolumeID, "a clone"
	if spec.SourceSnapshotID != "" {
		kind, id, what = "snapshot", spec.SourceSnapshotID, "a restore"
	}
	release, err := m.holds.read(id, what)
	if err != nil {
		return "", nop, err
	}
	var p, fsType string
	var accessType contract.AccessType
	var size int64
	if kind == "snapshot" {
		var s *contract.Snapshot
		if s, err = m.snaps.Get(id); err == nil {
			p, accessType, fsType, size = m.snapPath(s), s.AccessType, s.FsType, s.SizeBytes
		}
	} else {
		var v *contract.Volume
		if v, err = m.Get(id); err == nil {
			p, accessType, fsType, size = m.dataPath(v), v.AccessType, v.FsType, v.CapacityBytes
		}
	}
	if err == nil {
		err = checkSource(kind, id, accessType, fsType, size, spec)
	}
	if err == nil && fsType == "ext4" {
		err = checkSourceEncryption(kind, id, p, spec)
	}
	if err != nil {
		release()
		return "", nop, err
	}
	return p, release, nil
}

// ext4 superblock fields (at byte 1024 of the image): its magic number
// and the incompatible feature that marks a filesystem made to encrypt.
const (
	ext4SuperblockOffset = 1024
	ext4MagicAt          = 0x38
	ext4Magic            = 0xEF53
	ext4IncompatAt       = 0x60
	ext4IncompatEncrypt  = 0x10000
)

// checkSourceEncryption refuses (contract.ErrInvalid) a restore or clone
// whose class asks for encryption when its ext4 source image holds an
// unencrypted filesystem, or the other way round: the stage could never
// succeed. A source never staged holds no filesystem and fits either.
func checkSourceEncryption(kind, id, image string, spec contract.CreateSpec) error {
	f, err := os.Open(image)
	if err != nil {
		return err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, ext4SuperblockOffset); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	if binary.LittleEndian.Uint16(sb[ext4MagicAt:]) != ext4Magic {
		return nil
	}
	encrypted := binary.LittleEndian.Uint32(sb[ext4IncompatAt:])&ext4IncompatEncrypt != 0
	switch want := contract.Encrypted(spec.Parameters); {
	case encrypted && !want:
		return fmt.Errorf("%w: source %s %s holds an encrypted volume's data; restore or clone it with a StorageClass with %s: %s and the node-stage Secret it was made with", contract.ErrInvalid, kind, id, contract.ParamEncryption, contract.EncryptionFscrypt)
	case !encrypted && want:
		return fmt.Errorf("%w: source %s %s holds unencrypted data, which an encrypted volume cannot take; restore or clone it with a StorageClass without %s", contract.ErrInvalid, kind, id, contract.ParamEncryption)
	}
	return nil
}

func checkSource(kind, id string, accessType contract.AccessType, fsType string, size int64, spec contract.CreateSpec) error {
	if accessType != spec.AccessType {
		return fmt.Errorf("%w: source %s %s holds a %s volume, the request asks for %s", contract.ErrInvalid, kind, id, accessType, spec.AccessType)
	}
	if fsType != spec.FsType {
		return fmt.Errorf("%w: source %s %s holds %s, the request asks for %s", contract.ErrInvalid, kind, id, describeFs(fsType), describeFs(spec.FsType))
	}
	if spec.SizeBytes < size {
		return fmt.Errorf("%w: requested %d bytes, smaller than the %d bytes of source %s %s", contract.ErrOutOfRange, spec.SizeBytes, size, kind, id)
	}
	return nil
}

func describeFs(fsType string) string {
	if fsType == "" {
		return "a directory (no fs_type)"
	}
	return "an " + fsType + " filesystem"
}

// writeImage creates the image file dst of size bytes: sparse and empty, or
// a copy of the image src (reflinked where possible) grown to size.
func writeImage(dst, src string, size int64) error {
	out, err := unix.Open(dst, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	defer unix.Close(out)
	if src != "" {
		in, err := unix.Open(src, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(in)
		var st unix.Stat_t
		if err := unix.Fstat(in, &st); err != nil {
			return err
		}
		if st.Size > size {
			return fmt.Errorf("image %s holds %d bytes, more than the %d bytes asked for: an image is never cut short", src, st.Size, size)
		}
		if _, _, err := engine.CopyData(out, in); err != nil {
			return err
		}
	}
	return unix.Ftruncate(out, size)
}

// preallocate makes the image at path size bytes with disk blocks for all of
// it (fallocate(2) mode 0, which keeps data and shared extents; a full-size
// image is fully allocated even after a crash). A raw block volume must own
// its space: with a sparse one the data root can fill up under a pod's loop
// device and its writes fail, and a create or growth must get ENOSPC up front.
// Without fallocate: a sparse image. It never shrinks one.
func preallocate(path string, size int64) error {
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	err = unix.Fallocate(fd, 0, 0, size)
	if errors.Is(err, unix.EOPNOTSUPP) {
		var st unix.Stat_t
		if err = unix.Fstat(fd, &st); err == nil && st.Size < size {
			err = unix.Ftruncate(fd, size)
		}
	}
	if err != nil {
		return fmt.Errorf("allocate %d bytes for %s: %w", size, path, err)
	}
	return nil
}

// syncFS syncs the filesystem holding p (syncfs(2): one call for a copied
// tree), before the record acknowledging the data is committed.
func syncFS(p string) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", p, err)
	}
	return nil
}

func mapNoSpace(err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("%w: %v", contract.ErrNoSpace, err)
	}
	return err
}
