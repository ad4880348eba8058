package driver

import (
	"encoding/base64"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/pkg/volume"
)

const (
	kib = int64(1) << 10
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// wantCode fails unless err carries gRPC code want (codes.OK: err == nil).
func wantCode(t *testing.T, err error, want codes.Code) {
	t.Helper()
	if want == codes.OK {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("got no error, want %s", want)
	}
	st, ok := status.FromError(err)
	if !ok {
		t.Fatalf("error %v (%T) carries no gRPC status, want %s", err, err, want)
	}
	if st.Code() != want {
		t.Fatalf("got code %s (%q), want %s", st.Code(), st.Message(), want)
	}
}

func TestCheckName(t *testing.T) {
	emoji := "\U0001F600" // 4 bytes in UTF-8
	if len(emoji) != 4 {
		t.Fatal("test rune is not 4 bytes")
	}
	tests := []struct {
		name    string
		in      string
		ok      bool
		msgPart string // substring of the error message when !ok
	}{
		{"empty", "", false, "is required"},
		{"simple", "pvc-0a1b2c", true, ""},
		{"single byte", "a", true, ""},
		{"spaces and punctuation", "my volume/ns:1 (x)", true, ""},
		{"127 bytes", strings.Repeat("a", 127), true, ""},
		{"128 bytes", strings.Repeat("a", 128), true, ""},
		{"129 bytes", strings.Repeat("a", 129), false, "129 bytes"},
		{"4-byte runes exactly 128 bytes", strings.Repeat(emoji, 32), true, ""},
		{"4-byte runes 132 bytes", strings.Repeat(emoji, 33), false, "132 bytes"},
		{"124 ascii + 4-byte rune = 128", strings.Repeat("a", 124) + emoji, true, ""},
		{"125 ascii + 4-byte rune = 129", strings.Repeat("a", 125) + emoji, false, "129 bytes"},
		{"2-byte runes 128 bytes", strings.Repeat("ü", 64), true, ""},
		{"3-byte runes 129 bytes", strings.Repeat("€", 43), false, "129 bytes"},
		{"invalid byte", "a\xffb", false, "UTF-8"},
		{"truncated sequence", "abc\xf0\x9f\x98", false, "UTF-8"},
		{"lone continuation", "\x80", false, "UTF-8"},
		{"overlong slash", "\xc0\xaf", false, "UTF-8"},
		{"surrogate half", "\xed\xa0\x80", false, "UTF-8"},
		{"explicit RuneError is valid", "\uFFFD", true, ""},
		{"NUL", "a\x00b", false, "U+0000"},
		{"only NUL", "\x00", false, "U+0000"},
		{"tab", "a\tb", false, "U+0009"},
		{"newline", "name\n", false, "U+000A"},
		{"carriage return", "\rname", false, "U+000D"},
		{"escape", "\x1b[31m", false, "U+001B"},
		{"DEL", "a\x7f", false, "U+007F"},
		{"C1 NEL", "a\u0085", false, "U+0085"},
		{"C1 last", "a\u009f", false, "U+009F"},
		{"U+00A0 is not a control char", "a\u00a0b", true, ""},
		{"128 bytes with control at end", strings.Repeat("a", 127) + "\n", false, "U+000A"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkName("name", tc.in)
			if tc.ok {
				wantCode(t, err, codes.OK)
				return
			}
			wantCode(t, err, codes.InvalidArgument)
			msg := status.Convert(err).Message()
			if !strings.HasPrefix(msg, "name ") {
				t.Errorf("message %q does not name the field", msg)
			}
			if !strings.Contains(msg, tc.msgPart) {
				t.Errorf("message %q does not contain %q", msg, tc.msgPart)
			}
		})
	}
}

func cr(req, lim int64) *csi.CapacityRange {
	return &csi.CapacityRange{RequiredBytes: req, LimitBytes: lim}
}

