package mount

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func FuzzParseFlags(f *testing.F) {
	f.Add("ro", "", uint64(stValid|stRelatime), false)
	f.Add("nosuid,nodev", "noexec", uint64(stValid), true)
	f.Add("noatime,relatime", "", uint64(0), false)
	f.Add("relatime", "ro", uint64(stValid|stRelatime|stNosuid), false)
	f.Add(" strictatime , ", "nodiratime", uint64(stValid|stNoatime), true)
	f.Add("sync", "", uint64(0), false)
	f.Add("rw,suid,dev,exec,atime,diratime,defaults,bind,rbind", "", uint64(0xffffffff), false)
	f.Fuzz(func(t *testing.T, a, b string, inherited uint64, ro bool) {
		in := []string{a, b}
		mf, err := ParseFlags(in)
		if err != nil {
			if !errors.Is(err, contract.ErrInvalid) {
				t.Fatalf("ParseFlags(%q) = %v, not contract.ErrInvalid", in, err)
			}
			if mf.set != 0 || mf.atimeSet || mf.list != nil {
				t.Fatalf("partial result %+v with error", mf)
			}
			return
		}
		checkParsed(t, mf)
		checkApplied(t, mf, uintptr(inherited), ro)
	})
}

// checkParsed: a parsed list holds restricting flags and at most one atime
// mode, and its normalized list parses to the same flags.
func checkParsed(t *testing.T, mf Flags) {
	t.Helper()
	if mf.set&^(restrictFlags|unix.MS_NODIRATIME) != 0 {
		t.Fatalf("set %#x has bits other than restricting flags", mf.set)
	}
	switch {
	case !mf.atimeSet && mf.atime != 0:
		t.Fatalf("atime %#x without atimeSet", mf.atime)
	case mf.atimeSet && mf.atime != unix.MS_NOATIME && mf.atime != unix.MS_RELATIME && mf.atime != unix.MS_STRICTATIME:
		t.Fatalf("atime %#x is not one atime mode", mf.atime)
	}
	for _, f := range mf.list {
		if _, ok := flagTable[f]; !ok || f != strings.TrimSpace(f) {
			t.Fatalf("list holds %q", f)
		}
	}
	// The normalized list parses to the same flags.
	again, err := ParseFlags(mf.list)
	if err != nil || again.set != mf.set || again.atime != mf.atime || again.atimeSet != mf.atimeSet || !slices.Equal(again.list, mf.list) {
		t.Fatalf("reparse of %q = %+v, %v; want %+v", mf.list, again, err, mf)
	}
}

// checkApplied: the flags a bind mount gets keep the inherited
// restrictions, add the requested ones, and match when no remount is needed.
func checkApplied(t *testing.T, mf Flags, inh uintptr, ro bool) {
	t.Helper()
	if inh&stNoatime != 0 {
		// The kernel never reports noatime and relatime together (one
		// atime mode per mount).
		inh &^= stRelatime
	}
	got := mf.apply(inh, ro)
	if got&^perMountMask != 0 {
		t.Fatalf("apply(%#x) = %#x has non per-mount bits", inh, got)
	}
	if bits := got & atimeMask; bits&(bits-1) != 0 {
		t.Fatalf("apply(%#x) = %#x sets more than one atime mode", inh, got)
	}
	if ro && got&unix.MS_RDONLY == 0 {
		t.Fatalf("apply(%#x, ro) = %#x is not read-only", inh, got)
	}
	if got&mf.set != mf.set {
		t.Fatalf("apply(%#x) = %#x lost requested flags %#x", inh, got, mf.set)
	}
	if keep := inh & (stRO | stNosuid | stNodev | stNoexec | stNodirat); got&keep != keep {
		t.Fatalf("apply(%#x) = %#x loosened an inherited restriction", inh, got)
	}
	if !mf.needsRemount(inh, ro) && !mf.matches(inh, inh, ro) {
		t.Fatalf("flags %q on source %#x ro=%v: a plain bind needs no remount but does not match", mf.list, inh, ro)
	}
}
