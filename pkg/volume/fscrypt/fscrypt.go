// Package fscrypt locks and unlocks localdir's encrypted volumes with the
// kernel's filesystem encryption (Documentation/filesystems/fscrypt.rst):
// v2 policies (AES-256-XTS contents, AES-256-CTS names, 32-byte name
// padding) on a volume's data directory, and their master keys added to
// and removed from the filesystem's keyring with the fscrypt ioctls of
// golang.org/x/sys/unix.
//
// A volume's master key is never the user's secret itself: it is derived
// from the node-stage Secret (Key) and a random salt kept on the volume's
// filesystem next to its data directory (Salt, WriteSalt). A snapshot,
// restore or clone carries the salt with the data, so the same Secret
// unlocks every copy, and every copy has its source's master key; two
// volumes made apart and given the same Secret get different master keys,
// and so different key identifiers.
package fscrypt

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	"golang.org/x/crypto/argon2"
	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Secret keys of the node-stage Secret: exactly one of them.
const (
	// SecretKey is a key of at least MinKeyBytes random bytes, in hex
	// (openssl rand -hex 32): CSI secrets are strings, which gRPC requires
	// to be UTF-8, so a key of raw bytes cannot be passed.
	SecretKey = "key"
	// SecretPassphrase is a passphrase of at least MinPassphraseChars
	// characters, stretched with Argon2id. It is used byte for byte, as
	// stored: nothing is trimmed.
	SecretPassphrase = "passphrase"
	// MinKeyBytes is the shortest raw key accepted.
	MinKeyBytes = 32
	// MinPassphraseChars is the shortest passphrase accepted, in
	// characters (UTF-8).
	MinPassphraseChars = 12
)

// Argon2id cost of a passphrase (RFC 9106's second recommended option:
// 1 pass over 64 MiB, 4 lanes), paid once per stage. At most
// MaxConcurrentPassphrases run at once in a process, so that a node
// staging many passphrase volumes together (after a reboot) stays within
// its memory limit; the others wait.
const (
	argonTime    = 1
	argonMemKiB  = 64 * 1024
	argonThreads = 4

	MaxConcurrentPassphrases = 2
)

var (
	argonSlots = make(chan struct{}, MaxConcurrentPassphrases)
	argonKey   = argon2.IDKey // replaced by tests that count concurrent runs
)

// masterKeyBytes is the size of a derived master key: FSCRYPT_MAX_KEY_SIZE,
// as long as AES-256-XTS's key, so the kernel accepts it for any mode.
const masterKeyBytes = unix.FSCRYPT_MAX_KEY_SIZE

// SaltFile is the name of the salt's file at the root of a volume's
// filesystem; SaltBytes its size.
const (
	SaltFile  = ".localdir-fscrypt-salt"
	SaltBytes = 32
)

// Identifier is a master key's identifier (FSCRYPT_KEY_IDENTIFIER_SIZE
// bytes), which the kernel computes from the key and records in a policy.
type Identifier [unix.FSCRYPT_KEY_IDENTIFIER_SIZE]byte

func (id Identifier) String() string { return hex.EncodeToString(id[:]) }

// Key derives a volume's master key from its node-stage Secret and salt:
// HKDF-SHA512 over the raw key, or over Argon2id of the passphrase.
// Errors: contract.ErrInvalid saying what is missing or too short (never
// the secret).
func Key(secrets map[string]string, salt []byte) ([]byte, error) {
	if err := CheckSecret(secrets); err != nil {
		return nil, err
	}
	ikm, _ := hex.DecodeString(strings.TrimSpace(secrets[SecretKey]))
	if pass, ok := secrets[SecretPassphrase]; ok {
		argonSlots <- struct{}{}
		p := []byte(pass)
		ikm = argonKey(p, salt, argonTime, argonMemKiB, argonThreads, masterKeyBytes)
		clear(p)
		<-argonSlots
	}
	defer clear(ikm)
	return hkdf.Key(sha512.New, ikm, salt, "localdir.csi.dev fscrypt master key v1", masterKeyBytes)
}