func TestResolveSize(t *testing.T) {
	const maxI = int64(math.MaxInt64)
	tests := []struct {
		name     string
		cr       *csi.CapacityRange
		def, max int64
		want     int64
		code     codes.Code
	}{
		// No range or an empty one: the default.
		{"nil range → default", nil, gib, 10 * gib, gib, codes.OK},
		{"zero range → default", cr(0, 0), gib, 10 * gib, gib, codes.OK},
		{"nil range, no max", nil, gib, 0, gib, codes.OK},
		{"default above max → max", nil, gib, 100 * mib, 100 * mib, codes.OK},
		{"default rounded up to 4 KiB", nil, 5000, 0, 8192, codes.OK},
		{"default rounded but max not aligned", nil, 5000, 6000, 6000, codes.OK},

		// Invalid ranges.
		{"negative required", cr(-1, 0), gib, 10 * gib, 0, codes.InvalidArgument},
		{"negative limit", cr(0, -1), gib, 10 * gib, 0, codes.InvalidArgument},
		{"both negative", cr(-5, -5), gib, 10 * gib, 0, codes.InvalidArgument},
		{"negative required with limit", cr(math.MinInt64, gib), gib, 10 * gib, 0, codes.InvalidArgument},
		{"required > limit", cr(2, 1), gib, 10 * gib, 0, codes.InvalidArgument},
		{"required > limit, both huge", cr(20*gib, 11*gib), gib, 10 * gib, 0, codes.InvalidArgument},

		// Above the maximum.
		{"required above max", cr(10*gib+1, 0), gib, 10 * gib, 0, codes.OutOfRange},
		{"required above max, limit higher", cr(11*gib, 12*gib), gib, 10 * gib, 0, codes.OutOfRange},
		{"required = max", cr(10*gib, 0), gib, 10 * gib, 10 * gib, codes.OK},
		{"required = unaligned max", cr(10000, 0), gib, 10000, 10000, codes.OK},
		{"rounding would pass unaligned max", cr(9000, 0), gib, 10000, 10000, codes.OK},
		{"limit above max, required 0", cr(0, 20*gib), 15 * gib, 10 * gib, 10 * gib, codes.OK},

		// Rounding to 4 KiB.
		{"required 1 → 4096", cr(1, 0), gib, 10 * gib, 4096, codes.OK},
		{"required 4096 stays", cr(4096, 0), gib, 10 * gib, 4096, codes.OK},
		{"required 4097 → 8192", cr(4097, 0), gib, 10 * gib, 8192, codes.OK},
		{"required 1 no max", cr(1, 0), gib, 0, 4096, codes.OK},
		{"required far above default, no max", cr(100*gib, 0), gib, 0, 100 * gib, codes.OK},

		// Limits.
		{"limit smaller than rounding → exact limit", cr(1, 100), gib, 10 * gib, 100, codes.OK},
		{"limit between required and rounded", cr(5000, 6000), gib, 10 * gib, 6000, codes.OK},
		{"required = limit unaligned", cr(5000, 5000), gib, 10 * gib, 5000, codes.OK},
		{"required = limit aligned", cr(gib, gib), 4096, 10 * gib, gib, codes.OK},
		{"required 0, limit above default → default", cr(0, 2*gib), gib, 10 * gib, gib, codes.OK},
		{"required 0, limit below default → limit", cr(0, 512*mib), gib, 10 * gib, 512 * mib, codes.OK},
		{"required 0, limit = default", cr(0, gib), gib, 10 * gib, gib, codes.OK},
		{"required 0, limit 1 byte", cr(0, 1), gib, 10 * gib, 1, codes.OK},
		{"required 0, limit 1 byte, no max", cr(0, 1), gib, 0, 1, codes.OK},
		{"limit only above max", cr(0, 20*gib), gib, 10 * gib, gib, codes.OK},

		// Near the int64 limit: no overflow, never a bogus OUT_OF_RANGE for
		// a satisfiable range.
		{"required MaxInt64, no max", cr(maxI, 0), gib, 0, maxI, codes.OK},
		{"required MaxInt64-1 within limit MaxInt64", cr(maxI-1, maxI), gib, 0, maxI - 1, codes.OK},
		{"required last aligned value", cr(maxI&^4095, 0), gib, 0, maxI &^ 4095, codes.OK},
		{"required just above last aligned value", cr(maxI&^4095+1, 0), gib, 0, maxI&^4095 + 1, codes.OK},
		{"default MaxInt64", nil, maxI, 0, maxI, codes.OK},
		{"required MaxInt64, max MaxInt64", cr(maxI, maxI), gib, maxI, maxI, codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveSize(tc.cr, tc.def, tc.max)
			wantCode(t, err, tc.code)
			if got != tc.want {
				t.Errorf("resolveSize(%v, def=%d, max=%d) = %d, want %d", tc.cr, tc.def, tc.max, got, tc.want)
			}
		})
	}
}

