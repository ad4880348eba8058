package mount

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// CheckOutside refuses, with contract.ErrInvalid, a staging or target path
// p given by the CO (named field in errors) that would let a node call
// mount over, unmount or remove the driver's own data under dataRoot (a
// resolved path): the data root itself, anything inside it, any directory
// above it, and any path whose parent directory lies inside a volume (on a
// bind mount of part of the data root, such as another volume's staging or
// publish mount). Symlinks in the parent are resolved first; the last
// component is judged as it is (a symlink there is refused by publish and
// stage and removed, never followed, by unpublish).
func CheckOutside(dataRoot, field, p string) error {
	parent := ResolveExisting(filepath.Dir(filepath.Clean(p)))
	rp := filepath.Join(parent, filepath.Base(p))
	if mountutils.PathWithinBase(rp, dataRoot) {
		return fmt.Errorf("%w: %s %q is inside the data root %s", contract.ErrInvalid, field, p, dataRoot)
	}
	if mountutils.PathWithinBase(dataRoot, rp) {
		return fmt.Errorf("%w: %s %q contains the data root %s", contract.ErrInvalid, field, p, dataRoot)
	}
	inside, err := onDataRootMount(dataRoot, parent)
	if err != nil {
		return err
	}
	if inside {
		return fmt.Errorf("%w: %s %q lies inside a volume (its parent %s is on a mount of the data root %s)", contract.ErrInvalid, field, p, parent, dataRoot)
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
func onDataRootMount(dataRoot, dir string) (bool, error) {
	mis, err := mountutils.ParseMountInfo(mountInfoPath)
	if err != nil {
		return false, fmt.Errorf("read mount table: %w", err)
	}
	dirHost, dirInFS, ok1 := hostOf(mis, dir)
	rootHost, rootInFS, ok2 := hostOf(mis, dataRoot)
	if !ok1 || !ok2 || dirHost.Major != rootHost.Major || dirHost.Minor != rootHost.Minor {
		return false, nil
	}
	return mountutils.PathWithinBase(dirInFS, rootInFS), nil
}

// CheckPath refuses (contract.ErrInvalid, naming field) a CO-given staging
// or target path that no node call may work on: empty, with a NUL byte,
// PATH_MAX bytes or longer, with a component over NAME_MAX, relative, or
// not clean (a trailing slash is allowed).
func CheckPath(field, p string) error {
	switch {
	case p == "":
		return fmt.Errorf("%w: %s is required", contract.ErrInvalid, field)
	case strings.IndexByte(p, 0) >= 0:
		return fmt.Errorf("%w: %s %q contains a NUL byte", contract.ErrInvalid, field, p)
	case len(p) >= unix.PathMax:
		return fmt.Errorf("%w: %s is %d bytes long; paths are limited to %d", contract.ErrInvalid, field, len(p), unix.PathMax-1)
	}
	if c := filepath.Clean(p); !filepath.IsAbs(p) || (c != p && c+"/" != p) {
		return fmt.Errorf("%w: %s %q must be an absolute, clean path", contract.ErrInvalid, field, p)
	}
	for _, name := range strings.Split(p, "/") {
		if len(name) > unix.NAME_MAX {
			return fmt.Errorf("%w: %s %q has a component of %d bytes; names are limited to %d", contract.ErrInvalid, field, p, len(name), unix.NAME_MAX)
		}
	}
	return nil
}
