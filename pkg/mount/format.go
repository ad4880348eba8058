package mount

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/localdir-csi/localdir/pkg/blockdev"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// FormatAndMount implements Interface with mount-utils' SafeFormatAndMount:
// mkfs only on a device blkid finds blank (ext4 with -m0, then
// formatOptions), else fsck, then mount(8).
func (mt *Mounter) FormatAndMount(dev, target, fsType string, options, formatOptions []string) error {
	isMnt, err := mt.IsMountPoint(target)
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", target, err)
	}
	if isMnt {
		return repeatedFSMount(mt, dev, target)
	}
	sfm := &mountutils.SafeFormatAndMount{Interface: mountutils.New(""), Exec: utilexec.New()}
	if err := growExtOffline(sfm, dev); err != nil {
		return err
	}
	if err := sfm.FormatAndMountSensitiveWithFormatOptions(dev, target, fsType, options, nil, formatOptions); err != nil {
		return fmt.Errorf("format (when blank) and mount %s as %s on %s: %w", dev, fsType, target, err)
	}
	return nil
}

// growExtOffline grows an ext2/3/4 filesystem on the unmounted dev to the
// device's size when smaller (e2fsck -f -p, resize2fs): offline, unlike an
// online resize, it needs no CAP_SYS_RESOURCE.
func growExtOffline(sfm *mountutils.SafeFormatAndMount, dev string) error {
	format, err := sfm.GetDiskFormat(dev)
	if err != nil || (format != "ext4" && format != "ext3" && format != "ext2") {
		return err
	}
	x := sfm.Exec
	out, err := x.Command("dumpe2fs", "-h", dev).CombinedOutput()
	if err != nil {
		return fmt.Errorf("dumpe2fs -h %s: %v: %s", dev, err, out)
	}
	var blocks, blockSize int64
	for _, l := range strings.Split(string(out), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "Block count":
			blocks, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		case "Block size":
			blockSize, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	size, err := blockdev.DeviceSize(dev)
	if err != nil {
		return err
	}
	if blocks == 0 || blockSize == 0 || size < (blocks+1)*blockSize {
		return nil
	}
	// e2fsck -p exits 1 when it corrected something, which is fine.
	if out, err := x.Command("e2fsck", "-f", "-p", dev).CombinedOutput(); err != nil {
		var ee utilexec.ExitError
		if !errors.As(err, &ee) || ee.ExitStatus() > 1 {
			return fmt.Errorf("e2fsck -f -p %s before growing it: %v: %s", dev, err, out)
		}
	}
	if out, err := x.Command("resize2fs", dev).CombinedOutput(); err != nil {
		return fmt.Errorf("resize2fs %s: %v: %s", dev, err, out)
	}
	return nil
}

// repeatedFSMount judges a target that already is a mount point: success
// when it holds dev's filesystem, contract.ErrExists otherwise.
func repeatedFSMount(i Interface, dev, target string) error {
	ok, err := i.HoldsFS(target, dev)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("%w: %s is already a mount point of something else than the filesystem on %s", contract.ErrExists, target, dev)
	}
	return nil
}

// HoldsFS implements Interface: p's st_dev is dev's st_rdev.
func (mt *Mounter) HoldsFS(p, dev string) (bool, error) {
	isMnt, err := mt.IsMountPoint(p)
	if err != nil || !isMnt {
		return false, err
	}
	var sp, sd unix.Stat_t
	if err := unix.Stat(dev, &sd); err != nil {
		return false, err
	}
	if err := unix.Stat(p, &sp); err != nil {
		return false, err
	}
	return sd.Mode&unix.S_IFMT == unix.S_IFBLK && sp.Dev == sd.Rdev, nil
}

// ResizeFS implements Interface with mount-utils' ResizeFs (resize2fs for
// ext*, xfs_growfs for xfs; both online).
func (*Mounter) ResizeFS(dev, mountPath string) error {
	r := mountutils.NewResizeFs(utilexec.New())
	need, err := r.NeedResize(dev, mountPath)
	if err != nil {
		return fmt.Errorf("check whether the filesystem on %s needs to grow: %w", dev, err)
	}
	if !need {
		return nil
	}
	if _, err := r.Resize(dev, mountPath); err != nil {
		return fmt.Errorf("grow the filesystem on %s mounted at %s: %w", dev, mountPath, err)
	}
	return nil
}