// checkResolveSize asserts the contract of resolveSize for any input with a
// positive default (Options.Validate guarantees one).
func checkResolveSize(t *testing.T, req, lim, def, maxB int64) {
	t.Helper()
	size, err := resolveSize(cr(req, lim), def, maxB)
	switch {
	case req < 0 || lim < 0 || (lim > 0 && req > lim):
		wantCode(t, err, codes.InvalidArgument)
		return
	case maxB > 0 && req > maxB:
		wantCode(t, err, codes.OutOfRange)
		return
	}
	// Every other range is satisfiable by some size in
	// [max(req,1), min(lim, max)].
	if err != nil {
		t.Fatalf("resolveSize(req=%d, lim=%d, def=%d, max=%d): unexpected error %v", req, lim, def, maxB, err)
	}
	if size <= 0 || size < req || (lim > 0 && size > lim) || (maxB > 0 && size > maxB) {
		t.Fatalf("resolveSize(req=%d, lim=%d, def=%d, max=%d) = %d: outside the range", req, lim, def, maxB, size)
	}
	if size%4096 != 0 && size != lim && size != maxB && size <= math.MaxInt64-4095 {
		t.Fatalf("resolveSize(req=%d, lim=%d, def=%d, max=%d) = %d: not 4 KiB aligned and not a bound", req, lim, def, maxB, size)
	}
	if req == 0 {
		// min(default, limit, max) rounded up within the bounds.
		want := def
		if maxB > 0 {
			want = min(want, maxB)
		}
		if lim > 0 {
			want = min(want, lim)
		}
		if size < want {
			t.Fatalf("resolveSize(req=0, lim=%d, def=%d, max=%d) = %d, below min(default, limit, max) = %d", lim, def, maxB, size, want)
		}
	}
}

func TestResolveSizeProperties(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	pick := func() int64 {
		switch r.Intn(8) {
		case 0:
			return 0
		case 1:
			return r.Int63n(8192)
		case 2:
			return math.MaxInt64 - r.Int63n(8192)
		case 3:
			return -r.Int63n(10) - 1
		case 4:
			return r.Int63n(16) * 4096
		default:
			return r.Int63()
		}
	}
	for i := 0; i < 200000; i++ {
		def := pick()
		if def <= 0 {
			def = gib
		}
		checkResolveSize(t, pick(), pick(), def, max(pick(), 0))
	}
}

func TestSizeFits(t *testing.T) {
	tests := []struct {
		size int64
		cr   *csi.CapacityRange
		want bool
	}{
		{gib, nil, true},
		{gib, cr(0, 0), true},
		{gib, cr(gib, 0), true},
		{gib, cr(gib+1, 0), false},
		{gib, cr(0, gib), true},
		{gib, cr(0, gib-1), false},
		{gib, cr(gib, gib), true},
		{gib, cr(1, 2*gib), true},
		{4096, cr(1, 100), false},
	}
	for _, tc := range tests {
		if got := sizeFits(tc.size, tc.cr); got != tc.want {
			t.Errorf("sizeFits(%d, %v) = %v, want %v", tc.size, tc.cr, got, tc.want)
		}
	}
}

func mountCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	}
}

func blockCap(mode csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: mode},
		AccessType: &csi.VolumeCapability_Block{Block: &csi.VolumeCapability_BlockVolume{}},
	}
}

