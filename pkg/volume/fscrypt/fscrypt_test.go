package fscrypt

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// encryptFS mounts a new 64 MiB ext4 filesystem made with the encrypt
// feature (on a loop device over an image in a temp dir) and returns the
// mount point and the image; both go away with the test.
func encryptFS(t *testing.T, feature string) (mnt, img string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: mounts a loop-backed ext4 filesystem (make test runs it as root)")
	}
	dir := t.TempDir()
	img, mnt = filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	args := []string{"-q", "-F", "-O", feature, img, "64M"}
	if out, err := exec.Command("mkfs.ext4", args...).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %v: %v: %s", args, err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount %s: %v: %s", img, err, out)
	}
	t.Cleanup(func() { umount(t, mnt) })
	return mnt, img
}

func umount(t *testing.T, mnt string) {
	t.Helper()
	if out, err := exec.Command("umount", mnt).CombinedOutput(); err != nil && !strings.Contains(string(out), "not mounted") {
		t.Errorf("umount %s: %v: %s", mnt, err, out)
	}
}

// A volume's data directory encrypted with a key derived from a Secret:
// readable while the key is added, names and contents ciphertext once it
// is removed (and on the raw image), readable again with the same Secret,
// never with another one.
func TestEncryptLockUnlock(t *testing.T) {
	mnt, img := encryptFS(t, "encrypt")
	secret := map[string]string{SecretKey: strings.Repeat("6b", 40)}
	salt, fresh, err := Salt(mnt)
	if err != nil || !fresh {
		t.Fatalf("Salt of a new filesystem: fresh %v, %v", fresh, err)
	}
	if _, err := os.Lstat(filepath.Join(mnt, SaltFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Salt wrote the salt file (%v); only WriteSalt may", err)
	}
	if err := WriteSalt(mnt, salt); err != nil {
		t.Fatal(err)
	}
	if again, fresh, err := Salt(mnt); err != nil || fresh || !bytes.Equal(again, salt) {
		t.Fatalf("Salt again: %x (fresh %v), %v; want the written salt %x", again, fresh, err, salt)
	}
	key, err := Key(secret, salt)
	if err != nil {
		t.Fatal(err)
	}
	id, err := AddKey(mnt, key)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(mnt, "data")
	if err := os.Mkdir(data, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := SetPolicy(data, id); err != nil {
		t.Fatal(err)
	}
	if err := SetPolicy(data, id); err != nil {
		t.Fatalf("the same policy again: %v", err)
	}
	marker := []byte(strings.Repeat("plaintext-marker-1234567890 ", 200))
	if err := os.WriteFile(filepath.Join(data, "marker-file"), marker, 0o644); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Policy(data)
	if err != nil || !ok || got != id {
		t.Fatalf("Policy(data) = %s, %v, %v; want %s", got, ok, err, id)
	}
	if _, ok, err := Policy(mnt); err != nil || ok {
		t.Fatalf("Policy(root) = %v, %v; want unencrypted", ok, err)
	}
	if st, err := Status(mnt, id); err != nil || st != KeyPresent {
		t.Fatalf("Status after AddKey = %s, %v", st, err)
	}

	// Locked: the key removed, the kernel shows encrypted names.
	if busy, err := RemoveKey(mnt, id); err != nil || busy {
		t.Fatalf("RemoveKey = busy %v, %v", busy, err)
	}
	if st, err := Status(mnt, id); err != nil || st != KeyAbsent {
		t.Fatalf("Status after RemoveKey = %s, %v; want absent", st, err)
	}
	if busy, err := RemoveKey(mnt, id); err != nil || busy {
		t.Fatalf("RemoveKey again = busy %v, %v; want success", busy, err)
	}
	names := list(t, data)
	if len(names) != 1 || names[0] == "marker-file" {
		t.Fatalf("names in the locked directory: %q; want one encrypted name", names)
	}
	if _, err := os.ReadFile(filepath.Join(data, names[0])); err == nil {
		t.Fatal("a file of the locked directory reads")
	}

	// Another Secret: another identifier, which does not unlock.
	other, err := Key(map[string]string{SecretPassphrase: "correct horse battery"}, salt)
	if err != nil {
		t.Fatal(err)
	}
	oid, err := AddKey(mnt, other)
	if err != nil {
		t.Fatal(err)
	}
	if oid == id {
		t.Fatal("two Secrets gave one key identifier")
	}
	if names := list(t, data); len(names) != 1 || names[0] == "marker-file" {
		t.Fatalf("another key unlocked the directory: %q", names)
	}
	if _, err := RemoveKey(mnt, oid); err != nil {
		t.Fatal(err)
	}

	// The raw image never holds the plaintext.
	umount(t, mnt)
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, marker[:40]) || bytes.Contains(raw, []byte("marker-file")) {
		t.Fatal("the raw image holds the plaintext contents or name")
	}

	// The same Secret and salt unlock it again after a remount.
	if out, err := exec.Command("mount", "-o", "loop", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount again: %v: %s", err, out)
	}
	salt2, err := ReadSalt(mnt)
	if err != nil {
		t.Fatal(err)
	}
	key2, err := Key(secret, salt2)
	if err != nil {
		t.Fatal(err)
	}
	if id2, err := AddKey(mnt, key2); err != nil || id2 != id {
		t.Fatalf("AddKey after remount = %s, %v; want %s", id2, err, id)
	}
	b, err := os.ReadFile(filepath.Join(data, "marker-file"))
	if err != nil || !bytes.Equal(b, marker) {
		t.Fatalf("read back after unlocking: %v (%d bytes)", err, len(b))
	}
	if _, err := RemoveKey(mnt, id); err != nil {
		t.Fatal(err)
	}
}

func list(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// A filesystem without the encrypt feature is not Supported
// (contract.ErrInvalid) and refuses the key with contract.ErrPrecondition;
// one with it is; a non-empty directory cannot get a policy.
func TestRefusals(t *testing.T) {
	plain, _ := encryptFS(t, "^encrypt")
	if err := Supported(plain); !errors.Is(err, contract.ErrInvalid) {
		t.Fatalf("Supported on ext4 without encrypt: %v; want ErrInvalid", err)
	}
	key, err := Key(map[string]string{SecretKey: strings.Repeat("78", 32)}, make([]byte, SaltBytes))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := AddKey(plain, key); !errors.Is(err, contract.ErrPrecondition) {
		t.Fatalf("AddKey on ext4 without encrypt: %v; want ErrPrecondition", err)
	}
	mnt, _ := encryptFS(t, "encrypt")
	if err := Supported(mnt); err != nil {
		t.Fatalf("Supported on ext4 with encrypt: %v", err)
	}
	id, err := AddKey(mnt, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = RemoveKey(mnt, id) })
	full := filepath.Join(mnt, "full")
	if err := os.MkdirAll(filepath.Join(full, "x"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := SetPolicy(full, id); !errors.Is(err, contract.ErrPrecondition) {
		t.Fatalf("SetPolicy on a non-empty directory: %v; want ErrPrecondition", err)
	}
}

// Key: one of the two Secret keys, long enough; the same inputs give the
// same key, another salt another one; errors never hold the secret.
func TestKeyDerivation(t *testing.T) {
	salt := bytes.Repeat([]byte{1}, SaltBytes)
	long := strings.Repeat("5a", MinKeyBytes)
	for _, tc := range []struct {
		name    string
		secrets map[string]string
	}{
		{"none", nil},
		{"short key", map[string]string{SecretKey: "0123456789abcdef0123456789abcdef"}},
		{"key not hex", map[string]string{SecretKey: strings.Repeat("zz", MinKeyBytes)}},
		{"short passphrase", map[string]string{SecretPassphrase: "short-pass"}},
		{"11 characters in 22 bytes", map[string]string{SecretPassphrase: strings.Repeat("é", 11)}},
		{"Key, not key", map[string]string{"Key": long}},
		{"both", map[string]string{SecretKey: long, SecretPassphrase: "a long enough passphrase"}},
	} {
		_, err := Key(tc.secrets, salt)
		if !errors.Is(err, contract.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", tc.name, err)
			continue
		}
		for _, v := range tc.secrets {
			if strings.Contains(err.Error(), v) {
				t.Errorf("%s: the error shows the secret: %v", tc.name, err)
			}
		}
	}
	if _, err := Key(map[string]string{"Key": long}, salt); err == nil || !strings.Contains(err.Error(), "it has Key: keys are case-sensitive") {
		t.Errorf("a Secret with Key only: %v; want the error to name the key that differs in case", err)
	}
	if _, err := Key(map[string]string{"mypassword=hunter2hunter2": ""}, salt); err == nil || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("a Secret with another key: %v; want an error that does not repeat the key's name", err)
	}
	if _, err := Key(map[string]string{SecretPassphrase: strings.Repeat("é", 12)}, salt); err != nil {
		t.Errorf("a passphrase of 12 characters: %v", err)
	}
	a, _ := Key(map[string]string{SecretKey: long}, salt)
	b, _ := Key(map[string]string{SecretKey: long}, salt)
	c, _ := Key(map[string]string{SecretKey: long}, bytes.Repeat([]byte{2}, SaltBytes))
	if len(a) != masterKeyBytes || !bytes.Equal(a, b) || bytes.Equal(a, c) || bytes.Contains(a, bytes.Repeat([]byte{0x5a}, 4)) {
		t.Fatalf("derived keys: len %d, stable %v, salted %v", len(a), bytes.Equal(a, b), !bytes.Equal(a, c))
	}
}

// Passphrases stretched at once (64 MiB of Argon2id memory each) are at
// most MaxConcurrentPassphrases, however many stages ask together; every
// one of them gets its key.
func TestPassphrasesStretchedFewAtATime(t *testing.T) {
	var running, peak atomic.Int32
	real := argonKey
	argonKey = func(p, salt []byte, passes, mem uint32, threads uint8, n uint32) []byte {
		now := running.Add(1)
		for old := peak.Load(); now > old && !peak.CompareAndSwap(old, now); old = peak.Load() {
		}
		defer running.Add(-1)
		time.Sleep(20 * time.Millisecond)              // long enough for the callers to overlap
		return real(p, salt, passes, 1024, threads, n) // 1 MiB: the count is what is tested
	}
	t.Cleanup(func() { argonKey = real })
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Go(func() {
			_, err := Key(map[string]string{SecretPassphrase: fmt.Sprintf("passphrase number %d", i)}, make([]byte, SaltBytes))
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if p := peak.Load(); p > MaxConcurrentPassphrases || p < 1 {
		t.Fatalf("%d passphrases stretched at once; want at most %d", p, MaxConcurrentPassphrases)
	}
}
