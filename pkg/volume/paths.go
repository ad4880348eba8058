package volume

import (
	"fmt"
	"path/filepath"

	"github.com/moby/sys/mountinfo"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// CheckOutside refuses, with contract.ErrInvalid, a staging or target path given by
// the CO that would let a node call mount over, unmount or remove the
// driver's own data: the data root itself, anything inside it, any
// directory above it, and any path whose parent directory lies inside a
// volume (on a bind mount of part of the data root, such as another
// volume's staging or publish mount). Symlinks in the parent are resolved
// first; the last component is judged as it is (a symlink there is refused
// by publish and stage and removed, never followed, by unpublish).
func (m *Manager) CheckOutside(field, p string) error {
	parent := ResolveExisting(filepath.Dir(filepath.Clean(p)))
	rp := filepath.Join(parent, filepath.Base(p))
	if within(rp, m.root) {
		return fmt.Errorf("%w: %s %q is inside the data root %s", contract.ErrInvalid, field, p, m.root)
	}
	if within(m.root, rp) {
		return fmt.Errorf("%w: %s %q contains the data root %s", contract.ErrInvalid, field, p, m.root)
	}
	inside, err := m.onDataRootMount(parent)
	if err != nil {
		return err
	}
	if inside {
		return fmt.Errorf("%w: %s %q lies inside a volume (its parent %s is on a mount of the data root %s)", contract.ErrInvalid, field, p, parent, m.root)
	}
	return nil
}

// ResolveExisting returns the absolute, clean path p with the symlinks of
// its longest existing prefix resolved; the rest is appended unchanged.
func ResolveExisting(p string) string {
	p = filepath.Clean(p)
	rest := ""
	for {
		if r, err := filepath.EvalSymlinks(p); err == nil {
			return filepath.Join(r, rest)
		}
		parent := filepath.Dir(p)
		if parent == p {
			return filepath.Join(p, rest)
		}
		rest = filepath.Join(filepath.Base(p), rest)
		p = parent
	}
}

// onDataRootMount reports whether the directory dir (resolved) lies, through
// whatever mount holds it, inside the data root's directory tree: the mount
// holding dir is of the data root's filesystem and its root, plus dir's path
// below the mount point, is below the data root's own path in that
// filesystem. That is how a bind mount of a volume (a staging or publish
// path) shows.
func (m *Manager) onDataRootMount(dir string) (bool, error) {
	mounts, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return !within(dir, i.Mountpoint) && !within(m.root, i.Mountpoint), false
	})
	if err != nil {
		return false, fmt.Errorf("read mount table: %w", err)
	}
	dirHost, rootHost := holder(mounts, dir), holder(mounts, m.root)
	if dirHost == nil || rootHost == nil || dirHost.Major != rootHost.Major || dirHost.Minor != rootHost.Minor {
		return false, nil
	}
	return within(inFS(dirHost, dir), inFS(rootHost, m.root)), nil
}

// holder is the mount that p is on: the longest mount point above it, the
// topmost (latest) of stacked ones.
func holder(mounts []*mountinfo.Info, p string) *mountinfo.Info {
	var h *mountinfo.Info
	for _, mi := range mounts {
		if within(p, mi.Mountpoint) && (h == nil || len(mi.Mountpoint) >= len(h.Mountpoint)) {
			h = mi
		}
	}
	return h
}

// inFS is p's path inside the filesystem of the mount mi that holds it.
func inFS(mi *mountinfo.Info, p string) string {
	rel, err := filepath.Rel(mi.Mountpoint, p)
	if err != nil {
		return p
	}
	return filepath.Join(mi.Root, rel)
}