const sw = csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func TestCompatible(t *testing.T) {
	srcVol := volume.NewVolumeID()
	existing := func() *state.Volume {
		return &state.Volume{ID: volume.NewVolumeID(), Name: "pvc-1", CapacityBytes: gib, AccessType: state.AccessMount,
			Parameters: map[string]string{"dirMode": "0770"}}
	}
	base := func() *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{
			Name:               "pvc-1",
			CapacityRange:      cr(gib, 0),
			VolumeCapabilities: []*csi.VolumeCapability{mountCap(sw)},
			Parameters: map[string]string{
				"dirMode":                          "0770",
				"csi.storage.k8s.io/pvc/name":      "data",
				"csi.storage.k8s.io/pvc/namespace": "default",
			},
		}
	}
	tests := []struct {
		name   string
		vol    func(*state.Volume)
		req    func(*csi.CreateVolumeRequest)
		reason string // "" = compatible; else a substring of the reason
	}{
		{"identical", nil, nil, ""},
		{"no capacity range", nil, func(r *csi.CreateVolumeRequest) { r.CapacityRange = nil }, ""},
		{"range containing the size", nil, func(r *csi.CreateVolumeRequest) { r.CapacityRange = cr(1, 2*gib) }, ""},
		{"reserved parameters differ", nil, func(r *csi.CreateVolumeRequest) { r.Parameters["csi.storage.k8s.io/pvc/name"] = "other" }, ""},
		{"required above size", nil, func(r *csi.CreateVolumeRequest) { r.CapacityRange = cr(gib+1, 0) }, "outside the requested capacity_range"},
		{"limit below size", nil, func(r *csi.CreateVolumeRequest) { r.CapacityRange = cr(0, gib-1) }, "outside the requested capacity_range"},
		{"block requested", nil, func(r *csi.CreateVolumeRequest) { r.VolumeCapabilities = []*csi.VolumeCapability{blockCap(sw)} }, "it is a mount volume, the request asks for block"},
		{"mount and block requested", nil, func(r *csi.CreateVolumeRequest) {
			r.VolumeCapabilities = append(r.VolumeCapabilities, blockCap(sw))
		}, "asks for block"},
		{"other dirMode", nil, func(r *csi.CreateVolumeRequest) { r.Parameters["dirMode"] = "0700" }, "other parameters"},
		{"extra parameter", nil, func(r *csi.CreateVolumeRequest) { r.Parameters["foo"] = "bar" }, "other parameters"},
		{"missing parameter", nil, func(r *csi.CreateVolumeRequest) { delete(r.Parameters, "dirMode") }, "other parameters"},
		{"no parameters either side", func(v *state.Volume) { v.Parameters = nil }, func(r *csi.CreateVolumeRequest) {
			r.Parameters = map[string]string{"csi.storage.k8s.io/pv/name": "pv-1"}
		}, ""},
		{"nil vs empty parameters", func(v *state.Volume) { v.Parameters = nil }, func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{} }, ""},
		{"snapshot source requested", nil, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: volume.NewSnapshotID()}}}
		}, "another content source"},
		{"volume source matches", func(v *state.Volume) { v.SourceVolumeID = srcVol }, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: srcVol}}}
		}, ""},
		{"volume source missing from request", func(v *state.Volume) { v.SourceVolumeID = srcVol }, nil, "another content source"},
		{"other volume source", func(v *state.Volume) { v.SourceVolumeID = srcVol }, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: volume.NewVolumeID()}}}
		}, "another content source"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, req := existing(), base()
			if tc.vol != nil {
				tc.vol(v)
			}
			if tc.req != nil {
				tc.req(req)
			}
			got := compatible(v, req)
			if tc.reason == "" {
				if got != "" {
					t.Fatalf("compatible = %q, want compatible", got)
				}
				return
			}
			if !strings.Contains(got, tc.reason) {
				t.Fatalf("compatible = %q, want it to contain %q", got, tc.reason)
			}
		})
	}
}

