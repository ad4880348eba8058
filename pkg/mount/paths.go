package mount

import (
	"fmt"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// CheckOutside refuses (contract.ErrInvalid) a CO-given path p through which
// a node call could reach the driver's own data under dataRoot: the data root,
// anything in or above it, or a parent inside a volume's bind mount. Symlinks
// in the parent are resolved; the last component is judged as it is.
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

// onDataRootMount reports whether the resolved directory dir lies, through
// whatever mount holds it, inside the data root's tree (a volume's bind mount).
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

// CheckPath refuses (contract.ErrInvalid) a CO-given path no node call may use:
// empty, with NUL, too long, relative or not clean (a trailing slash is fine).
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
