package volume

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// An encrypted directory volume (contract.Volume.EncryptedDir) lives on an
// ext4 data root made with the encrypt feature. Its directory is made
// plain and empty; its first stage, which has the node-stage Secret, sets a
// v2 policy on it with the key derived from the Secret and the record's
// KeySalt (pkg/publish). Every file in it is then encrypted, and readable
// only while that key is in the data root's keyring: between a stage and
// the last unstage of a volume encrypted with it. Snapshots, restores and
// clones carry the salt, so the same Secret unlocks them all and they have
// their source's key; they are copied file by file (the kernel offers no
// copy of ciphertext), so they need that key present: copyEncrypted. A
// restore made while it is not is filled from its snapshot at its first
// stage instead (FillFrom, FillPending), and the snapshot is kept until
// then.

// keySaltFor returns the KeySalt of the volume spec creates, checked
// against its source: nil unless it is an encrypted directory volume; for
// a restore or clone the source's (held by the caller), else a new one.
// Errors: contract.ErrInvalid for a data root that cannot encrypt, a
// source encrypted while the new volume is not, or the other way round;
// contract.ErrPrecondition for a source volume not yet filled (filled).
func (m *Store) keySaltFor(spec contract.CreateSpec) ([]byte, error) {
	want := spec.FsType == "" && spec.AccessType == contract.AccessMount && contract.Encrypted(spec.Parameters)
	if want {
		if m.eng.Name() != engine.Dir {
			return nil, fmt.Errorf("%w: parameter %s=%s: this node's data root is %s, which cannot encrypt a directory volume (fscrypt needs ext4 made with the encrypt feature); use csi.storage.k8s.io/fstype: ext4 for an encrypted image volume", contract.ErrInvalid, contract.ParamEncryption, contract.EncryptionFscrypt, m.eng.Name())
		}
		if err := fscrypt.Supported(m.volRoot); err != nil {
			return nil, fmt.Errorf("%w; or use csi.storage.k8s.io/fstype: ext4 for an encrypted image volume", err)
		}
	}
	var salt []byte
	kind, id := "", ""
	switch {
	case spec.SourceSnapshotID != "":
		s, err := m.snaps.Get(spec.SourceSnapshotID)
		if err != nil {
			return nil, err
		}
		if s.Image() {
			return nil, nil // checkSourceEncryption's
		}
		salt, kind, id = s.KeySalt, "snapshot", s.ID
	case spec.SourceVolumeID != "":
		v, err := m.Get(spec.SourceVolumeID)
		if err != nil {
			return nil, err
		}
		if v.Image() {
			return nil, nil
		}
		if err := filled(v); err != nil {
			return nil, err
		}
		salt, kind, id = v.KeySalt, "volume", v.ID
	case want:
		return fscrypt.NewSalt()
	default:
		return nil, nil
	}
	switch {
	case salt != nil && !want:
		return nil, fmt.Errorf("%w: source %s %s holds an encrypted volume's data; restore or clone it with a StorageClass with %s: %s and the node-stage Secret it was made with", contract.ErrInvalid, kind, id, contract.ParamEncryption, contract.EncryptionFscrypt)
	case salt == nil && want:
		return nil, fmt.Errorf("%w: source %s %s holds unencrypted data, which an encrypted volume cannot take; restore or clone it with a StorageClass without %s", contract.ErrInvalid, kind, id, contract.ParamEncryption)
	}
	return salt, nil
}

// copyEncrypted copies the tree of encrypted directory volume or snapshot
// what (for errors) at src to dst, which must not exist, with the policy
// of src: a src never staged has none and is copied as it is (empty).
// Reading and writing the files needs src's key in the data root's
// keyring, held there for the copy (Node.HoldKey): contract.ErrPrecondition
// when it is absent. strict: src must not change (a snapshot;
// CopySnapshotTree).
func (m *Store) copyEncrypted(what, src, dst string, strict bool) error {
	id, ok, err := fscrypt.Policy(src)
	switch {
	case err != nil:
		return err
	case !ok && strict:
		_, err = engine.CopySnapshotTree(src, dst)
		return err
	case !ok:
		_, err = engine.CopyTree(src, dst)
		return err
	}
	release, present, err := m.node.HoldKey(id)
	if err != nil {
		return err
	}
	if !present {
		return fmt.Errorf("%w: %w", errKeyAbsent, m.keyAbsent(what, id))
	}
	defer release()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	if err := fscrypt.SetPolicy(dst, id); err != nil {
		return err
	}
	if _, err := engine.CopyTreeInto(src, dst, strict); err != nil {
		if errors.Is(err, unix.ENOKEY) {
			return m.keyAbsent(what, id)
		}
		return err
	}
	return nil
}

