package mount

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Per-mount flags a bind remount can set (MS_REMOUNT|MS_BIND); existing
// mounts are compared through statfs(2) f_flags (see msFlags).
const (
	atimeMask     = unix.MS_NOATIME | unix.MS_RELATIME | unix.MS_STRICTATIME
	perMountMask  = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NODIRATIME | atimeMask
	restrictFlags = unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
)

// Flags is a parsed CSI MountVolume.mount_flags list.
type Flags struct {
	set   uintptr // restricting flags to add (ro, nosuid, nodev, noexec, nodiratime)
	atime uintptr // atime mode to use (one of atimeMask's bits), when atimeSet
	// atimeSet says whether the request named an atime mode at all.
	atimeSet bool
	list     []string
}

// flagTable maps the mount(8) option names a bind mount can honour; the
// loosening ones (rw, suid, dev, exec, atime, diratime) have no effect, as a
// bind mount never loosens what the data root's mount restricts.
var flagTable = map[string]struct {
	set   uintptr
	atime uintptr
}{
	"ro":          {set: unix.MS_RDONLY},
	"nosuid":      {set: unix.MS_NOSUID},
	"nodev":       {set: unix.MS_NODEV},
	"noexec":      {set: unix.MS_NOEXEC},
	"nodiratime":  {set: unix.MS_NODIRATIME},
	"noatime":     {atime: unix.MS_NOATIME},
	"relatime":    {atime: unix.MS_RELATIME},
	"strictatime": {atime: unix.MS_STRICTATIME},
	"rw":          {},
	"suid":        {},
	"dev":         {},
	"exec":        {},
	"atime":       {},
	"diratime":    {},
	"defaults":    {},
	"bind":        {},
	"rbind":       {},
}

// ParseFlags validates CSI mount_flags (an entry may be a comma-separated
// list, as kubelet passes mountOptions). Errors: contract.ErrInvalid.
func ParseFlags(flags []string) (Flags, error) {
	var mf Flags
	for _, entry := range flags {
		for _, f := range strings.Split(entry, ",") {
			f = strings.TrimSpace(f)
			if f == "" {
				continue
			}
			e, ok := flagTable[f]
			if !ok {
				return Flags{}, fmt.Errorf("%w: mount flag %q is not supported for localdir volumes (bind mounts apply: ro, nosuid, nodev, noexec, noatime, relatime, strictatime, nodiratime; rw, suid, dev, exec, atime, diratime, defaults, bind and rbind are accepted and change nothing)", contract.ErrInvalid, f)
			}
			mf.set |= e.set
			if e.atime != 0 {
				if mf.atimeSet && mf.atime != e.atime {
					return Flags{}, fmt.Errorf("%w: conflicting atime mount flags in %v", contract.ErrInvalid, flags)
				}
				mf.atime, mf.atimeSet = e.atime, true
			}
			mf.list = append(mf.list, f)
		}
	}
	return mf, nil
}

// msFlags converts statfs(2) f_flags to MS_* flags: the same bits but for
// relatime (ST_RELATIME is 0x1000, MS_BIND's value; MS_RELATIME is 1<<21).
func msFlags(st uintptr) uintptr {
	f := st & (restrictFlags | unix.MS_NODIRATIME | unix.MS_NOATIME)
	if st&unix.ST_RELATIME != 0 {
		f |= unix.MS_RELATIME
	}
	return f
}

// apply returns a new bind mount's flags from its source's (statfs f_flags):
// restrictions kept, the requested ones added, the atime mode replaced.
func (mf Flags) apply(inherited uintptr, readonly bool) uintptr {
	f := msFlags(inherited) | mf.set
	if readonly {
		f |= unix.MS_RDONLY
	}
	if mf.atimeSet {
		f = f&^atimeMask | mf.atime
	}
	return f
}

// needsRemount says whether a plain bind mount (which copies the source's
// flags) differs from what the request wants.
func (mf Flags) needsRemount(inherited uintptr, readonly bool) bool {
	return mf.apply(inherited, readonly) != msFlags(inherited)
}

// matches reports whether an existing mount with flags `actual` is what this
// request would have produced from a source with flags `inherited`.
func (mf Flags) matches(actual, inherited uintptr, readonly bool) bool {
	want := mf.apply(inherited, readonly)
	// statfs shows no bit for strictatime; compare atime only when asked.
	mask := uintptr(restrictFlags | unix.MS_NODIRATIME)
	if mf.atimeSet {
		mask |= unix.MS_NOATIME | unix.MS_RELATIME
	}
	return msFlags(actual)&mask == want&mask
}
