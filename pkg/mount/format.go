package mount

import (
	"fmt"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// FormatAndMount implements Interface with k8s.io/mount-utils'
// SafeFormatAndMount: blkid decides whether dev is blank (only then mkfs
// runs; ext4 is made with -m0, no blocks reserved for root), an existing
// filesystem is checked (fsck) and mounted with mount(8).
func (mt *Mounter) FormatAndMount(dev, target, fsType string, options []string) error {
	isMnt, err := mt.IsMountPoint(target)
	if err != nil {
		return fmt.Errorf("check mount point %s: %w", target, err)
	}
	if isMnt {
		return repeatedFSMount(mt, dev, target)
	}
	sfm := &mountutils.SafeFormatAndMount{Interface: mountutils.New(""), Exec: utilexec.New()}
	if err := sfm.FormatAndMount(dev, target, fsType, options); err != nil {
		return fmt.Errorf("format (when blank) and mount %s as %s on %s: %w", dev, fsType, target, err)
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

// HoldsFS implements Interface: p is a mount point whose filesystem is on
// the device of the block device node dev (stat(2) st_dev of p equals
// st_rdev of dev).
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