func TestParseParams(t *testing.T) {
	tests := []struct {
		name    string
		in      map[string]string
		mode    uint32
		ok      bool
		msgPart string
	}{
		{"nil", nil, DefaultDirMode, true, ""},
		{"empty", map[string]string{}, DefaultDirMode, true, ""},
		{"reserved only", map[string]string{
			"csi.storage.k8s.io/pvc/name":                     "data",
			"csi.storage.k8s.io/pvc/namespace":                "default",
			"csi.storage.k8s.io/pv/name":                      "pvc-123",
			"csi.storage.k8s.io/provisioner-secret-name":      "s",
			"csi.storage.k8s.io/some-future-key-we-dont-know": "x",
		}, DefaultDirMode, true, ""},
		{"dirMode 0770", map[string]string{"dirMode": "0770"}, 0o770, true, ""},
		{"dirMode without leading zero", map[string]string{"dirMode": "750"}, 0o750, true, ""},
		{"dirMode setgid", map[string]string{"dirMode": "2770"}, 0o2770, true, ""},
		{"dirMode 7777 upper bound", map[string]string{"dirMode": "7777"}, 0o7777, true, ""},
		{"dirMode 07777 upper bound", map[string]string{"dirMode": "07777"}, 0o7777, true, ""},
		{"dirMode 0", map[string]string{"dirMode": "0"}, 0, true, ""},
		{"dirMode many zeros", map[string]string{"dirMode": "0000000700"}, 0o700, true, ""},
		{"dirMode with reserved", map[string]string{"dirMode": "0700", "csi.storage.k8s.io/pvc/name": "x"}, 0o700, true, ""},
		{"dirMode 10000 above bound", map[string]string{"dirMode": "10000"}, 0, false, `dirMode="10000"`},
		{"dirMode 17777 above bound", map[string]string{"dirMode": "17777"}, 0, false, "dirMode"},
		{"dirMode huge", map[string]string{"dirMode": "77777777777"}, 0, false, "dirMode"},
		{"dirMode overflows uint32", map[string]string{"dirMode": "777777777777777777777"}, 0, false, "dirMode"},
		{"dirMode digit 8", map[string]string{"dirMode": "0780"}, 0, false, "dirMode"},
		{"dirMode decimal-looking 9", map[string]string{"dirMode": "9"}, 0, false, "dirMode"},
		{"dirMode 0o prefix", map[string]string{"dirMode": "0o770"}, 0, false, "dirMode"},
		{"dirMode hex", map[string]string{"dirMode": "0x1ff"}, 0, false, "dirMode"},
		{"dirMode underscore", map[string]string{"dirMode": "07_70"}, 0, false, "dirMode"},
		{"dirMode empty", map[string]string{"dirMode": ""}, 0, false, `dirMode=""`},
		{"dirMode negative", map[string]string{"dirMode": "-1"}, 0, false, "dirMode"},
		{"dirMode plus sign", map[string]string{"dirMode": "+770"}, 0, false, "dirMode"},
		{"dirMode spaces", map[string]string{"dirMode": " 0770"}, 0, false, "dirMode"},
		{"dirMode symbolic", map[string]string{"dirMode": "rwxrwx---"}, 0, false, "dirMode"},
		{"unknown parameter", map[string]string{"foo": "bar"}, 0, false, `unknown parameter "foo"`},
		{"unknown next to valid", map[string]string{"dirMode": "0770", "fsType": "ext4"}, 0, false, `unknown parameter "fsType"`},
		{"wrong case", map[string]string{"DirMode": "0770"}, 0, false, `unknown parameter "DirMode"`},
		{"reserved prefix without slash", map[string]string{"csi.storage.k8s.io": "x"}, 0, false, `unknown parameter "csi.storage.k8s.io"`},
		{"reserved prefix wrong case", map[string]string{"CSI.storage.k8s.io/pvc/name": "x"}, 0, false, `unknown parameter "CSI.storage.k8s.io/pvc/name"`},
		{"several unknown: first in order", map[string]string{"zeta": "1", "alpha": "1"}, 0, false, `unknown parameter "alpha"`},
		{"empty key", map[string]string{"": "x"}, 0, false, `unknown parameter ""`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vp, err := parseParams(tc.in)
			if !tc.ok {
				wantCode(t, err, codes.InvalidArgument)
				if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.msgPart) {
					t.Fatalf("message %q does not contain %q", msg, tc.msgPart)
				}
				return
			}
			wantCode(t, err, codes.OK)
			if vp.dirMode != tc.mode {
				t.Fatalf("dirMode = %#o, want %#o", vp.dirMode, tc.mode)
			}
		})
	}
	// The error for an unknown parameter lists what is known.
	_, err := parseParams(map[string]string{"foo": "bar"})
	for _, k := range KnownParameters {
		if !strings.Contains(status.Convert(err).Message(), k) {
			t.Errorf("message %q does not list known parameter %q", status.Convert(err).Message(), k)
		}
	}
}

func TestUserParams(t *testing.T) {
	tests := []struct {
		name string
		in   map[string]string
		want map[string]string
	}{
		{"nil", nil, nil},
		{"empty", map[string]string{}, nil},
		{"reserved only → nil", map[string]string{"csi.storage.k8s.io/pvc/name": "a", "csi.storage.k8s.io/pv/name": "b"}, nil},
		{"user only", map[string]string{"dirMode": "0770"}, map[string]string{"dirMode": "0770"}},
		{"mixed", map[string]string{"dirMode": "0770", "csi.storage.k8s.io/pvc/name": "a", "foo": ""},
			map[string]string{"dirMode": "0770", "foo": ""}},
		{"prefix without slash is user", map[string]string{"csi.storage.k8s.io": "x"}, map[string]string{"csi.storage.k8s.io": "x"}},
		{"prefix in the middle is user", map[string]string{"x.csi.storage.k8s.io/y": "1"}, map[string]string{"x.csi.storage.k8s.io/y": "1"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := userParams(tc.in)
			if (got == nil) != (tc.want == nil) {
				t.Fatalf("userParams(%v) = %#v, want %#v", tc.in, got, tc.want)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("userParams(%v) = %v, want %v", tc.in, got, tc.want)
			}
			for k, v := range tc.want {
				if gv, ok := got[k]; !ok || gv != v {
					t.Fatalf("userParams(%v) = %v, want %v", tc.in, got, tc.want)
				}
			}
		})
	}
	// The input is not modified.
	in := map[string]string{"csi.storage.k8s.io/pvc/name": "a", "dirMode": "0700"}
	_ = userParams(in)
	if len(in) != 2 {
		t.Fatalf("userParams modified its input: %v", in)
	}
}

