// Package loop attaches, finds, resizes and detaches loop devices for
// localdir's image files, with the loop ioctls (linux/loop.h), not losetup(8).
//
// A device is always found by its backing file (LOOP_GET_STATUS64's device
// and inode, the sysfs backing_file name as a check), never by a stored
// /dev/loopN: numbers change across reboots and detaches. The name is
// compared as a suffix: the kernel prints it as seen from the attaching mount
// namespace, and once that is gone (a restarted node plugin container) only
// the path below its mount remains. An image has at most two devices, the
// read-write one a stage attaches and a read-only one (LO_FLAGS_READ_ONLY).
//
// Devices are attached with direct I/O (LO_FLAGS_DIRECT_IO): the loop
// device reads and writes its image with O_DIRECT, so a block is cached
// once (by the filesystem or the application above the device, not again
// as the image's pages), an O_DIRECT write in a pod reaches the disk before
// it returns, and a flush costs one fsync of the image. Devices have
// BlockSize sectors; where the backing filesystem refuses direct I/O the
// device runs buffered, which Device.DirectIO reports.
package loop

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
	"k8s.io/apimachinery/pkg/util/wait"
)

// sysBlock is where the kernel lists block devices; a var for tests.
var sysBlock = "/sys/block"

// BlockSize is the logical block size of every loop device: the same on
// every attach of an image (a filesystem made on it refuses a device with
// larger sectors), and a multiple of what direct I/O to the image needs on
// the filesystems data roots use: the disk's sector, and the filesystem
// block that btrfs and a reflinked XFS file ask for.
const BlockSize = contract.BlockBytes

// attachMu serializes Attach in this process (LOOP_CTL_GET_FREE and
// LOOP_CONFIGURE are two steps); other processes: the retry on EBUSY.
var attachMu sync.Mutex

// Device is one loop device backed by an image.
type Device struct {
	// Path is /dev/loopN.
	Path string
	// ReadOnly is set when the device was attached with LO_FLAGS_READ_ONLY:
	// the kernel refuses every write to it (EPERM).
	ReadOnly bool
	// DirectIO is set when the device does its I/O to the image with
	// O_DIRECT (LO_FLAGS_DIRECT_IO as the kernel reports it).
	DirectIO bool
}

// Devices returns every loop device backed by image, in /sys/block order:
// same device and inode, and a backing_file name that fits and is not a
// deleted file's (an inode reused after a delete never matches).
func Devices(image string) ([]Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return nil, err
	}
	var out []Device
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, "loop") {
			continue
		}
		dev := "/dev/" + name
		if !backs(dev, image) {
			continue // not attached, or to another file
		}
		if info, err := status(dev); err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			out = append(out, Device{Path: dev, ReadOnly: info.Flags&unix.LO_FLAGS_READ_ONLY != 0, DirectIO: info.Flags&unix.LO_FLAGS_DIRECT_IO != 0})
		}
	}
	return out, nil
}

// sameFile tells whether backing_file name backing may be image: the same
// path or its end below a mount, and not a deleted file's.
func sameFile(image, backing string) bool {
	if strings.HasSuffix(backing, " (deleted)") || !strings.HasPrefix(backing, "/") {
		return false
	}
	return image == backing || strings.HasSuffix(image, backing)
}

// Find returns a loop device backed by image, the read-write one when there
// is one, or "" when none is attached.
func Find(image string) (string, error) {
	devs, err := Devices(image)
	if err != nil || len(devs) == 0 {
		return "", err
	}
	for _, d := range devs {
		if !d.ReadOnly {
			return d.Path, nil
		}
	}
	return devs[0].Path, nil
}

// FindMode returns the read-write (readOnly false) or the read-only loop
// device backed by image, or "" when no such device is attached.
func FindMode(image string, readOnly bool) (string, error) {
	devs, err := Devices(image)
	if err != nil {
		return "", err
	}
	for _, d := range devs {
		if d.ReadOnly == readOnly {
			return d.Path, nil
		}
	}
	return "", nil
}

// status is LOOP_GET_STATUS64 of dev: its backing file's device and inode,
// and its flags.
func status(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}

// Attach returns the read-write loop device backed by image, attaching a free
// one if none is; not auto-cleared, so a bind mount of its node keeps working.
func Attach(image string) (string, error) { return attach(image, false) }

// AttachReadOnly returns the read-only loop device backed by image, attaching
// one if none is; writes through it fail (EPERM) whatever the node's mode.
func AttachReadOnly(image string) (string, error) { return attach(image, true) }

