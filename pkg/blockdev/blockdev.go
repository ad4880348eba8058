// Package blockdev holds block-device helpers the mount, loop and cgroup code
// share. It imports no other localdir package.
package blockdev

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DeviceSize returns the size in bytes of a block device (BLKGETSIZE64).
func DeviceSize(dev string) (int64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	var size uint64
	if err := ioctlPtr(fd, unix.BLKGETSIZE64, &size); err != nil {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", dev, err)
	}
	return int64(size), nil
}

// Rdev returns the device number of a block device node.
func Rdev(dev string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return 0, fmt.Errorf("%s is not a block device", dev)
	}
	return st.Rdev, nil
}

// NodeOf reports whether p (a symlink not followed) is a block device node
// of dev's device number; a missing p is false.
func NodeOf(p, dev string) (bool, error) {
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("lstat %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return false, nil
	}
	rdev, err := Rdev(dev)
	if err != nil {
		return false, err
	}
	return st.Rdev == rdev, nil
}

func ioctlPtr(fd int, req uint, p *uint64) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(p)))
	if e != 0 {
		return e
	}
	return nil
}