// errKeyAbsent marks copyEncrypted's refusal before it made anything.
var errKeyAbsent = errors.New("the key is absent")

func (m *Store) keyAbsent(what string, id fscrypt.Identifier) error {
	return fmt.Errorf("%w: %s is encrypted (key identifier %s) and its key is not on this node now: a copy of an encrypted directory volume (snapshot, restore, clone) reads its files, which needs the key, present only while a volume encrypted with it is staged here; retry while a pod uses the volume (or a restore or clone of it)", contract.ErrPrecondition, what, id)
}

// filled refuses (contract.ErrPrecondition) to copy volume v while it
// waits for its first stage to fill it (FillFrom).
func filled(v *contract.Volume) error {
	if v.FillFrom == "" {
		return nil
	}
	return fmt.Errorf("%w: volume %s is restored from snapshot %s at its first stage, which has not happened yet; a snapshot or clone of it can be taken once a pod has used it", contract.ErrPrecondition, v.ID, v.FillFrom)
}

// restoreEncrypted writes at tmp the restore v of encrypted directory
// snapshot src: a copy when its key is on the node (copyEncrypted), else
// an empty directory that its first stage fills (v.FillFrom is set).
func (m *Store) restoreEncrypted(v *contract.Volume, src, tmp string) error {
	err := m.copyEncrypted("snapshot "+v.SourceSnapshotID, src, tmp, true)
	if !errors.Is(err, errKeyAbsent) {
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	v.FillFrom = v.SourceSnapshotID
	return nil
}

// FillPending fills encrypted directory volume v (FillFrom set, staged now
// by its first stage, under its lock) from its snapshot, with key id (the
// stage's Secret's, in the keyring): v's directory is encrypted with id
// and the snapshot's tree copied into it, synced, and the record forgets
// FillFrom; a fill a crash cut short is emptied and done again. It returns
// v as recorded then. Errors: contract.ErrInvalid when id is not the
// snapshot's key (the Secret does not unlock it); the copy's.
func (m *Store) FillPending(v *contract.Volume, id fscrypt.Identifier) (*contract.Volume, error) {
	release, err := m.holds.read(v.FillFrom, "a restore's fill")
	if err != nil {
		return nil, err
	}
	defer release()
	s, err := m.snaps.Get(v.FillFrom)
	if err != nil {
		return nil, err
	}
	src, dir := m.snapPath(s), m.volDir(v.ID)
	for _, p := range []string{src, dir} {
		have, ok, err := fscrypt.Policy(p)
		if err != nil {
			return nil, err
		}
		if ok && have != id {
			return nil, fmt.Errorf("%w: the node-stage Secret's key does not unlock volume %s (it gives key identifier %s; the snapshot %s it is restored from is encrypted with %s): use the Secret the snapshot's volume was made with", contract.ErrInvalid, v.ID, id, s.ID, have)
		}
		if p == dir && ok {
			if err := removeChildren(dir); err != nil {
				return nil, err
			}
		} else if p == dir {
			if err := fscrypt.SetPolicy(dir, id); err != nil {
				return nil, err
			}
		}
	}
	if _, err := engine.CopyTreeInto(src, dir, true); err != nil {
		return nil, fmt.Errorf("fill volume %s from snapshot %s: %w", v.ID, s.ID, err)
	}
	if err := syncFS(dir); err != nil {
		return nil, err
	}
	filled := *v
	filled.FillFrom = ""
	if err := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(&filled) }); err != nil {
		return nil, err
	}
	klog.InfoS("Encrypted directory volume filled from its snapshot at its first stage", "volumeID", v.ID, "snapshotID", s.ID)
	return &filled, nil
}

// removeChildren removes what directory dir holds.
func removeChildren(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// fillingFrom returns a volume that its first stage fills from snapshot
// id, or "": the snapshot is kept until then.
func (m *Store) fillingFrom(id string) (string, error) {
	vols, _, err := m.List("", 0)
	for _, v := range vols {
		if v.FillFrom == id {
			return v.ID, err
		}
	}
	return "", err
}