func TestTokens(t *testing.T) {
	if got := encodeToken(""); got != "" {
		t.Fatalf(`encodeToken("") = %q, want ""`, got)
	}
	if id, err := decodeToken("", volume.ValidVolumeID); err != nil || id != "" {
		t.Fatalf(`decodeToken("") = %q, %v; want "", nil`, id, err)
	}
	for i := 0; i < 100; i++ {
		id := volume.NewVolumeID()
		tok := encodeToken(id)
		if strings.Contains(tok, id) || strings.ContainsAny(tok, "+/=") {
			t.Fatalf("token %q is not opaque base64url", tok)
		}
		got, err := decodeToken(tok, volume.ValidVolumeID)
		if err != nil || got != id {
			t.Fatalf("decodeToken(encodeToken(%q)) = %q, %v", id, got, err)
		}
		// A volume token is no snapshot token.
		if _, err := decodeToken(tok, volume.ValidSnapshotID); status.Code(err) != codes.Aborted {
			t.Fatalf("volume token accepted as snapshot token: %v", err)
		}
	}
	snap := volume.NewSnapshotID()
	if got, err := decodeToken(encodeToken(snap), volume.ValidSnapshotID); err != nil || got != snap {
		t.Fatalf("snapshot token round trip: %q, %v", got, err)
	}

	vid := volume.NewVolumeID()
	b64 := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	bad := []struct{ name, tok string }{
		{"not base64", "!!!not a token!!!"},
		{"plain id", vid},
		{"base64 without prefix", b64(vid)},
		{"wrong version prefix", b64("v2:" + vid)},
		{"prefix only", b64("v1:")},
		{"prefix case", b64("V1:" + vid)},
		{"padding appended", b64("v1:"+vid) + "="},
		{"std alphabet", b64("v1:" + vid)[:8] + "+/"},
		{"dot-dot", b64("v1:../../etc/passwd")},
		{"dot-dot after id", b64("v1:" + vid + "/../x")},
		{"absolute path", b64("v1:/etc/passwd")},
		{"absolute id-like path", b64("v1:/" + vid)},
		{"uppercase hex", b64("v1:" + strings.ToUpper(vid))},
		{"short id", b64("v1:" + vid[:len(vid)-1])},
		{"long id", b64("v1:" + vid + "0")},
		{"trailing newline", b64("v1:" + vid + "\n")},
		{"NUL inside", b64("v1:" + vid + "\x00")},
		{"leading space", b64("v1: " + vid)},
		{"snapshot id", b64("v1:" + volume.NewSnapshotID())},
		{"truncated base64", b64("v1:" + vid)[:5]},
		{"one char", "A"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			id, err := decodeToken(tc.tok, volume.ValidVolumeID)
			wantCode(t, err, codes.Aborted)
			if id != "" {
				t.Fatalf("decodeToken returned id %q with its error", id)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, "starting_token") {
				t.Fatalf("message %q does not name starting_token", msg)
			}
		})
	}
}

