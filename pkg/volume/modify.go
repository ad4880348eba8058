package volume

import (
	"fmt"
	"maps"
	"os"
	"strings"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
)

// Modify applies mutable parameters to volume id (CSI
// ControllerModifyVolume; contract.ParseMutable names them) and records
// them with the volume: only the keys given change. compression sets the
// btrfs compression property on the volume's whole tree (engine.
// SetCompression: later writes are compressed); dirMode chmods the
// volume's root (an image volume's filesystem root where it is staged, and
// at each later stage); the I/O limits (contract.IOLimitParameters) are
// set on the cgroups of every pod the volume is published for (pods.go).
// dirMode applies to filesystem volumes, compression to directory volumes
// on btrfs, I/O limits to image volumes (raw block, ext4, xfs). Applying is idempotent:
// a modify a crash cut short between the data and the record is finished
// by its retry. It returns the volume as recorded afterwards.
// Errors: contract.ErrNotFound, contract.ErrInvalid (a parameter this
// volume cannot take, named), contract.ErrBusy (a snapshot, clone or other
// change of it is in progress).
func (m *Manager) Modify(id string, params map[string]string) (*contract.Volume, error) {
	mut, err := parseMutable(params)
	if err != nil {
		return nil, err
	}
	unlock, err := m.lock(id)
	if err != nil {
		return nil, err
	}
	defer unlock()
	release, err := m.holds.change(id, "a modify")
	if err != nil {
		return nil, err
	}
	defer release()
	v, err := m.Get(id)
	if err != nil {
		return nil, err
	}
	if err := m.applyMutable(v, m.dataPath(v), mut); err != nil {
		return nil, err
	}
	merged := contract.MergeMutable(v.MutableParameters, params)
	if mut.IO != nil {
		if err := m.applyIOLimits(v, merged); err != nil {
			return nil, err
		}
	}
	if maps.Equal(merged, v.MutableParameters) {
		return v, nil
	}
	v.MutableParameters = merged
	if err := m.st.Update(func(tx *state.Tx) error { return tx.PutVolume(v) }); err != nil {
		return nil, err
	}
	klog.V(2).InfoS("Volume modified", "volumeID", id, "mutableParameters", params)
	return v, nil
}

// CheckMutableKind tells whether volume id ("" for a volume not created
// yet: CreateVolume's mutable_parameters, before it is placed), of
// accessType and fsType, can take the mutable parameters params:
// contract.ErrInvalid naming the one it cannot take. That compression
// needs a data root on btrfs is only known on the node.
func CheckMutableKind(id, accessType, fsType string, params map[string]string) error {
	mut, err := parseMutable(params)
	if err != nil {
		return err
	}
	if id == "" {
		id = "(new)"
	}
	return checkMutable(&contract.Volume{ID: id, AccessType: accessType, FsType: fsType}, true, mut)
}

// applyMutable checks that v can take mut and applies it to its data at
// path.
func (m *Manager) applyMutable(v *contract.Volume, path string, mut contract.Mutable) error {
	if err := checkMutable(v, engine.OnBtrfs(path), mut); err != nil {
		return err
	}
	if mut.DirMode != nil {
		root := path
		if v.FsType != "" {
			// An image volume's root is its filesystem's: where it is
			// staged now, and at each stage (stageImage). A new one
			// (Create: its image is not at its final path yet) has none.
			root = ""
			if _, err := os.Stat(m.imagePath(v.ID)); err == nil {
				mounts, err := m.imageMounts(v.ID)
				if err != nil {
					return err
				}
				if len(mounts) > 0 {
					root = mounts[0]
				}
			}
		}
		if root != "" {
			if err := chmodRoot(root, *mut.DirMode); err != nil {
				return fmt.Errorf("volume %s: %w", v.ID, err)
			}
		}
	}
	if mut.Compression != nil {
		if err := engine.SetCompression(path, *mut.Compression); err != nil {
			return fmt.Errorf("set compression of volume %s: %w", v.ID, err)
		}
	}
	return nil
}

// checkMutable refuses (contract.ErrInvalid) a mutable parameter the kind
// of volume v cannot take; onBtrfs: its data is on btrfs.
func checkMutable(v *contract.Volume, onBtrfs bool, mut contract.Mutable) error {
	kind := "a directory volume"
	switch {
	case v.AccessType == contract.AccessBlock:
		kind = "a raw block volume"
	case v.FsType != "":
		kind = "an image volume (" + v.FsType + ")"
	}
	if mut.DirMode != nil && v.AccessType == contract.AccessBlock {
		return fmt.Errorf("%w: mutable parameter %s applies to filesystem volumes; volume %s is %s", contract.ErrInvalid, contract.ParamDirMode, v.ID, kind)
	}
	if mut.IO != nil && !v.Image() {
		return fmt.Errorf("%w: mutable parameters %s apply to image volumes (raw block, or csi.storage.k8s.io/fstype ext4 or xfs), whose loop device they limit; volume %s is %s", contract.ErrInvalid, strings.Join(contract.IOLimitParameters, ", "), v.ID, kind)
	}
	if mut.Compression != nil && (v.Image() || !onBtrfs) {
		where := ""
		if !v.Image() {
			where = " on a data root that is not btrfs (engine " + v.Engine + ")"
		}
		return fmt.Errorf("%w: mutable parameter %s applies to directory volumes on btrfs; volume %s is %s%s", contract.ErrInvalid, contract.ParamCompression, v.ID, kind, where)
	}
	return nil
}

// parseMutable is contract.ParseMutable with its INVALID_ARGUMENT status
// turned into contract.ErrInvalid (the message kept), as pkg/volume's
// errors are.
func parseMutable(params map[string]string) (contract.Mutable, error) {
	mut, err := contract.ParseMutable(params)
	if err != nil {
		return mut, fmt.Errorf("%w: %s", contract.ErrInvalid, status.Convert(err).Message())
	}
	return mut, nil
}

// chmodRoot sets the permission bits of the directory at root (opened
// with O_NOFOLLOW: a symlink is never followed).
func chmodRoot(root string, mode uint32) error {
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", root, err)
	}
	defer unix.Close(fd)
	if err := unix.Fchmod(fd, mode); err != nil {
		return fmt.Errorf("chmod %s: %w", root, err)
	}
	return nil
}

// imageDirMode is the root permission an image volume's filesystem gets
// at stage: its mutable dirMode, else its StorageClass dirMode; ok false
// when neither is set (mkfs's own stays).
func imageDirMode(v *contract.Volume) (mode uint32, ok bool) {
	for _, p := range []map[string]string{v.MutableParameters, v.Parameters} {
		if s, set := p[contract.ParamDirMode]; set {
			if mode, err := contract.ParseDirMode(contract.ParamDirMode, s); err == nil {
				return mode, true
			}
		}
	}
	return 0, false
}
