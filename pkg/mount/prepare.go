package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// PrepareDir implements Interface.
func (*Mounter) PrepareDir(p, field string, create bool) error { return checkDir(p, field, create) }

// PrepareFile implements Interface.
func (*Mounter) PrepareFile(p string) error { return prepareDeviceFile(p) }

// checkDir is Interface.PrepareDir, shared with Fake.
func checkDir(p, field string, create bool) error {
	if err := CheckPath(field, p); err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if errors.Is(err, os.ErrNotExist) {
		if !create {
			return fmt.Errorf("%w: %s %q does not exist", contract.ErrInvalid, field, p)
		}
		if err := os.Mkdir(p, 0o750); err != nil {
			if errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("%w: parent directory of %s %q does not exist", contract.ErrInvalid, field, p)
			}
			if !errors.Is(err, os.ErrExist) {
				return fmt.Errorf("create %s: %w", p, err)
			}
		}
		fi, err = os.Lstat(p)
	}
	if err != nil {
		if mountutils.IsCorruptedMnt(err) {
			// A dead mount sits there: remove it (only it: a healthy mount
			// under it is judged as any other) so a fresh mount can go on.
			if err := unmountTop(p); err != nil {
				return err
			}
			return checkDir(p, field, create)
		}
		return fmt.Errorf("lstat %s: %w", p, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return fmt.Errorf("%w: %s %q is a symlink; refusing to mount over it", contract.ErrInvalid, field, p)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s %q is not a directory", contract.ErrInvalid, field, p)
	}
	return nil
}

// prepareDeviceFile is Interface.PrepareFile, shared with Fake; a dead mount
// on p is removed first.
func prepareDeviceFile(p string) error {
	if c := filepath.Clean(p); !filepath.IsAbs(p) || c != p {
		return fmt.Errorf("%w: target_path %q must be an absolute, clean path", contract.ErrInvalid, p)
	}
	for i := 0; ; i++ {
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return createFile(p)
		case err != nil && mountutils.IsCorruptedMnt(err) && i < 64:
			// A dead mount sits on the device file: remove it and look again.
			if err := unmountTop(p); err != nil {
				return err
			}
			continue
		case err != nil:
			return fmt.Errorf("lstat %s: %w", p, err)
		case fi.Mode()&os.ModeSymlink != 0:
			return fmt.Errorf("%w: target_path %q is a symlink; refusing to mount over it", contract.ErrInvalid, p)
		case fi.IsDir():
			return fmt.Errorf("%w: target_path %q is a directory; a block volume is published as a device file", contract.ErrInvalid, p)
		}
		return nil
	}
}

// createFile creates the empty file p (mode 0600), never through a symlink.
func createFile(p string) error {
	fd, err := unix.Open(p, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("%w: parent directory of target_path %q does not exist", contract.ErrInvalid, p)
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", p, err)
	}
	return unix.Close(fd)
}
