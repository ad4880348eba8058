package publish

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
)

// An encrypted image volume (contract.ParamEncryption) is an ext4
// filesystem made with the encrypt feature whose root holds the salt of its
// key (fscrypt.SaltFile) and the data directory, EncryptedDataDir, which
// carries a v2 policy and is what the pods see. The root itself cannot be
// encrypted (the kernel refuses a policy on a filesystem's root). The key
// is added to the filesystem at every stage and removed when its last mount
// goes; the kernel drops the filesystem's keyring with it in any case.

// EncryptedDataDir is the directory of an encrypted image volume's
// filesystem that its publications show.
const EncryptedDataDir = "data"

// encryptFormatOptions are mkfs.ext4's options for an encrypted volume.
var encryptFormatOptions = []string{"-O", "encrypt"}

// publishedRoot is the directory of image volume v's filesystem, staged at
// stagingPath, that a publication shows.
func publishedRoot(v *contract.Volume, stagingPath string) string {
	if contract.Encrypted(v.Parameters) {
		return filepath.Join(stagingPath, EncryptedDataDir)
	}
	return stagingPath
}

// unlockImage adds the key of encrypted volume v, derived from secrets and
// the salt on its filesystem (staged at stagingPath), and encrypts its data
// directory with it when that is new. At the first stage the salt is new:
// it is written only once its key has been added, so a stage refused
// before (a filesystem that cannot encrypt) leaves the volume as it was;
// the data directory is made and encrypted after, and one a crash left
// empty without its policy gets it. Errors: contract.ErrInvalid when the
// key does not unlock the volume (its data directory has another key's
// policy) or the Secret is unusable; contract.ErrPrecondition when the
// filesystem cannot encrypt (a restore of an unencrypted volume) or its
// data directory holds unencrypted files. A key this call added is removed
// again when it fails.
func (pb *Publisher) unlockImage(v *contract.Volume, stagingPath string, secrets map[string]string) error {
	salt, fresh, err := fscrypt.Salt(stagingPath)
	if err != nil {
		return err
	}
	key, err := fscrypt.Key(secrets, salt)
	if err != nil {
		return err
	}
	id, err := fscrypt.AddKey(stagingPath, key)
	clear(key)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	data := filepath.Join(stagingPath, EncryptedDataDir)
	if fresh {
		err = fscrypt.WriteSalt(stagingPath, salt)
	}
	if err == nil {
		if err = os.Mkdir(data, 0o777); errors.Is(err, os.ErrExist) {
			err = nil
		}
	}
	if err == nil {
		err = encryptData(v, data, id)
	}
	if err != nil {
		if _, rerr := fscrypt.RemoveKey(stagingPath, id); rerr != nil {
			klog.ErrorS(rerr, "Could not remove the encryption key of a failed stage", "volumeID", v.ID)
		}
		return err
	}
	klog.V(2).InfoS("Encrypted volume unlocked", "volumeID", v.ID, "keyIdentifier", id)
	return nil
}

// encryptData verifies that the data directory of volume v is encrypted
// with key id, or encrypts it when it has no policy and is empty.
func encryptData(v *contract.Volume, data string, id fscrypt.Identifier) error {
	have, ok, err := fscrypt.Policy(data)
	switch {
	case err != nil:
		return err
	case !ok:
		if err := fscrypt.SetPolicy(data, id); err != nil {
			if errors.Is(err, contract.ErrPrecondition) {
				return fmt.Errorf("%w: volume %s: its data directory holds unencrypted files (was it restored from an unencrypted volume?); restore it with a StorageClass without %s", contract.ErrPrecondition, v.ID, contract.ParamEncryption)
			}
			return err
		}
	case have != id:
		return fmt.Errorf("%w: the node-stage Secret's key does not unlock volume %s (it gives key identifier %s; the volume is encrypted with %s): use the Secret the volume (or the volume it was restored or cloned from) was made with", contract.ErrInvalid, v.ID, id, have)
	}
	return nil
}

// refuseEncrypted refuses (contract.ErrPrecondition) to stage volume v
// without encryption when its filesystem, staged at stagingPath, holds an
// encrypted volume's data: a data directory with a policy, which a pod of
// an unencrypted volume cannot make (its filesystem has no encrypt
// feature), whatever files it creates. CreateVolume refuses such a restore
// or clone already; this holds for an image changed by other means.
func refuseEncrypted(v *contract.Volume, stagingPath string) error {
	_, ok, err := fscrypt.Policy(filepath.Join(stagingPath, EncryptedDataDir))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !ok:
		return nil
	}
	return fmt.Errorf("%w: volume %s holds the data of an encrypted volume (restored or cloned from one); use a StorageClass with %s: %s and the same node-stage Secret", contract.ErrPrecondition, v.ID, contract.ParamEncryption, contract.EncryptionFscrypt)
}