// CheckSecret judges a node-stage Secret before anything is touched: one of
// SecretKey and SecretPassphrase, long enough. Errors: contract.ErrInvalid.
func CheckSecret(secrets map[string]string) error {
	raw, hasRaw := secrets[SecretKey]
	pass, hasPass := secrets[SecretPassphrase]
	switch {
	case hasRaw && hasPass:
		return fmt.Errorf("%w: the node-stage Secret has both %q and %q; give one", contract.ErrInvalid, SecretKey, SecretPassphrase)
	case hasRaw:
		b, err := hex.DecodeString(strings.TrimSpace(raw))
		defer clear(b)
		if err != nil {
			return fmt.Errorf("%w: the node-stage Secret's %q is not hexadecimal; write the key as hex (openssl rand -hex 32)", contract.ErrInvalid, SecretKey)
		}
		if len(b) < MinKeyBytes {
			return fmt.Errorf("%w: the node-stage Secret's %q holds %d bytes; an encryption key needs at least %d random bytes (%d hex digits)", contract.ErrInvalid, SecretKey, len(b), MinKeyBytes, 2*MinKeyBytes)
		}
	case hasPass && utf8.RuneCountInString(pass) < MinPassphraseChars:
		return fmt.Errorf("%w: the node-stage Secret's %q has %d characters; a passphrase needs at least %d", contract.ErrInvalid, SecretPassphrase, utf8.RuneCountInString(pass), MinPassphraseChars)
	case !hasRaw && !hasPass && len(secrets) == 0:
		return fmt.Errorf("%w: an encrypted volume needs the StorageClass's node-stage Secret (csi.storage.k8s.io/node-stage-secret-name and -namespace) with %q or %q; the request has none", contract.ErrInvalid, SecretKey, SecretPassphrase)
	case !hasRaw && !hasPass:
		// Only names that differ from ours in case are repeated: a Secret
		// key's name may itself hold what should stay secret.
		var near []string
		for _, k := range slices.Sorted(maps.Keys(secrets)) {
			if strings.EqualFold(k, SecretKey) || strings.EqualFold(k, SecretPassphrase) {
				near = append(near, k)
			}
		}
		why := fmt.Sprintf("it has %d other key(s)", len(secrets))
		if len(near) > 0 {
			why = fmt.Sprintf("it has %s: keys are case-sensitive", strings.Join(near, ", "))
		}
		return fmt.Errorf("%w: the node-stage Secret has neither %q nor %q (%s)", contract.ErrInvalid, SecretKey, SecretPassphrase, why)
	}
	return nil
}

// Salt returns dir's salt (ReadSalt) or, when it has none, a new random
// one (fresh), which is not written: WriteSalt keeps it once the key it
// gives has been added, so a stage that fails leaves nothing behind.
func Salt(dir string) (salt []byte, fresh bool, err error) {
	if salt, err := ReadSalt(dir); err == nil || !errors.Is(err, os.ErrNotExist) {
		return salt, false, err
	}
	salt, err = NewSalt()
	return salt, err == nil, err
}

// NewSalt returns a new random salt of SaltBytes.
func NewSalt() ([]byte, error) {
	salt := make([]byte, SaltBytes)
	if _, err := rand.Read(salt); err != nil {
		return nil, err
	}
	return salt, nil
}

// WriteSalt writes salt into dir's SaltFile, durably (written to a
// temporary file, synced, renamed, the directory synced).
func WriteSalt(dir string, salt []byte) error {
	tmp := filepath.Join(dir, SaltFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(salt)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, SaltFile))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write the encryption salt in %s: %w", dir, err)
	}
	return nil
}

// ReadSalt reads dir's SaltFile. Errors: os.ErrNotExist when there is none;
// a wrong size is an error too.
func ReadSalt(dir string) ([]byte, error) {
	salt, err := os.ReadFile(filepath.Join(dir, SaltFile))
	if err != nil {
		return nil, err
	}
	if len(salt) != SaltBytes {
		return nil, fmt.Errorf("%w: the encryption salt %s has %d bytes, not %d", contract.ErrPrecondition, filepath.Join(dir, SaltFile), len(salt), SaltBytes)
	}
	return salt, nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ioctl runs an fscrypt ioctl on the directory (or file) at p.
func ioctl(p string, req uint, arg unsafe.Pointer) error {
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		if errno == unix.EINTR {
			continue
		}
		if errno != 0 {
			return errno
		}
		return nil
	}
}

// AddKey adds key to the keyring of the filesystem that holds mnt
// (FS_IOC_ADD_ENCRYPTION_KEY) and returns its identifier. Adding a key
// that is there already is success. Errors: contract.ErrPrecondition when
// the filesystem cannot encrypt (no encrypt feature, or no fscrypt).
func AddKey(mnt string, key []byte) (Identifier, error) {
	var id Identifier
	buf := make([]byte, unsafe.Sizeof(unix.FscryptAddKeyArg{})+uintptr(len(key)))
	arg := (*unix.FscryptAddKeyArg)(unsafe.Pointer(&buf[0]))
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	arg.Raw_size = uint32(len(key))
	copy(buf[unsafe.Sizeof(*arg):], key)
	err := ioctl(mnt, unix.FS_IOC_ADD_ENCRYPTION_KEY, unsafe.Pointer(&buf[0]))
	copy(id[:], arg.Key_spec.U[:len(id)])
	clear(buf)
	switch {
	case errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY):
		return id, fmt.Errorf("%w: the filesystem at %s cannot encrypt (made without the encrypt feature, or a kernel without fscrypt)", contract.ErrPrecondition, mnt)
	case err != nil:
		return id, fmt.Errorf("add the volume's encryption key to the filesystem at %s: %w", mnt, err)
	}
	return id, nil
}