func TestCapProblem(t *testing.T) {
	for mode, name := range csi.VolumeCapability_AccessMode_Mode_name {
		m := csi.VolumeCapability_AccessMode_Mode(mode)
		single := strings.HasPrefix(name, "SINGLE_NODE_")
		got := capProblem(mountCap(m))
		if single && got != "" {
			t.Errorf("capProblem(mount, %s) = %q, want \"\"", name, got)
		}
		if !single && (!strings.Contains(got, name) || !strings.Contains(got, "not supported")) {
			t.Errorf("capProblem(mount, %s) = %q, want a refusal naming the mode", name, got)
		}
		// Raw block volumes are served in the same single-node modes.
		if got := capProblem(blockCap(m)); (got == "") != single {
			t.Errorf("capProblem(block, %s) = %q", name, got)
		}
	}
	// The multi-node modes, spelled out.
	for _, m := range []csi.VolumeCapability_AccessMode_Mode{
		csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
		csi.VolumeCapability_AccessMode_MULTI_NODE_SINGLE_WRITER,
		csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER,
	} {
		if capProblem(mountCap(m)) == "" {
			t.Errorf("multi-node mode %s accepted", m)
		}
		wantCodeNamed(t, m.String(), checkNodeCap(mountCap(m)), codes.FailedPrecondition)
		wantCodeNamed(t, m.String(), checkCapWellFormed(mountCap(m)), codes.OK)
	}
}

func wantCodeNamed(t *testing.T, name string, err error, want codes.Code) {
	t.Helper()
	t.Run(name, func(t *testing.T) { wantCode(t, err, want) })
}

func TestCheckCapWellFormed(t *testing.T) {
	tests := []struct {
		name    string
		c       *csi.VolumeCapability
		code    codes.Code
		msgPart string
		node    codes.Code // checkNodeCap
	}{
		{"nil", nil, codes.InvalidArgument, "volume_capability is required", codes.InvalidArgument},
		{"empty", &csi.VolumeCapability{}, codes.InvalidArgument, "access_mode", codes.InvalidArgument},
		{"no access mode", &csi.VolumeCapability{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}, codes.InvalidArgument, "access_mode", codes.InvalidArgument},
		{"access mode UNKNOWN", mountCap(csi.VolumeCapability_AccessMode_UNKNOWN), codes.InvalidArgument, "access_mode", codes.InvalidArgument},
		{"empty access mode message", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{}, AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}, codes.InvalidArgument, "access_mode", codes.InvalidArgument},
		{"no access type", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}}, codes.InvalidArgument, "access_type", codes.InvalidArgument},
		{"mount single writer", mountCap(sw), codes.OK, "", codes.OK},
		{"mount single node multi writer", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER), codes.OK, "", codes.OK},
		{"mount reader only", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), codes.OK, "", codes.OK},
		{"block single writer", blockCap(sw), codes.OK, "", codes.OK},
		{"block multi node is unsupported", blockCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY), codes.OK, "", codes.FailedPrecondition},
		{"multi node is well formed but unsupported", mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), codes.OK, "", codes.FailedPrecondition},
		{"mount with flags", &csi.VolumeCapability{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw},
			AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{FsType: "ext4", MountFlags: []string{"ro"}}}}, codes.OK, "", codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCapWellFormed(tc.c)
			wantCode(t, err, tc.code)
			if tc.code != codes.OK && !strings.Contains(status.Convert(err).Message(), tc.msgPart) {
				t.Fatalf("message %q does not contain %q", status.Convert(err).Message(), tc.msgPart)
			}
			wantCode(t, checkNodeCap(tc.c), tc.node)
		})
	}

	// The list form.
	wantCode(t, checkCapsWellFormed(nil), codes.InvalidArgument)
	wantCode(t, checkCapsWellFormed([]*csi.VolumeCapability{}), codes.InvalidArgument)
	wantCode(t, checkCapsWellFormed([]*csi.VolumeCapability{mountCap(sw)}), codes.OK)
	wantCode(t, checkCapsWellFormed([]*csi.VolumeCapability{mountCap(sw), blockCap(sw)}), codes.OK)
	wantCode(t, checkCapsWellFormed([]*csi.VolumeCapability{mountCap(sw), nil}), codes.InvalidArgument)
	wantCode(t, checkCapsWellFormed([]*csi.VolumeCapability{mountCap(sw), {AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}}}), codes.InvalidArgument)
}

func TestAccessTypeOf(t *testing.T) {
	if got := accessTypeOf(nil); got != state.AccessMount {
		t.Errorf("accessTypeOf(nil) = %q", got)
	}
	if got := accessTypeOf([]*csi.VolumeCapability{mountCap(sw)}); got != state.AccessMount {
		t.Errorf("accessTypeOf(mount) = %q", got)
	}
	if got := accessTypeOf([]*csi.VolumeCapability{mountCap(sw), blockCap(sw)}); got != state.AccessBlock {
		t.Errorf("accessTypeOf(mount, block) = %q", got)
	}
}
