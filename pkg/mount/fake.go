package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Fake is an Interface with an in-memory mount table, for unit tests without
// root: paths are real files and directories, only mounts and device nodes
// are pretended. A mount shows its Bind.Source; no source flags restrict it.
type Fake struct {
	mu      sync.Mutex
	mounts  map[string]FakeMount // target → what is mounted there
	devices map[string]string    // device node path → the device it copies
	// Calls counts the mutating calls (Bind, Unmount, Remove, PlaceDevice,
	// RemoveDevice, FormatAndMount) that changed the table.
	Calls int
	// Formatted lists the devices FormatAndMount made a filesystem on, with
	// its type; Resized counts ResizeFS calls by device.
	Formatted map[string]string
	Resized   map[string]int
}

// FakeMount is one mount of a Fake.
type FakeMount struct {
	Source   string
	ReadOnly bool
	Flags    []string // the normalized mount flags
	applied  uintptr
}

// NewFake returns a Fake with nothing mounted.
func NewFake() *Fake {
	return &Fake{mounts: map[string]FakeMount{}, devices: map[string]string{}, Formatted: map[string]string{}, Resized: map[string]int{}}
}

var _ Interface = (*Fake)(nil)

// Mounts returns a copy of the mount table, by target.
func (f *Fake) Mounts() map[string]FakeMount {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string]FakeMount, len(f.mounts))
	for k, v := range f.mounts {
		out[k] = v
	}
	return out
}

// PrepareDir implements Interface (on real directories).
func (*Fake) PrepareDir(p, field string, create bool) error { return checkDir(p, field, create) }

// PrepareFile implements Interface (on real files).
func (*Fake) PrepareFile(p string) error { return prepareDeviceFile(p) }

// Bind implements Interface.
func (f *Fake) Bind(b Bind) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if from := b.from(); from != b.Source {
		if m, ok := f.mounts[from]; !ok || m.Source != b.Source {
			return fmt.Errorf("bind mount %s on %s: %s does not show %s", from, b.Target, from, b.Source)
		}
	}
	if _, err := os.Lstat(b.Target); err != nil {
		return fmt.Errorf("check mount point %s: %w", b.Target, err)
	}
	want := b.Flags.apply(0, b.ReadOnly)
	if m, ok := f.mounts[b.Target]; ok {
		if m.Source != b.Source {
			return fmt.Errorf("%w: something else is already mounted at %q", contract.ErrExists, b.Target)
		}
		if !b.Flags.matches(m.applied, 0, b.ReadOnly) {
			return fmt.Errorf("%w: volume is already mounted at %q with other flags (readonly or mount_flags differ)", contract.ErrExists, b.Target)
		}
		return nil
	}
	f.mounts[b.Target] = FakeMount{Source: b.Source, ReadOnly: b.ReadOnly, Flags: append([]string(nil), b.Flags.list...), applied: want}
	f.Calls++
	return nil
}

// Unmount implements Interface.
func (f *Fake) Unmount(p string) error {
	if !filepath.IsAbs(p) {
		return fmt.Errorf("%w: path %q must be absolute", contract.ErrInvalid, p)
	}
	if fi, err := os.Lstat(p); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		return os.Remove(p)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.mounts[p]; ok {
		delete(f.mounts, p)
		f.Calls++
	}
	return nil
}

// Remove implements Interface.
func (f *Fake) Remove(p string) error {
	if err := f.Unmount(p); err != nil {
		return err
	}
	return removeUnmounted(p)
}

// PlaceDevice implements Interface: p becomes an empty regular file
// standing for a device node of dev.
func (f *Fake) PlaceDevice(p, dev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.devices[p]; ok && d == dev {
		return nil
	}
	if _, err := os.Lstat(p); err == nil {
		if _, ok := f.devices[p]; !ok {
			return fmt.Errorf("%w: %s exists and is not a device node of the volume", contract.ErrExists, p)
		}
	} else if err := createFile(p); err != nil {
		return err
	}
	f.devices[p] = dev
	f.Calls++
	return nil
}

// RemoveDevice implements Interface.
func (f *Fake) RemoveDevice(p string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.devices[p]; !ok {
		return nil
	}
	delete(f.devices, p)
	f.Calls++
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// HasDevice implements Interface.
func (f *Fake) HasDevice(p, dev string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.devices[p] == dev, nil
}

// IsMountPoint implements Interface.
func (f *Fake) IsMountPoint(p string) (bool, error) {
	if _, err := os.Lstat(p); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.mounts[p]
	return ok, nil
}

// Shows implements Interface.
func (f *Fake) Shows(p, src string) (bool, error) {
	if _, err := os.Lstat(p); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m, ok := f.mounts[p]
	return ok && m.Source == src, nil
}

// MountPoints implements Interface.
func (f *Fake) MountPoints(src string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for t, m := range f.mounts {
		if m.Source == src {
			out = append(out, t)
		}
	}
	sort.Strings(out)
	return out, nil
}

// FSMountPoints implements Interface: the fake mounts made by
// FormatAndMount of dev.
func (f *Fake) FSMountPoints(dev string) ([]string, error) { return f.MountPoints(dev) }

// InUse implements Interface.
func (f *Fake) InUse(dir string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for t, m := range f.mounts {
		if mountutils.PathWithinBase(m.Source, dir) || (t != dir && mountutils.PathWithinBase(t, dir)) {
			return true, nil
		}
	}
	return false, nil
}

// FormatAndMount implements Interface: the first call for dev "formats"
// it (Formatted); the mount shows dev.
func (f *Fake) FormatAndMount(dev, target, fsType string, options, _ []string) error {
	if isMnt, err := f.IsMountPoint(target); err != nil || isMnt {
		if err != nil {
			return err
		}
		return repeatedFSMount(f, dev, target)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if have, ok := f.Formatted[dev]; ok && have != fsType {
		return fmt.Errorf("%s holds %s, not %s", dev, have, fsType)
	}
	f.Formatted[dev] = fsType
	f.mounts[target] = FakeMount{Source: dev, Flags: options}
	f.Calls++
	return nil
}

// HoldsFS implements Interface.
func (f *Fake) HoldsFS(p, dev string) (bool, error) { return f.Shows(p, dev) }

// ResizeFS implements Interface (counted in Resized).
func (f *Fake) ResizeFS(dev, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Resized[dev]++
	return nil
}