// RemoveKey removes the key id from the keyring of the filesystem that
// holds mnt, for all users (FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS), so its
// files are ciphertext again. A key that is not there is success. Files
// still open keep it "incompletely removed" until they close: busy says so.
func RemoveKey(mnt string, id Identifier) (busy bool, err error) {
	var arg unix.FscryptRemoveKeyArg
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	copy(arg.Key_spec.U[:], id[:])
	err = ioctl(mnt, unix.FS_IOC_REMOVE_ENCRYPTION_KEY_ALL_USERS, unsafe.Pointer(&arg))
	if errors.Is(err, unix.ENOKEY) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("remove the volume's encryption key from the filesystem at %s: %w", mnt, err)
	}
	return arg.Removal_status_flags&unix.FSCRYPT_KEY_REMOVAL_STATUS_FLAG_FILES_BUSY != 0, nil
}

// KeyStatus is a key's state in a filesystem's keyring.
type KeyStatus uint32

// The states FS_IOC_GET_ENCRYPTION_KEY_STATUS reports.
const (
	KeyAbsent              KeyStatus = unix.FSCRYPT_KEY_STATUS_ABSENT
	KeyPresent             KeyStatus = unix.FSCRYPT_KEY_STATUS_PRESENT
	KeyIncompletelyRemoved KeyStatus = unix.FSCRYPT_KEY_STATUS_INCOMPLETELY_REMOVED
)

func (s KeyStatus) String() string {
	switch s {
	case KeyAbsent:
		return "absent"
	case KeyPresent:
		return "present"
	case KeyIncompletelyRemoved:
		return "incompletely removed"
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// Status reports whether key id is in the keyring of the filesystem that
// holds mnt (FS_IOC_GET_ENCRYPTION_KEY_STATUS).
func Status(mnt string, id Identifier) (KeyStatus, error) {
	var arg unix.FscryptGetKeyStatusArg
	arg.Key_spec.Type = unix.FSCRYPT_KEY_SPEC_TYPE_IDENTIFIER
	copy(arg.Key_spec.U[:], id[:])
	if err := ioctl(mnt, unix.FS_IOC_GET_ENCRYPTION_KEY_STATUS, unsafe.Pointer(&arg)); err != nil {
		return 0, fmt.Errorf("encryption key status on the filesystem at %s: %w", mnt, err)
	}
	return KeyStatus(arg.Status), nil
}

// Supported reports whether the filesystem that holds dir can encrypt:
// contract.ErrInvalid when it cannot (no encrypt feature, a filesystem
// without fscrypt), asked with FS_IOC_GET_ENCRYPTION_KEY_STATUS, which
// ext4 answers only with the feature.
func Supported(dir string) error {
	_, err := Status(dir, Identifier{})
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY) {
		return fmt.Errorf("%w: the filesystem of %s cannot encrypt: fscrypt needs ext4 made with the encrypt feature (mkfs.ext4 -O encrypt, or tune2fs -O encrypt while unmounted)", contract.ErrInvalid, dir)
	}
	return err
}

// Policy returns the identifier of the key of dir's v2 policy
// (FS_IOC_GET_ENCRYPTION_POLICY_EX); ok is false for an unencrypted dir.
// Errors: contract.ErrPrecondition for a policy localdir does not make.
func Policy(dir string) (id Identifier, ok bool, err error) {
	var arg unix.FscryptGetPolicyExArg
	arg.Size = uint64(len(arg.Policy))
	err = ioctl(dir, unix.FS_IOC_GET_ENCRYPTION_POLICY_EX, unsafe.Pointer(&arg))
	switch {
	case errors.Is(err, unix.ENODATA) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOTTY):
		return id, false, nil
	case err != nil:
		return id, false, fmt.Errorf("read the encryption policy of %s: %w", dir, err)
	}
	p := (*unix.FscryptPolicyV2)(unsafe.Pointer(&arg.Policy[0]))
	if p.Version != unix.FSCRYPT_POLICY_V2 {
		return id, false, fmt.Errorf("%w: %s has an encryption policy of version %d that localdir did not set", contract.ErrPrecondition, dir, p.Version)
	}
	return Identifier(p.Master_key_identifier), true, nil
}

// SetPolicy encrypts the empty directory dir with key id (a v2 policy;
// the key must have been added). Setting the same policy again is success.
// Errors: contract.ErrPrecondition when dir is not empty or holds another
// policy.
func SetPolicy(dir string, id Identifier) error {
	p := unix.FscryptPolicyV2{
		Version:                   unix.FSCRYPT_POLICY_V2,
		Contents_encryption_mode:  unix.FSCRYPT_MODE_AES_256_XTS,
		Filenames_encryption_mode: unix.FSCRYPT_MODE_AES_256_CTS,
		Flags:                     unix.FSCRYPT_POLICY_FLAGS_PAD_32,
		Master_key_identifier:     id,
	}
	err := ioctl(dir, unix.FS_IOC_SET_ENCRYPTION_POLICY, unsafe.Pointer(&p))
	switch {
	case errors.Is(err, unix.EEXIST):
		return fmt.Errorf("%w: %s is encrypted with another key", contract.ErrPrecondition, dir)
	case errors.Is(err, unix.ENOTEMPTY):
		return fmt.Errorf("%w: %s is not empty, so it cannot be encrypted", contract.ErrPrecondition, dir)
	case err != nil:
		return fmt.Errorf("encrypt %s: %w", dir, err)
	}
	return nil
}
