package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// The btrfs engine keeps each volume as a subvolume whose qgroup limits its
// referenced bytes to its capacity (EDQUOT past it); snapshots, restores and
// clones are subvolume snapshots, copying nothing. It uses the btrfs ioctls,
// not btrfs-progs: no fork/exec, no output parsing, no cgo, nothing to install.
// golang.org/x/sys has no btrfs structures: the few used are declared below.

const (
	btrfsFirstFreeObjectID = 256 // inode number of every subvolume's root directory
	btrfsQuotaTreeObjectID = 8
	btrfsQgroupInfoKey     = 242
	btrfsQgroupLimitKey    = 244
	btrfsSubvolRdonly      = 1 << 1
	btrfsQgroupLimitRfer   = 1 << 0
	btrfsQuotaCtlEnable    = 1

	// _IOC(dir, 0x94, nr, size): dir 1 = write, 2 = read, 3 = read|write.
	iocSubvolCreate = 1<<30 | 4096<<16 | 0x94<<8 | 14 // _IOW(14, btrfs_ioctl_vol_args)
	iocSnapDestroy  = 1<<30 | 4096<<16 | 0x94<<8 | 15 // _IOW(15, btrfs_ioctl_vol_args)
	iocTreeSearch   = 3<<30 | 4096<<16 | 0x94<<8 | 17 // _IOWR(17, btrfs_ioctl_search_args)
	iocInoLookup    = 3<<30 | 4096<<16 | 0x94<<8 | 18 // _IOWR(18, btrfs_ioctl_ino_lookup_args)
	iocSnapCreateV2 = 1<<30 | 4096<<16 | 0x94<<8 | 23 // _IOW(23, btrfs_ioctl_vol_args_v2)
	iocQuotaCtl     = 3<<30 | 16<<16 | 0x94<<8 | 40   // _IOWR(40, btrfs_ioctl_quota_ctl_args)
	iocQgroupLimit  = 2<<30 | 48<<16 | 0x94<<8 | 43   // _IOR(43, btrfs_ioctl_qgroup_limit_args)
	iocSubvolGetfl  = 2<<30 | 8<<16 | 0x94<<8 | 25    // _IOR(25, __u64)
	iocSubvolSetfl  = 1<<30 | 8<<16 | 0x94<<8 | 26    // _IOW(26, __u64)
)

// btrfs_ioctl_vol_args
type volArgs struct {
	Fd   int64
	Name [4088]byte
}

// btrfs_ioctl_vol_args_v2
type volArgsV2 struct {
	Fd      int64
	Transid uint64
	Flags   uint64
	Unused  [4]uint64
	Name    [4040]byte
}

// btrfs_ioctl_qgroup_limit_args
type qgroupLimitArgs struct {
	QgroupID uint64
	Flags    uint64
	MaxRfer  uint64
	MaxExcl  uint64
	RsvRfer  uint64
	RsvExcl  uint64
}

// btrfs_ioctl_quota_ctl_args
type quotaCtlArgs struct {
	Cmd    uint64
	Status uint64
}

// btrfs_ioctl_ino_lookup_args
type inoLookupArgs struct {
	TreeID   uint64
	ObjectID uint64
	Name     [4080]byte
}

// btrfs_ioctl_search_key + buffer = btrfs_ioctl_search_args (4096 bytes)
type searchArgs struct {
	TreeID      uint64
	MinObjectID uint64
	MaxObjectID uint64
	MinOffset   uint64
	MaxOffset   uint64
	MinTransid  uint64
	MaxTransid  uint64
	MinType     uint32
	MaxType     uint32
	NrItems     uint32
	_           uint32
	_           [4]uint64
	Buf         [3992]byte
}

var (
	_ = [1]struct{}{}[unsafe.Sizeof(volArgs{})-4096]
	_ = [1]struct{}{}[unsafe.Sizeof(volArgsV2{})-4096]
	_ = [1]struct{}{}[unsafe.Sizeof(qgroupLimitArgs{})-48]
	_ = [1]struct{}{}[unsafe.Sizeof(inoLookupArgs{})-4096]
	_ = [1]struct{}{}[unsafe.Sizeof(searchArgs{})-4096]
)

func ioctl(fd int, req uintptr, arg unsafe.Pointer) error {
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(arg))
	if e != 0 {
		return e
	}
	return nil
}

