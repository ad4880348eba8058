package driver

import (
	"encoding/base64"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func FuzzCheckName(f *testing.F) {
	for _, s := range []string{
		"", "a", "pvc-0a1b2c3d", strings.Repeat("a", 128), strings.Repeat("a", 129),
		strings.Repeat("\U0001F600", 32), strings.Repeat("a", 125) + "\U0001F600",
		"a\x00b", "\t", "x\n", "\x7f", "\u0085", "\xff", "\xc0\xaf", "\xed\xa0\x80", "\uFFFD", "ü€",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := checkName("name", s)
		// The CSI spec's banned characters, spelled out apart from
		// bannedInName: the control characters but tab, LF and CR.
		banned := func(r rune) bool { return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r' }
		want := s != "" && len(s) <= maxNameBytes && utf8.ValidString(s) &&
			strings.IndexFunc(s, banned) < 0
		if err == nil && !want {
			t.Fatalf("checkName accepted %q", s)
		}
		if err != nil {
			if want {
				t.Fatalf("checkName refused %q: %v", s, err)
			}
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("checkName(%q) = %v, want InvalidArgument", s, err)
			}
			// The message is printable (no raw control bytes echoed back).
			if msg := status.Convert(err).Message(); !utf8.ValidString(msg) || strings.IndexFunc(msg, unicode.IsControl) >= 0 {
				t.Fatalf("error message %q holds invalid UTF-8 or control characters", msg)
			}
		}
	})
}

func FuzzDecodeToken(f *testing.F) {
	vid := contract.NewVolumeID()
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	for _, s := range []string{
		"", encodeToken(vid), encodeToken(contract.NewSnapshotID()), vid, b64(vid), b64("v1:"),
		b64("v1:../../etc/passwd"), b64("v1:/" + vid), b64("v1:" + strings.ToUpper(vid)),
		b64("v1:" + vid + "\n"), b64("v1:" + vid + "\x00"), encodeToken(vid) + "=", "!!!", "A",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tok string) {
		id, err := decodeToken(tok, contract.ValidVolumeID)
		if err != nil {
			if id != "" {
				t.Fatalf("decodeToken(%q) returned id %q with error %v", tok, id, err)
			}
			if status.Code(err) != codes.Aborted {
				t.Fatalf("decodeToken(%q) = %v, want Aborted", tok, err)
			}
			return
		}
		if tok == "" {
			if id != "" {
				t.Fatalf(`decodeToken("") = %q`, id)
			}
			return
		}
		if !contract.ValidVolumeID(id) {
			t.Fatalf("decodeToken(%q) = %q without error, not a valid volume id", tok, id)
		}
		// What decodes re-encodes to a token that decodes the same way.
		again, err := decodeToken(encodeToken(id), contract.ValidVolumeID)
		if err != nil || again != id {
			t.Fatalf("round trip of %q: %q, %v", id, again, err)
		}
	})
}

func FuzzTokenRoundTrip(f *testing.F) {
	for _, s := range []string{"", contract.NewVolumeID(), "vol-", "../x", "/abs", "v1:vol-x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		got, err := decodeToken(encodeToken(id), contract.ValidVolumeID)
		switch {
		case id == "":
			if got != "" || err != nil {
				t.Fatalf(`empty id: %q, %v`, got, err)
			}
		case contract.ValidVolumeID(id):
			if got != id || err != nil {
				t.Fatalf("round trip of %q: %q, %v", id, got, err)
			}
		default:
			if got != "" || status.Code(err) != codes.Aborted {
				t.Fatalf("invalid id %q: %q, %v", id, got, err)
			}
		}
	})
}

func FuzzParseParams(f *testing.F) {
	f.Add("dirMode", "0770", "", "")
	f.Add("dirMode", "7777", "csi.storage.k8s.io/pvc/name", "x")
	f.Add("dirMode", "10000", "", "")
	f.Add("dirMode", "", "", "")
	f.Add("dirMode", "0o770", "", "")
	f.Add("foo", "bar", "dirMode", "0700")
	f.Add("csi.storage.k8s.io/pv/name", "x", "csi.storage.k8s.io/pvc/namespace", "y")
	f.Add("csi.storage.k8s.io", "x", "", "")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		p := map[string]string{k1: v1, k2: v2}
		vp, err := parseParams(p)
		user := userParams(p)
		for k := range user {
			if strings.HasPrefix(k, reservedPrefix) {
				t.Fatalf("userParams kept reserved key %q", k)
			}
		}
		for k := range p {
			if _, kept := user[k]; !kept && !strings.HasPrefix(k, reservedPrefix) {
				t.Fatalf("userParams dropped user key %q", k)
			}
		}
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("parseParams(%v) = %v, want InvalidArgument", p, err)
			}
			msg := status.Convert(err).Message()
			if !strings.Contains(msg, "unknown parameter") && !strings.Contains(msg, ParamDirMode) {
				t.Fatalf("parseParams(%v): message %q names neither an unknown parameter nor %s", p, msg, ParamDirMode)
			}
			return
		}
		for k := range user {
			if k != ParamDirMode {
				t.Fatalf("parseParams(%v) accepted unknown parameter %q", p, k)
			}
		}
		if vp.DirMode > 0o7777 {
			t.Fatalf("parseParams(%v): dirMode %#o out of range", p, vp.DirMode)
		}
		if v, ok := user[ParamDirMode]; !ok {
			if vp.DirMode != DefaultDirMode {
				t.Fatalf("parseParams(%v): dirMode %#o without the parameter", p, vp.DirMode)
			}
		} else if v == "" || strings.Trim(v, "01234567") != "" {
			t.Fatalf("parseParams(%v) accepted dirMode %q", p, v)
		}
	})
}

func FuzzResolveSize(f *testing.F) {
	f.Add(int64(0), int64(0), gib, 10*gib)
	f.Add(int64(1), int64(100), gib, 10*gib)
	f.Add(int64(-1), int64(0), gib, int64(0))
	f.Add(int64(2), int64(1), gib, int64(0))
	f.Add(11*gib, int64(0), gib, 10*gib)
	f.Add(int64(9223372036854775807), int64(0), gib, int64(0))
	f.Fuzz(func(t *testing.T, req, lim, def, maxB int64) {
		if def <= 0 || maxB < 0 {
			t.Skip("Options.Validate refuses these")
		}
		checkResolveSize(t, req, lim, def, maxB)
	})
}
