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

	"github.com/localdir-csi/localdir/pkg/contract"
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
		// The spec bans U+0000-U+0008, U+000B, U+000C, U+000E-U+001F and
		// U+007F-U+009F; tab, LF and CR are allowed (case C49).
		{"tab", "a\tb", true, ""},
		{"newline", "name\n", true, ""},
		{"carriage return", "\rname", true, ""},
		{"CRLF", "a\r\nb", true, ""},
		{"U+0008 backspace", "a\bb", false, "U+0008"},
		{"U+0001", "a\x01b", false, "U+0001"},
		{"U+000B vertical tab", "a\vb", false, "U+000B"},
		{"U+000C form feed", "a\fb", false, "U+000C"},
		{"U+000E", "a\x0eb", false, "U+000E"},
		{"U+001F", "a\x1fb", false, "U+001F"},
		{"space", "a b", true, ""},
		{"escape", "\x1b[31m", false, "U+001B"},
		{"DEL", "a\x7f", false, "U+007F"},
		{"C1 NEL", "a\u0085", false, "U+0085"},
		{"C1 last", "a\u009f", false, "U+009F"},
		{"C1 first", "a\u0080", false, "U+0080"},
		{"U+00A0 is not a control char", "a\u00a0b", true, ""},
		{"128 bytes with newline at end", strings.Repeat("a", 127) + "\n", true, ""},
		{"128 bytes with control at end", strings.Repeat("a", 127) + "\x7f", false, "U+007F"},
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

