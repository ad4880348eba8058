// Package block attaches, finds, resizes and detaches loop devices for
// localdir's raw block volumes (sparse image files). It uses the loop ioctls
// (linux/loop.h) through golang.org/x/sys/unix, not losetup(8).
//
// A loop device is always found again by its backing file — the sysfs
// backing_file name, confirmed by the device and inode numbers the kernel
// reports with LOOP_GET_STATUS64 — and never by a stored /dev/loopN, because
// loop numbers change across reboots and detaches.
package block

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sysBlock is where the kernel lists block devices; a var for tests.
var sysBlock = "/sys/block"

// attachMu serializes Attach within this process: LOOP_CTL_GET_FREE and
// LOOP_CONFIGURE are two steps, and two attaches of one image must not both
// win. Other processes are handled by retrying on EBUSY.
var attachMu sync.Mutex

// Find returns the loop device (/dev/loopN) whose backing file is image, or
// "" when none is attached.
func Find(image string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return "", err
	}
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return "", err
	}
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, name, "loop", "backing_file"))
		if err != nil {
			continue // not attached
		}
		if strings.TrimSuffix(string(b), "\n") != image {
			continue
		}
		dev := "/dev/" + name
		if ok, err := backedBy(dev, &st); err == nil && ok {
			return dev, nil
		}
	}
	return "", nil
}

// backedBy confirms with LOOP_GET_STATUS64 that dev is backed by the file
// with stat st (same device and inode).
func backedBy(dev string, st *unix.Stat_t) (bool, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	info, err := unix.IoctlLoopGetStatus64(fd)
	if err != nil {
		return false, err
	}
	return info.Device == st.Dev && info.Inode == st.Ino, nil
}

// Attach returns the loop device backed by image, attaching a free one if
// none is. The device is not auto-cleared: it stays attached until Detach,
// so a bind mount of its node keeps working.
func Attach(image string) (string, error) {
	attachMu.Lock()
	defer attachMu.Unlock()
	if dev, err := Find(image); err != nil || dev != "" {
		return dev, err
	}
	file, err := unix.Open(image, unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("open image %s: %w", image, err)
	}
	defer unix.Close(file)
	ctl, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open /dev/loop-control: %w", err)
	}
	defer unix.Close(ctl)
	for attempt := 0; attempt < 32; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		fd, err := openLoop(dev, n)
		if err != nil {
			return "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(file)}
		copy(cfg.Info.File_name[:], image)
		err = unix.IoctlLoopConfigure(fd, &cfg)
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			continue // another process took it between GET_FREE and CONFIGURE
		}
		if err != nil {
			return "", fmt.Errorf("LOOP_CONFIGURE %s with %s: %w", dev, image, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("no free loop device for %s after 32 attempts", image)
}

// openLoop opens /dev/loopN, creating the node if udev has not (containers
// often have no udev): block major 7, minor N.
func openLoop(dev string, n int) (int, error) {
	fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mknod(dev, unix.S_IFBLK|0o660, int(unix.Mkdev(7, uint32(n)))); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("create %s: %w", dev, err)
		}
		fd, err = unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return -1, fmt.Errorf("open %s: %w", dev, err)
	}
	return fd, nil
}

// Detach detaches the loop device backed by image, if any. When the device
// is still open (a pod holds it), the kernel detaches it on last close.
func Detach(image string) error {
	dev, err := Find(image)
	if errors.Is(err, os.ErrNotExist) || (err == nil && dev == "") {
		return nil
	}
	if err != nil {
		return err
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	for i := 0; i < 50; i++ {
		err = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
		if !errors.Is(err, unix.EBUSY) && !errors.Is(err, unix.EAGAIN) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s from %s: %w", dev, image, err)
	}
	return nil
}

// Refresh makes the loop device attached to image (if any) pick up the
// image's current size (LOOP_SET_CAPACITY), without detaching it. It returns
// the device's size in bytes, or 0 when no device is attached.
func Refresh(image string) (int64, error) {
	dev, err := Find(image)
	if err != nil || dev == "" {
		return 0, err
	}
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
		return 0, fmt.Errorf("LOOP_SET_CAPACITY %s: %w", dev, err)
	}
	return DeviceSize(dev)
}

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

func ioctlPtr(fd int, req uint, p *uint64) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(p)))
	if e != 0 {
		return e
	}
	return nil
}

// CountUnder returns how many loop devices are backed by files in dir.
func CountUnder(dir string) int {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err == nil && strings.HasPrefix(string(b), dir+"/") {
			n++
		}
	}
	return n
}