func openDir(p string) (int, error) {
	return unix.Open(p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
}

func setName(dst []byte, name string) error {
	if len(name) >= len(dst) || name == "" {
		return fmt.Errorf("bad subvolume name %q", name)
	}
	copy(dst, name)
	return nil
}

type btrfsEngine struct{}

func newBtrfs(root string) (Engine, error) {
	if !onBtrfs(root) {
		return nil, fmt.Errorf("--engine=btrfs: data root %s is not on a btrfs filesystem", root)
	}
	fd, err := openDir(root)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// Enabling quotas is idempotent; it returns at once and the kernel scans
	// existing data in the background.
	args := quotaCtlArgs{Cmd: btrfsQuotaCtlEnable}
	if err := ioctl(fd, iocQuotaCtl, unsafe.Pointer(&args)); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("enable btrfs quotas on %s: %w", root, err)
	}
	return btrfsEngine{}, nil
}

func (btrfsEngine) Name() contract.Engine { return Btrfs }
func (btrfsEngine) Enforced() bool        { return true }

// Create makes a subvolume at path and limits it to size bytes.
func (e btrfsEngine) Create(path string, size int64, mode uint32) error {
	pfd, err := openDir(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var a volArgs
	if err := setName(a.Name[:], filepath.Base(path)); err != nil {
		return err
	}
	if err := ioctl(pfd, iocSubvolCreate, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("create subvolume %s: %w", path, err)
	}
	if err := unix.Chmod(path, mode); err != nil {
		return err
	}
	return e.Resize(path, size)
}

// snapshot makes dst a snapshot of the subvolume src.
func snapshot(src, dst string, readonly bool) error {
	sfd, err := openDir(src)
	if err != nil {
		return err
	}
	defer unix.Close(sfd)
	pfd, err := openDir(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	a := volArgsV2{Fd: int64(sfd)}
	if readonly {
		a.Flags = btrfsSubvolRdonly
	}
	if err := setName(a.Name[:], filepath.Base(dst)); err != nil {
		return err
	}
	if err := ioctl(pfd, iocSnapCreateV2, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("snapshot %s to %s: %w", src, dst, err)
	}
	return nil
}

func (btrfsEngine) Snapshot(src, dst string) error {
	if !isSubvolume(src) {
		return dirEngine{}.Snapshot(src, dst) // a dir-engine volume on btrfs
	}
	return snapshot(src, dst, true)
}

func (e btrfsEngine) Clone(src, dst string, size int64) error {
	if !isSubvolume(src) {
		return dirEngine{}.Clone(src, dst, size)
	}
	if err := snapshot(src, dst, false); err != nil {
		return err
	}
	return e.Resize(dst, size)
}

func (e btrfsEngine) Restore(src, dst string, size int64) error {
	if !isSubvolume(src) {
		return dirEngine{}.Restore(src, dst, size)
	}
	return e.Clone(src, dst, size)
}

// Resize sets the qgroup limit on referenced bytes of the subvolume at path.
func (btrfsEngine) Resize(path string, size int64) error {
	fd, err := openDir(path)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	// qgroupid 0 means "the subvolume fd is in".
	a := qgroupLimitArgs{Flags: btrfsQgroupLimitRfer, MaxRfer: uint64(size)}
	if err := ioctl(fd, iocQgroupLimit, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("set qgroup limit on %s: %w", path, err)
	}
	return nil
}

// Usage reads the referenced bytes of the subvolume's qgroup; btrfs has no
// inode limit, so inodes are -1.
func (btrfsEngine) Usage(path string) (int64, int64, error) {
	rfer, _, err := qgroupInfo(path)
	return rfer, -1, err
}

// Exclusive is the qgroup's exclusive bytes: what only this subvolume
// holds, not shared with a snapshot or clone by reflink.
func (btrfsEngine) Exclusive(path string) (int64, error) {
	_, excl, err := qgroupInfo(path)
	return excl, err
}

// Limit reads the subvolume's qgroup limit on referenced bytes (0: none).
func (btrfsEngine) Limit(path string) (int64, error) {
	item, err := qgroupItem(path, btrfsQgroupLimitKey)
	if err != nil || item == nil {
		return 0, err
	}
	// btrfs_qgroup_limit_item: flags, max_rfer, max_excl, rsv_rfer,
	// rsv_excl (little endian u64).
	if binary.LittleEndian.Uint64(item[0:8])&btrfsQgroupLimitRfer == 0 {
		return 0, nil
	}
	return int64(binary.LittleEndian.Uint64(item[8:16])), nil
}

// qgroupInfo reads the referenced and exclusive bytes of the qgroup of the
// subvolume at path (its BTRFS_QGROUP_INFO item).
func qgroupInfo(path string) (rfer, excl int64, err error) {
	item, err := qgroupItem(path, btrfsQgroupInfoKey)
	if err != nil {
		return 0, 0, err
	}
	if item == nil {
		return 0, 0, fmt.Errorf("no qgroup for the subvolume at %s: are btrfs quotas enabled?", path)
	}
	// btrfs_qgroup_info_item: generation, rfer, rfer_cmpr, excl, excl_cmpr
	// (little endian u64).
	rfer = int64(binary.LittleEndian.Uint64(item[8:16]))
	excl = int64(binary.LittleEndian.Uint64(item[24:32]))
	return rfer, excl, nil
}

// qgroupItem returns the quota tree item of type key of the subvolume's
// qgroup (BTRFS_IOC_TREE_SEARCH), nil when there is none.
func qgroupItem(path string, key uint32) ([]byte, error) {
	fd, err := openDir(path)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	id, err := subvolumeID(fd)
	if err != nil {
		return nil, err
	}
	a := searchArgs{
		TreeID:      btrfsQuotaTreeObjectID,
		MinObjectID: 0, MaxObjectID: 0,
		MinOffset: id, MaxOffset: id,
		MaxTransid: ^uint64(0),
		MinType:    key, MaxType: key,
		NrItems: 1,
	}
	if err := ioctl(fd, iocTreeSearch, unsafe.Pointer(&a)); err != nil {
		return nil, fmt.Errorf("read qgroup of %s: %w", path, err)
	}
	if a.NrItems < 1 {
		return nil, nil
	}
	// A btrfs_ioctl_search_header (32 bytes: transid, objectid, offset,
	// type, len), then the item.
	n := binary.LittleEndian.Uint32(a.Buf[28:32])
	if 32+int(n) > len(a.Buf) || n < 32 {
		return nil, fmt.Errorf("read qgroup of %s: item of %d bytes", path, n)
	}
	return a.Buf[32 : 32+n], nil
}

// subvolumeID returns the id of the subvolume holding fd.
func subvolumeID(fd int) (uint64, error) {
	a := inoLookupArgs{ObjectID: btrfsFirstFreeObjectID}
	if err := ioctl(fd, iocInoLookup, unsafe.Pointer(&a)); err != nil {
		return 0, err
	}
	return a.TreeID, nil
}

// isSubvolume reports whether p is the root of a btrfs subvolume.
func isSubvolume(p string) bool {
	var st unix.Stat_t
	return onBtrfs(p) && unix.Lstat(p, &st) == nil && st.Ino == btrfsFirstFreeObjectID && st.Mode&unix.S_IFMT == unix.S_IFDIR
}

// destroySubvolume deletes the subvolume at p (SNAP_DESTROY on its parent).
func destroySubvolume(p string) error {
	pfd, err := openDir(filepath.Dir(p))
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	var a volArgs
	if err := setName(a.Name[:], filepath.Base(p)); err != nil {
		return err
	}
	if err := ioctl(pfd, iocSnapDestroy, unsafe.Pointer(&a)); err != nil {
		return fmt.Errorf("delete subvolume %s: %w", p, err)
	}
	return nil
}

// subvolFlags reads (BTRFS_IOC_SUBVOL_GETFLAGS) the flags of the subvolume
// whose root is the open directory fd.
func subvolFlags(fd int) (uint64, error) {
	var f uint64
	err := ioctl(fd, iocSubvolGetfl, unsafe.Pointer(&f))
	return f, err
}

// setSubvolFlags writes them (BTRFS_IOC_SUBVOL_SETFLAGS).
func setSubvolFlags(fd int, f uint64) error {
	return ioctl(fd, iocSubvolSetfl, unsafe.Pointer(&f))
}

// Move renames the tree at src to dst (same filesystem; unclaimed data at
// start). btrfs refuses to move a read-only subvolume to another directory
// (EROFS), so it is made writable for the rename; a crash in between leaves
// it writable, its data never lost.
func Move(src, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE)
	if err == nil || !errors.Is(err, unix.EROFS) || !isSubvolume(src) {
		return err
	}
	fd, ferr := openDir(src)
	if ferr != nil {
		return err
	}
	defer unix.Close(fd)
	f, ferr := subvolFlags(fd)
	if ferr != nil || f&btrfsSubvolRdonly == 0 {
		return err
	}
	if ferr := setSubvolFlags(fd, f&^btrfsSubvolRdonly); ferr != nil {
		return fmt.Errorf("make read-only subvolume %s writable to move it: %w", src, ferr)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, src, unix.AT_FDCWD, dst, unix.RENAME_NOREPLACE); err != nil {
		_ = setSubvolFlags(fd, f)
		return err
	}
	// fd still refers to the subvolume's root, now at dst.
	if err := setSubvolFlags(fd, f); err != nil {
		return fmt.Errorf("make %s read-only again: %w", dst, err)
	}
	return nil
}
