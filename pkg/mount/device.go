package mount

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// PlaceDevice implements Interface.
func (*Mounter) PlaceDevice(p, dev string) error {
	rdev, err := blockdev.Rdev(dev)
	if err != nil {
		return err
	}
	for attempt := 0; ; attempt++ {
		err := unix.Mknod(p, unix.S_IFBLK|0o600, int(rdev))
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EEXIST) || attempt > 0 {
			return fmt.Errorf("create device node %s: %w", p, err)
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return fmt.Errorf("lstat %s: %w", p, err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFBLK {
			return fmt.Errorf("%w: %s exists and is not a device node of the volume", contract.ErrExists, p)
		}
		if st.Rdev == rdev {
			return nil
		}
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("remove stale device node %s: %w", p, err)
		}
	}
}

// RemoveDevice implements Interface.
func (*Mounter) RemoveDevice(p string) error {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", p, err)
	}
	return nil
}

// HasDevice implements Interface with blockdev.NodeOf.
func (*Mounter) HasDevice(p, dev string) (bool, error) { return blockdev.NodeOf(p, dev) }