// lockImage removes the key of encrypted volume v from its filesystem,
// staged at stagingPath, before that last mount goes. A key still in use
// by open files is "incompletely removed" and goes when they close.
func lockImage(v *contract.Volume, stagingPath string) error {
	id, ok, err := fscrypt.Policy(filepath.Join(stagingPath, EncryptedDataDir))
	if err != nil || !ok {
		if errors.Is(err, os.ErrNotExist) {
			err = nil
		}
		return err
	}
	busy, err := fscrypt.RemoveKey(stagingPath, id)
	if err != nil {
		return err
	}
	if busy {
		klog.InfoS("Encryption key removed while files of the volume are still open; they lock when closed", "volumeID", v.ID, "keyIdentifier", id)
		return nil
	}
	klog.V(2).InfoS("Encrypted volume locked", "volumeID", v.ID, "keyIdentifier", id)
	return nil
}

// An encrypted directory volume (pkg/volume's encrypt.go) has its key on
// the data root's keyring, which every volume on that filesystem shares,
// and copies of a volume share its key. Keys of different volumes are kept
// apart by their identifiers: a directory's policy names the one key that
// opens it, and a key unlocks only the directories whose policy names it.
// A key is removed at the unstage that leaves no staged volume encrypted
// with it (usedKeys); keyMu orders that against the stages.

// stageEncryptedDir adds the key of encrypted directory volume v, derived
// from secrets and its KeySalt, encrypts its directory with it at the
// first stage (when it is empty and has no policy; a restore made while
// the key was not on the node is filled then: FillPending),
// and bind-mounts the directory at stagingPath. When that fails the key
// is removed unless a staged volume uses it. Errors as unlockImage's.
func (pb *Publisher) stageEncryptedDir(v *contract.Volume, stagingPath string, mf mount.Flags, secrets map[string]string) error {
	key, err := fscrypt.Key(secrets, v.KeySalt)
	if err != nil {
		return err
	}
	defer clear(key)
	dir := pb.vols.DataPath(v)
	pb.keyMu.Lock()
	defer pb.keyMu.Unlock()
	id, err := fscrypt.AddKey(dir, key)
	if err != nil {
		return fmt.Errorf("volume %s: %w", v.ID, err)
	}
	if v.FillFrom != "" {
		// A fill copies the whole snapshot: the other stages and unstages
		// go on meanwhile, and keep the key it uses.
		pb.keyHolds[id]++
		pb.keyMu.Unlock()
		var filled *contract.Volume
		filled, err = pb.vols.FillPending(v, id)
		pb.keyMu.Lock()
		if pb.keyHolds[id]--; pb.keyHolds[id] == 0 {
			delete(pb.keyHolds, id)
		}
		if err == nil {
			v = filled
		}
	}
	if err == nil {
		err = encryptData(v, dir, id)
	}
	if err == nil {
		err = pb.mnt.Bind(mount.Bind{Source: dir, Target: stagingPath, Flags: mf})
	}
	if err != nil {
		if rerr := pb.removeUnusedKey(id); rerr != nil {
			klog.ErrorS(rerr, "Could not remove the encryption key of a failed stage", "volumeID", v.ID)
		}
		return err
	}
	klog.V(2).InfoS("Encrypted directory volume unlocked", "volumeID", v.ID, "keyIdentifier", id)
	return nil
}

// unstageEncryptedDir unmounts encrypted directory volume v's stage at
// stagingPath and removes its key unless a staged volume still uses it
// (a publication left behind keeps it until its unpublish: lockDirAfter).
func (pb *Publisher) unstageEncryptedDir(v *contract.Volume, stagingPath string) error {
	pb.keyMu.Lock()
	defer pb.keyMu.Unlock()
	if err := pb.mnt.Unmount(stagingPath); err != nil {
		return err
	}
	return pb.lockDir(v)
}

// HoldKey keeps key id in the data root's keyring until release, for a
// copy of an encrypted directory volume (pkg/volume), if it is there:
// an unstage meanwhile keeps it, and the release removes it unless a
// staged volume or another copy still uses it.
func (pb *Publisher) HoldKey(id fscrypt.Identifier) (func(), bool, error) {
	pb.keyMu.Lock()
	defer pb.keyMu.Unlock()
	st, err := fscrypt.Status(pb.root, id)
	if err != nil || st != fscrypt.KeyPresent {
		return nil, false, err
	}
	pb.keyHolds[id]++
	return func() {
		pb.keyMu.Lock()
		defer pb.keyMu.Unlock()
		if pb.keyHolds[id]--; pb.keyHolds[id] > 0 {
			return
		}
		delete(pb.keyHolds, id)
		if err := pb.removeUnusedKey(id); err != nil {
			klog.ErrorS(err, "Could not remove an encryption key after a copy", "keyIdentifier", id)
		}
	}, true, nil
}

// lockDirAfter removes the key of encrypted directory volume v unless a
// staged volume uses it, after an unpublish: the unstage may have come
// first (the CSI order is the other, which leaves it to the unstage).
func (pb *Publisher) lockDirAfter(v *contract.Volume) error {
	pb.keyMu.Lock()
	defer pb.keyMu.Unlock()
	return pb.lockDir(v)
}