// TestResolveCreateSize: with a content source the size is the source's,
// or required_bytes when larger; 0 fields are unspecified, never the
// default (case C50).
func TestResolveCreateSize(t *testing.T) {
	const src = 8 * mib
	tests := []struct {
		name     string
		cr       *csi.CapacityRange
		src      int64
		def, max int64
		want     int64
		code     codes.Code
	}{
		{"no source: the default", cr(0, 0), 0, gib, 0, gib, codes.OK},
		{"no source, nil range: the default", nil, 0, gib, 0, gib, codes.OK},
		{"nil range: the source's size", nil, src, gib, 0, src, codes.OK},
		{"empty range: the source's size", cr(0, 0), src, gib, 0, src, codes.OK},
		{"empty range, default below the source", cr(0, 0), src, 4 * mib, 0, src, codes.OK},
		{"limit above the source", cr(0, 16*mib), src, 4 * mib, 0, src, codes.OK},
		{"limit equal to the source", cr(0, src), src, 4 * mib, 0, src, codes.OK},
		{"limit below the source", cr(0, 4*mib), src, 4 * mib, 0, 0, codes.OutOfRange},
		{"required below the source", cr(mib, 0), src, gib, 0, src, codes.OK},
		{"required above the source", cr(12*mib, 0), src, gib, 0, 12 * mib, codes.OK},
		{"required above the source, unaligned", cr(12*mib+1, 0), src, gib, 0, 12*mib + 4096, codes.OK},
		{"required above the source, limit between", cr(12*mib+1, 12*mib+2), src, gib, 0, 12*mib + 2, codes.OK},
		{"range below the source", cr(2*mib, 4*mib), src, gib, 0, 0, codes.OutOfRange},
		{"source above the maximum", cr(0, 0), src, gib, 4 * mib, 0, codes.OutOfRange},
		{"source at the maximum", cr(0, 0), src, gib, src, src, codes.OK},
		{"required above the maximum", cr(16*mib, 0), src, gib, 12 * mib, 0, codes.OutOfRange},
		{"negative required", cr(-1, 0), src, gib, 0, 0, codes.InvalidArgument},
		{"inverted range", cr(16*mib, 12*mib), src, gib, 0, 0, codes.InvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveCreateSize(tc.cr, tc.src, tc.def, tc.max)
			wantCode(t, err, tc.code)
			if got != tc.want {
				t.Fatalf("resolveCreateSize = %d, want %d", got, tc.want)
			}
		})
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
	srcVol := contract.NewVolumeID()
	existing := func() *contract.Volume {
		return &contract.Volume{ID: contract.NewVolumeID(), Name: "pvc-1", CapacityBytes: gib, AccessType: contract.AccessMount,
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
		vol    func(*contract.Volume)
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
		{"no parameters either side", func(v *contract.Volume) { v.Parameters = nil }, func(r *csi.CreateVolumeRequest) {
			r.Parameters = map[string]string{"csi.storage.k8s.io/pv/name": "pv-1"}
		}, ""},
		{"nil vs empty parameters", func(v *contract.Volume) { v.Parameters = nil }, func(r *csi.CreateVolumeRequest) { r.Parameters = map[string]string{} }, ""},
		{"snapshot source requested", nil, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: contract.NewSnapshotID()}}}
		}, "another content source"},
		{"volume source matches", func(v *contract.Volume) { v.SourceVolumeID = srcVol }, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: srcVol}}}
		}, ""},
		{"volume source missing from request", func(v *contract.Volume) { v.SourceVolumeID = srcVol }, nil, "another content source"},
		{"other volume source", func(v *contract.Volume) { v.SourceVolumeID = srcVol }, func(r *csi.CreateVolumeRequest) {
			r.VolumeContentSource = &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: contract.NewVolumeID()}}}
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
			if vp.DirMode != tc.mode {
				t.Fatalf("dirMode = %#o, want %#o", vp.DirMode, tc.mode)
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
	if id, err := decodeToken("", contract.ValidVolumeID); err != nil || id != "" {
		t.Fatalf(`decodeToken("") = %q, %v; want "", nil`, id, err)
	}
	for i := 0; i < 100; i++ {
		id := contract.NewVolumeID()
		tok := encodeToken(id)
		if strings.Contains(tok, id) || strings.ContainsAny(tok, "+/=") {
			t.Fatalf("token %q is not opaque base64url", tok)
		}
		got, err := decodeToken(tok, contract.ValidVolumeID)
		if err != nil || got != id {
			t.Fatalf("decodeToken(encodeToken(%q)) = %q, %v", id, got, err)
		}
		// A volume token is no snapshot token.
		if _, err := decodeToken(tok, contract.ValidSnapshotID); status.Code(err) != codes.Aborted {
			t.Fatalf("volume token accepted as snapshot token: %v", err)
		}
	}
	snap := contract.NewSnapshotID()
	if got, err := decodeToken(encodeToken(snap), contract.ValidSnapshotID); err != nil || got != snap {
		t.Fatalf("snapshot token round trip: %q, %v", got, err)
	}

	vid := contract.NewVolumeID()
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
		{"snapshot id", b64("v1:" + contract.NewSnapshotID())},
		{"truncated base64", b64("v1:" + vid)[:5]},
		{"one char", "A"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			id, err := decodeToken(tc.tok, contract.ValidVolumeID)
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

// TestJudgeCapsAccessModes: every SINGLE_NODE_* mode is served, for mount
// and block; every other mode is an "exceeds" issue naming the mode
// (INVALID_ARGUMENT at CreateVolume, FAILED_PRECONDITION at the node).
// volOf is the existing volume a judgeCaps table row names: nil for "",
// else "<access type>[/<fs type>]".
func volOf(t string) *contract.Volume {
	if t == "" {
		return nil
	}
	at, fs, _ := strings.Cut(t, "/")
	return &contract.Volume{AccessType: contract.AccessType(at), FsType: fs}
}

func TestJudgeCapsAccessModes(t *testing.T) {
	for mode, name := range csi.VolumeCapability_AccessMode_Mode_name {
		m := csi.VolumeCapability_AccessMode_Mode(mode)
		if m == csi.VolumeCapability_AccessMode_UNKNOWN {
			continue // malformed, see TestJudgeCaps
		}
		single := strings.HasPrefix(name, "SINGLE_NODE_")
		for _, c := range []*csi.VolumeCapability{mountCap(m), blockCap(m)} {
			got := judgeCaps([]*csi.VolumeCapability{c}, nil)
			if single && got != nil {
				t.Errorf("judgeCaps(%v) = %+v, want nil", c, got)
			}
			if !single {
				if got == nil || !got.exceeds || got.malformed || !strings.Contains(got.msg, name) || !strings.Contains(got.msg, "not supported") {
					t.Errorf("judgeCaps(%v) = %+v, want an exceeds issue naming the mode", c, got)
					continue
				}
				wantCodeNamed(t, name+" at the node", checkNodeCap(c, nil), codes.FailedPrecondition)
				wantCodeNamed(t, name+" at create", got.err(), codes.InvalidArgument)
			}
		}
	}
}

func wantCodeNamed(t *testing.T, name string, err error, want codes.Code) {
	t.Helper()
	t.Run(name, func(t *testing.T) { wantCode(t, err, want) })
}

func mountCapFlags(fsType string, flags ...string) *csi.VolumeCapability {
	c := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	c.GetMount().FsType = fsType
	c.GetMount().MountFlags = flags
	return c
}

// TestJudgeCaps: the one decision on capabilities (case C38), and the code
// each kind of RPC derives from it.
func TestJudgeCaps(t *testing.T) {
	mnt, blk := mountCap(sw), blockCap(sw)
	tests := []struct {
		name    string
		caps    []*csi.VolumeCapability
		volType string // "" a new volume, else the access type and fs type of an existing one ("mount/ext4")
		want    string // "" ok, "malformed", "invalid" (INVALID_ARGUMENT at the node), "exceeds" (FAILED_PRECONDITION at the node)
		msgPart string
	}{
		{"nil", []*csi.VolumeCapability{nil}, "", "malformed", "volume_capability is required"},
		{"empty", []*csi.VolumeCapability{{}}, "", "malformed", "access_mode"},
		{"no access mode", []*csi.VolumeCapability{{AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}}}}, "", "malformed", "access_mode"},
		{"access mode UNKNOWN", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_UNKNOWN)}, "", "malformed", "access_mode"},
		{"no access type", []*csi.VolumeCapability{{AccessMode: &csi.VolumeCapability_AccessMode{Mode: sw}}}, "", "malformed", "access_type"},
		{"malformed beats unsupported later in the list", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), nil}, "", "malformed", "required"},
		{"mount", []*csi.VolumeCapability{mnt}, "", "", ""},
		{"block", []*csi.VolumeCapability{blk}, "", "", ""},
		{"mount for a mount volume", []*csi.VolumeCapability{mnt}, string(contract.AccessMount), "", ""},
		{"block for a block volume", []*csi.VolumeCapability{blk}, string(contract.AccessBlock), "", ""},
		{"two mount modes", []*csi.VolumeCapability{mnt, mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY)}, "", "", ""},
		{"fs_type ext4 makes an image volume", []*csi.VolumeCapability{mountCapFlags("ext4", "ro")}, "", "", ""},
		{"fs_type xfs makes an image volume", []*csi.VolumeCapability{mountCapFlags("xfs")}, "", "", ""},
		{"unknown fs_type for a new volume", []*csi.VolumeCapability{mountCapFlags("ext3")}, "", "invalid", `"ext3" is not supported`},
		{"two filesystems", []*csi.VolumeCapability{mountCapFlags("ext4"), mountCapFlags("xfs")}, "", "invalid", "several filesystems (ext4, xfs)"},
		{"its own fs_type", []*csi.VolumeCapability{mountCapFlags("ext4")}, "mount/ext4", "", ""},
		{"no fs_type for an image volume", []*csi.VolumeCapability{mountCapFlags("")}, "mount/xfs", "", ""},
		{"another fs_type for an image volume", []*csi.VolumeCapability{mountCapFlags("xfs")}, "mount/ext4", "exceeds", `holds an ext4 filesystem; a capability asks for fs_type "xfs"`},
		{"any fs_type for a directory volume (PVs made before image volumes)", []*csi.VolumeCapability{mountCapFlags("btrfs")}, string(contract.AccessMount), "", ""},
		{"applicable flags", []*csi.VolumeCapability{mountCapFlags("", "nosuid,nodev", "noexec", "noatime")}, "", "", ""},
		{"flags accepted without effect", []*csi.VolumeCapability{mountCapFlags("", "rw", "defaults")}, "", "", ""},
		{"sync", []*csi.VolumeCapability{mountCapFlags("", "sync")}, "", "invalid", `"sync"`},
		{"sync in a comma list", []*csi.VolumeCapability{mountCapFlags("", "nosuid,sync")}, "", "invalid", `"sync"`},
		{"conflicting atime flags", []*csi.VolumeCapability{mountCapFlags("", "noatime", "strictatime")}, "", "invalid", "atime"},
		{"mount and block", []*csi.VolumeCapability{mnt, blk}, "", "invalid", "both a mount and a block"},
		{"mount for a block volume", []*csi.VolumeCapability{mnt}, string(contract.AccessBlock), "exceeds", "block volume"},
		{"block for a mount volume", []*csi.VolumeCapability{blk}, string(contract.AccessMount), "exceeds", "mount volume"},
		{"multi-node", []*csi.VolumeCapability{mountCap(csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)}, "", "exceeds", "MULTI_NODE_READER_ONLY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := judgeCaps(tc.caps, volOf(tc.volType))
			kind := ""
			switch {
			case got == nil:
			case got.malformed:
				kind = "malformed"
			case got.exceeds:
				kind = "exceeds"
			default:
				kind = "invalid"
			}
			if kind != tc.want {
				t.Fatalf("judgeCaps = %+v (%q), want %q", got, kind, tc.want)
			}
			if got == nil {
				return
			}
			if !strings.Contains(got.msg, tc.msgPart) {
				t.Errorf("message %q does not contain %q", got.msg, tc.msgPart)
			}
			wantCode(t, got.err(), codes.InvalidArgument)
			nodeCode := codes.InvalidArgument
			if kind == "exceeds" {
				nodeCode = codes.FailedPrecondition
			}
			wantCode(t, got.nodeErr(), nodeCode)
			if len(tc.caps) == 1 {
				wantCode(t, checkNodeCap(tc.caps[0], volOf(tc.volType)), nodeCode)
			}
		})
	}
	if judgeCaps(nil, nil) != nil {
		t.Error("judgeCaps(nil) is an issue; the RPCs that require capabilities check for an empty list themselves")
	}
}

func TestAccessTypeOf(t *testing.T) {
	if got := accessTypeOf(nil); got != contract.AccessMount {
		t.Errorf("accessTypeOf(nil) = %q", got)
	}
	if got := accessTypeOf([]*csi.VolumeCapability{mountCap(sw)}); got != contract.AccessMount {
		t.Errorf("accessTypeOf(mount) = %q", got)
	}
	if got := accessTypeOf([]*csi.VolumeCapability{mountCap(sw), blockCap(sw)}); got != contract.AccessBlock {
		t.Errorf("accessTypeOf(mount, block) = %q", got)
	}
}