func attach(image string, readOnly bool) (string, error) {
	attachMu.Lock()
	defer attachMu.Unlock()
	if dev, err := FindMode(image, readOnly); err != nil || dev != "" {
		return dev, err
	}
	mode, flags := unix.O_RDWR, uint32(unix.LO_FLAGS_DIRECT_IO)
	if readOnly {
		mode, flags = unix.O_RDONLY, unix.LO_FLAGS_READ_ONLY|unix.LO_FLAGS_DIRECT_IO
	}
	file, err := unix.Open(image, mode|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
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
		cfg := unix.LoopConfig{Fd: uint32(file), Size: BlockSize}
		cfg.Info.Flags = flags
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

// Detach detaches every loop device backed by image, read-only ones first (so
// a failure never leaves one without the read-write device that marks the
// volume staged), and returns once the kernel let go of them; one held open
// more than 5 s (by a pod) the kernel detaches at its last close.
func Detach(image string) error {
	devs, err := Devices(image)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	slices.SortStableFunc(devs, func(a, b Device) int {
		switch {
		case a.ReadOnly == b.ReadOnly:
			return 0
		case a.ReadOnly:
			return -1
		}
		return 1
	})
	for _, d := range devs {
		if err := clearDev(d.Path, image); err != nil {
			return err
		}
	}
	return nil
}

// DetachReadOnly detaches the read-only loop device backed by image, if any.
func DetachReadOnly(image string) error {
	dev, err := FindMode(image, true)
	if errors.Is(err, os.ErrNotExist) || (err == nil && dev == "") {
		return nil
	}
	if err != nil {
		return err
	}
	return clearDev(dev, image)
}

// clearDev detaches dev (LOOP_CLR_FD, retried while busy) and waits until the
// kernel let go of image: LOOP_CLR_FD only marks a device another process
// holds open (blkid, a scan, a pod) for detaching at its last close, and a
// DeleteVolume right after NodeUnstageVolume would find it staged.
func clearDev(dev, image string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	var last error
	err = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 500*time.Millisecond, true,
		func(context.Context) (bool, error) {
			last = unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
			busy := errors.Is(last, unix.EBUSY) || errors.Is(last, unix.EAGAIN)
			return !busy, nil
		})
	unix.Close(fd) // ours is an opener too: the detach waits for its close
	if err == nil {
		err = last
	}
	if wait.Interrupted(err) {
		err = last // still busy: say why
	}
	if err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("detach %s from %s: %w", dev, image, err)
	}
	_ = wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, 5*time.Second, true,
		func(context.Context) (bool, error) { return !backs(dev, image), nil })
	return nil
}

// backs tells whether loop device dev is still attached to image: its
// backing_file in sysfs (present only while it is attached) may name image.
func backs(dev, image string) bool {
	b, err := os.ReadFile(filepath.Join(sysBlock, filepath.Base(dev), "loop", "backing_file"))
	return err == nil && sameFile(image, strings.TrimSuffix(string(b), "\n"))
}

// Refresh makes every loop device of image pick up its size
// (LOOP_SET_CAPACITY) and returns the read-write one's (0: none attached).
func Refresh(image string) (int64, error) {
	devs, err := Devices(image)
	if err != nil || len(devs) == 0 {
		return 0, err
	}
	var size int64
	for i, d := range devs {
		n, err := setCapacity(d.Path)
		if err != nil {
			return 0, err
		}
		if i == 0 || !d.ReadOnly {
			size = n
		}
	}
	return size, nil
}

func setCapacity(dev string) (int64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0); err != nil {
		return 0, fmt.Errorf("LOOP_SET_CAPACITY %s: %w", dev, err)
	}
	return blockdev.DeviceSize(dev)
}

// CountUnder counts the loop devices backed by files directly in dir,
// including files deleted while attached (same filesystem as dir): those
// hold disk space and must show.
func CountUnder(dir string) int {
	ents, err := os.ReadDir(sysBlock)
	if err != nil {
		return 0
	}
	var dst unix.Stat_t
	if err := unix.Stat(dir, &dst); err != nil {
		return 0
	}
	n := 0
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), "loop") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(sysBlock, e.Name(), "loop", "backing_file"))
		if err != nil {
			continue
		}
		name, deleted := strings.CutSuffix(strings.TrimSuffix(string(b), "\n"), " (deleted)")
		image := filepath.Join(dir, filepath.Base(name))
		if !sameFile(image, name) {
			continue
		}
		info, err := status("/dev/" + e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		switch {
		case deleted && info.Device == dst.Dev:
			n++
		case !deleted && unix.Stat(image, &st) == nil && info.Device == st.Dev && info.Inode == st.Ino:
			n++
		}
	}
	return n
}