// lockDir removes the key of encrypted directory volume v unless a staged
// volume (v itself staged elsewhere too) uses it; keyMu is held.
func (pb *Publisher) lockDir(v *contract.Volume) error {
	dir := pb.vols.DataPath(v)
	id, ok, err := fscrypt.Policy(dir)
	if err != nil || !ok {
		return err
	}
	return pb.removeUnusedKey(id)
}

// removeUnusedKey removes key id from the keyring of the data root unless
// a staged volume or a copy uses it; keyMu is held. The ioctl goes through
// the data root's directory: an fd on a directory encrypted with the key
// would keep it busy ("incompletely removed"). A key whose files are still
// open is removed again by retryRemovals until it is gone.
func (pb *Publisher) removeUnusedKey(id fscrypt.Identifier) error {
	used, err := pb.usedKeys()
	if err != nil {
		return err
	}
	if used[id] {
		klog.V(2).InfoS("Encryption key kept: a staged volume uses it", "keyIdentifier", id)
		return nil
	}
	busy, err := fscrypt.RemoveKey(pb.root, id)
	if err != nil {
		return err
	}
	if !busy {
		klog.V(2).InfoS("Encryption key removed", "keyIdentifier", id)
		return nil
	}
	klog.InfoS("Encryption key removed while files encrypted with it are still open; removed again once they are closed", "keyIdentifier", id)
	if len(pb.busyKeys) == 0 {
		go pb.retryRemovals()
	}
	pb.busyKeys[id] = true
	return nil
}

// Pauses between retryRemovals' tries: the first, doubling up to the
// last.
const (
	keyRetryFirst = time.Second
	keyRetryMax   = time.Minute
)

// retryRemovals removes the busy keys again, at growing intervals, until
// each is gone (its files closed) or used by a stage again; it returns
// when none is left.
func (pb *Publisher) retryRemovals() {
	for wait := keyRetryFirst; ; wait = min(2*wait, keyRetryMax) {
		time.Sleep(wait)
		pb.keyMu.Lock()
		used, err := pb.usedKeys()
		for id := range pb.busyKeys {
			if err != nil {
				break
			}
			busy := false
			if !used[id] {
				busy, err = fscrypt.RemoveKey(pb.root, id)
			}
			if err == nil && !busy {
				delete(pb.busyKeys, id)
				klog.V(2).InfoS("Encryption key removed, its files closed", "keyIdentifier", id, "stillUsed", used[id])
			}
		}
		if errors.Is(err, os.ErrNotExist) { // the data root is gone
			clear(pb.busyKeys)
		}
		left := len(pb.busyKeys)
		pb.keyMu.Unlock()
		if err != nil {
			klog.ErrorS(err, "Could not remove an encryption key whose files were open; trying again")
		}
		if left == 0 {
			return
		}
	}
}

// usedKeys returns the identifiers of the keys of the mounted (staged or
// published) encrypted directory volumes and of the copies in progress
// (keyHolds); keyMu is held.
func (pb *Publisher) usedKeys() (map[fscrypt.Identifier]bool, error) {
	vols, err := pb.vols.EncryptedDirs()
	if err != nil {
		return nil, err
	}
	used := map[fscrypt.Identifier]bool{}
	for id := range pb.keyHolds {
		used[id] = true
	}
	for _, v := range vols {
		p := pb.vols.DataPath(v)
		mounted, err := pb.mnt.InUse(p)
		if err != nil {
			return nil, err
		}
		if !mounted {
			continue
		}
		id, ok, err := fscrypt.Policy(p)
		if err != nil {
			return nil, err
		}
		if ok {
			used[id] = true
		}
	}
	return used, nil
}

// LockUnused removes from the data root's keyring the keys of encrypted
// directory volumes and their snapshots that no staged volume uses: what a
// process killed between adding a key and mounting, or between unmounting
// and removing it, left. A key added for a volume's first stage and left
// before its directory got the policy encrypts nothing, and nothing names
// it: it stays until the kernel drops the keyring (the data root's
// unmount). Run at start, before the node serves.
func (pb *Publisher) LockUnused() error {
	pb.keyMu.Lock()
	defer pb.keyMu.Unlock()
	vols, err := pb.vols.EncryptedDirs()
	if err != nil {
		return err
	}
	dirs, err := pb.vols.EncryptedSnapshotDirs()
	if err != nil {
		return err
	}
	for _, v := range vols {
		dirs = append(dirs, pb.vols.DataPath(v))
	}
	used, err := pb.usedKeys()
	if err != nil {
		return err
	}
	var errs []error
	for _, dir := range dirs {
		id, ok, err := fscrypt.Policy(dir)
		if err != nil || !ok || used[id] {
			errs = append(errs, err)
			continue
		}
		used[id] = true // removed once
		if st, err := fscrypt.Status(pb.root, id); err != nil || st == fscrypt.KeyAbsent {
			errs = append(errs, err)
			continue
		}
		if _, err := fscrypt.RemoveKey(pb.root, id); err != nil {
			errs = append(errs, err)
			continue
		}
		klog.V(2).InfoS("Encryption key of unstaged data removed at start", "path", dir, "keyIdentifier", id)
	}
	return errors.Join(errs...)
}
