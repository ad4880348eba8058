package mount

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name     string
		in       []string
		set      uintptr
		atime    uintptr
		atimeSet bool
		list     []string
		errPart  string // non-empty: want contract.ErrInvalid with this in the message
	}{
		{name: "nil", in: nil},
		{name: "empty entries", in: []string{"", " ", ",", " , ,"}},
		{name: "ro", in: []string{"ro"}, set: unix.MS_RDONLY, list: []string{"ro"}},
		{name: "all restricting", in: []string{"ro", "nosuid", "nodev", "noexec", "nodiratime"},
			set:  unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NODIRATIME,
			list: []string{"ro", "nosuid", "nodev", "noexec", "nodiratime"}},
		{name: "comma-joined entry", in: []string{"nosuid,nodev", "noexec"},
			set: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, list: []string{"nosuid", "nodev", "noexec"}},
		{name: "spaces and empty items", in: []string{" nosuid , ,nodev,", ""},
			set: unix.MS_NOSUID | unix.MS_NODEV, list: []string{"nosuid", "nodev"}},
		{name: "duplicates", in: []string{"ro,ro", "ro"}, set: unix.MS_RDONLY, list: []string{"ro", "ro", "ro"}},
		{name: "loosening names have no effect", in: []string{"rw,suid,dev,exec,atime,diratime,defaults,bind,rbind"},
			list: []string{"rw", "suid", "dev", "exec", "atime", "diratime", "defaults", "bind", "rbind"}},
		{name: "noatime", in: []string{"noatime"}, atime: unix.MS_NOATIME, atimeSet: true, list: []string{"noatime"}},
		{name: "relatime", in: []string{"relatime"}, atime: unix.MS_RELATIME, atimeSet: true, list: []string{"relatime"}},
		{name: "strictatime", in: []string{"strictatime"}, atime: unix.MS_STRICTATIME, atimeSet: true, list: []string{"strictatime"}},
		{name: "same atime twice", in: []string{"noatime", "noatime"}, atime: unix.MS_NOATIME, atimeSet: true, list: []string{"noatime", "noatime"}},
		{name: "atime with others", in: []string{"ro,relatime,nosuid"}, set: unix.MS_RDONLY | unix.MS_NOSUID,
			atime: unix.MS_RELATIME, atimeSet: true, list: []string{"ro", "relatime", "nosuid"}},
		{name: "noatime vs relatime", in: []string{"noatime,relatime"}, errPart: "conflicting atime"},
		{name: "relatime vs strictatime across entries", in: []string{"relatime", "strictatime"}, errPart: "conflicting atime"},
		{name: "strictatime vs noatime", in: []string{"strictatime", "nosuid", "noatime"}, errPart: "conflicting atime"},
		{name: "unknown", in: []string{"sync"}, errPart: `"sync"`},
		{name: "unknown after known", in: []string{"ro", "nosuid,bogus"}, errPart: `"bogus"`},
		{name: "upper case", in: []string{"RO"}, errPart: `"RO"`},
		{name: "option with value", in: []string{"size=1G"}, errPart: `"size=1G"`},
		{name: "mode option", in: []string{"mode=0755"}, errPart: `"mode=0755"`},
		{name: "remount", in: []string{"remount"}, errPart: `"remount"`},
		{name: "shared propagation", in: []string{"shared"}, errPart: `"shared"`},
		{name: "NUL", in: []string{"ro\x00"}, errPart: "not supported"},
		{name: "space inside", in: []string{"no suid"}, errPart: `"no suid"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mf, err := ParseFlags(tc.in)
			if tc.errPart != "" {
				if !errors.Is(err, contract.ErrInvalid) {
					t.Fatalf("ParseFlags(%q) = %+v, %v; want contract.ErrInvalid", tc.in, mf, err)
				}
				if !strings.Contains(err.Error(), tc.errPart) {
					t.Fatalf("error %q does not contain %q", err, tc.errPart)
				}
				if mf.set != 0 || mf.atimeSet || mf.list != nil {
					t.Fatalf("partial result %+v returned with the error", mf)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseFlags(%q): %v", tc.in, err)
			}
			if mf.set != tc.set || mf.atime != tc.atime || mf.atimeSet != tc.atimeSet || !slices.Equal(mf.list, tc.list) {
				t.Fatalf("ParseFlags(%q) = {set %#x atime %#x atimeSet %v list %q}, want {set %#x atime %#x atimeSet %v list %q}",
					tc.in, mf.set, mf.atime, mf.atimeSet, mf.list, tc.set, tc.atime, tc.atimeSet, tc.list)
			}
		})
	}
}

func mustFlags(t *testing.T, flags ...string) Flags {
	t.Helper()
	mf, err := ParseFlags(flags)
	if err != nil {
		t.Fatal(err)
	}
	return mf
}

// Flags as statfs(2) reports them in f_flags (ST_*), which is what apply,
// matches and needsRemount are given by the mount code. Note ST_RELATIME
// (0x1000) is not MS_RELATIME (1<<21): it is MS_BIND's value.
const (
	stValid    = 0x0020 // ST_VALID, set by every statfs on Linux
	stRO       = unix.ST_RDONLY
	stNosuid   = unix.ST_NOSUID
	stNodev    = unix.ST_NODEV
	stNoexec   = unix.ST_NOEXEC
	stNoatime  = unix.ST_NOATIME
	stNodirat  = unix.ST_NODIRATIME
	stRelatime = unix.ST_RELATIME
	stSync     = unix.ST_SYNCHRONOUS
	stMandlock = unix.ST_MANDLOCK
	stNosymfol = 0x2000 // ST_NOSYMFOLLOW
)

func TestMountFlagsApply(t *testing.T) {
	tests := []struct {
		name      string
		flags     []string
		inherited uintptr // statfs f_flags of the source
		readonly  bool
		want      uintptr // MS_* flags for the bind remount
		remount   bool
	}{
		{"nothing on a strictatime source", nil, stValid, false, 0, false},
		{"nothing on a relatime source", nil, stValid | stRelatime, false, unix.MS_RELATIME, false},
		{"nothing keeps inherited restrictions", nil, stValid | stRelatime | stNosuid | stNodev, false,
			unix.MS_RELATIME | unix.MS_NOSUID | unix.MS_NODEV, false},
		{"nothing on a read-only source", nil, stValid | stRO, false, unix.MS_RDONLY, false},
		{"readonly", nil, stValid | stRelatime, true, unix.MS_RDONLY | unix.MS_RELATIME, true},
		{"readonly on a read-only source", nil, stValid | stRO | stRelatime, true, unix.MS_RDONLY | unix.MS_RELATIME, false},
		{"ro flag = readonly", []string{"ro"}, stValid | stRelatime, false, unix.MS_RDONLY | unix.MS_RELATIME, true},
		{"restrictions added", []string{"nosuid,nodev,noexec"}, stValid | stRelatime | stNosuid, false,
			unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_RELATIME, true},
		{"restrictions already there", []string{"nosuid", "nodev"}, stValid | stNosuid | stNodev | stRelatime, false,
			unix.MS_NOSUID | unix.MS_NODEV | unix.MS_RELATIME, false},
		{"loosening names keep restrictions", []string{"rw,suid,dev,exec,atime"}, stValid | stRO | stNosuid | stNodev | stNoexec | stNoatime, false,
			unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC | unix.MS_NOATIME, false},
		{"noatime replaces relatime", []string{"noatime"}, stValid | stRelatime, false, unix.MS_NOATIME, true},
		{"noatime on noatime source", []string{"noatime"}, stValid | stNoatime, false, unix.MS_NOATIME, false},
		{"relatime on relatime source", []string{"relatime"}, stValid | stRelatime, false, unix.MS_RELATIME, false},
		{"relatime replaces noatime", []string{"relatime"}, stValid | stNoatime, false, unix.MS_RELATIME, true},
		{"strictatime replaces relatime", []string{"strictatime"}, stValid | stRelatime, false, unix.MS_STRICTATIME, true},
		{"nodiratime added", []string{"nodiratime"}, stValid | stRelatime, false, unix.MS_NODIRATIME | unix.MS_RELATIME, true},
		{"nodiratime kept", nil, stValid | stRelatime | stNodirat, false, unix.MS_NODIRATIME | unix.MS_RELATIME, false},
		// Bits that are not per-mount flags never reach mount(2): ST_VALID
		// is MS_REMOUNT's value, ST_NOSYMFOLLOW MS_MOVE's.
		{"non per-mount bits dropped", nil, stValid | stSync | stMandlock | stNosymfol | stRelatime, false, unix.MS_RELATIME, false},
		{"non per-mount bits dropped with ro", []string{"ro"}, stValid | stSync | stMandlock | stNosymfol, false, unix.MS_RDONLY, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mf := mustFlags(t, tc.flags...)
			if got := mf.apply(tc.inherited, tc.readonly); got != tc.want {
				t.Errorf("apply(%#x, ro=%v) = %#x, want %#x", tc.inherited, tc.readonly, got, tc.want)
			}
			if got := mf.needsRemount(tc.inherited, tc.readonly); got != tc.remount {
				t.Errorf("needsRemount(%#x, ro=%v) = %v, want %v", tc.inherited, tc.readonly, got, tc.remount)
			}
			if got := mf.apply(tc.inherited, tc.readonly); got&^perMountMask != 0 {
				t.Errorf("apply returned non per-mount bits %#x", got&^perMountMask)
			}
		})
	}
}

func TestMountFlagsMatches(t *testing.T) {
	const src = stValid | stRelatime // a typical source: rw, relatime
	tests := []struct {
		name     string
		flags    []string
		actual   uintptr // statfs f_flags of the existing mount
		readonly bool
		want     bool
	}{
		{"plain bind", nil, src, false, true},
		{"plain bind, noatime now", nil, stValid | stNoatime, false, true}, // atime not compared when not asked
		{"wanted rw, is ro", nil, src | stRO, false, false},
		{"wanted ro, is rw", nil, src, true, false},
		{"wanted ro, is ro", nil, src | stRO, true, true},
		{"ro flag, is ro", []string{"ro"}, src | stRO, false, true},
		{"nosuid wanted, missing", []string{"nosuid"}, src, false, false},
		{"nosuid wanted, present", []string{"nosuid"}, src | stNosuid, false, true},
		{"extra nodev present", []string{"nosuid"}, src | stNosuid | stNodev, false, false},
		{"nodiratime wanted, present", []string{"nodiratime"}, src | stNodirat, false, true},
		{"nodiratime wanted, missing", []string{"nodiratime"}, src, false, false},
		{"noatime wanted, present", []string{"noatime"}, stValid | stNoatime, false, true},
		{"noatime wanted, relatime", []string{"noatime"}, src, false, false},
		{"relatime wanted, present", []string{"relatime"}, src, false, true},
		{"relatime wanted, noatime", []string{"relatime"}, stValid | stNoatime, false, false},
		{"strictatime wanted, present", []string{"strictatime"}, stValid, false, true},
		{"strictatime wanted, relatime", []string{"strictatime"}, src, false, false},
		{"relatime + ro wanted, present", []string{"ro,relatime"}, src | stRO, false, true},
		{"non per-mount bits ignored", []string{"nosuid"}, src | stNosuid | stSync | stMandlock | stNosymfol, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mf := mustFlags(t, tc.flags...)
			if got := mf.matches(tc.actual, src, tc.readonly); got != tc.want {
				t.Errorf("matches(actual=%#x, inherited=%#x, ro=%v) = %v, want %v", tc.actual, uintptr(src), tc.readonly, got, tc.want)
			}
		})
	}
}

// TestMountFlagsIdempotent: a mount made as apply() says, then read back
// with statfs, matches the same request; so a repeated stage or publish
// succeeds. statfs is modelled on the kernel's flags_by_mnt.
func TestMountFlagsIdempotent(t *testing.T) {
	toStatfs := func(ms uintptr) uintptr {
		st := uintptr(stValid) | ms&(unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_NOATIME|unix.MS_NODIRATIME)
		if ms&unix.MS_RELATIME != 0 {
			st |= stRelatime
		}
		return st
	}
	sources := []uintptr{stValid, stValid | stRelatime, stValid | stNoatime, stValid | stRelatime | stNosuid | stNodev, stValid | stRO | stRelatime}
	requests := [][]string{nil, {"ro"}, {"noatime"}, {"relatime"}, {"strictatime"}, {"nodiratime"}, {"nosuid,nodev,noexec"}, {"ro,relatime"}, {"rw,exec"}}
	for _, src := range sources {
		for _, req := range requests {
			for _, ro := range []bool{false, true} {
				mf := mustFlags(t, req...)
				actual := src // a plain bind copies the source's flags
				if mf.needsRemount(src, ro) {
					actual = toStatfs(mf.apply(src, ro))
				}
				if !mf.matches(actual, src, ro) {
					t.Errorf("source %#x, flags %q, ro=%v: mount with %#x does not match its own request", src, req, ro, actual)
				}
			}
		}
	}
}
