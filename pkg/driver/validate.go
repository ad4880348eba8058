package driver

import (
	"encoding/base64"
	"fmt"
	"maps"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/state"
)

// maxNameBytes is the CSI limit on names and ids the driver accepts ("SP
// SHOULD support the maximum length of 128 bytes", spec "Size Limits").
const maxNameBytes = 128

// checkName validates a CSI name or CO-chosen id: non-empty, at most 128
// bytes of valid UTF-8 with no control characters. Returns INVALID_ARGUMENT.
func checkName(field, s string) error {
	if s == "" {
		return invalid("%s is required", field)
	}
	if len(s) > maxNameBytes {
		return invalid("%s is %d bytes long; at most %d are allowed", field, len(s), maxNameBytes)
	}
	if !utf8.ValidString(s) {
		return invalid("%s is not valid UTF-8", field)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return invalid("%s must not contain control characters (found %U)", field, r)
		}
	}
	return nil
}

// supportedAccessModes are the single-node modes: a local directory lives on
// one node, so the multi-node modes are refused.
var supportedAccessModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
}

// capProblem explains why a capability cannot be served, or returns "".
// Malformed capabilities (no access mode, no access type) are reported by
// checkCapsWellFormed instead.
func capProblem(c *csi.VolumeCapability) string {
	if !supportedAccessModes[c.GetAccessMode().GetMode()] {
		return fmt.Sprintf("access mode %s is not supported: localdir volumes live on one node (use a SINGLE_NODE_* mode)", c.GetAccessMode().GetMode())
	}
	return ""
}

// checkCapsWellFormed rejects an empty list and capabilities without an
// access mode or access type (INVALID_ARGUMENT).
func checkCapsWellFormed(caps []*csi.VolumeCapability) error {
	if len(caps) == 0 {
		return invalid("volume_capabilities are required")
	}
	for _, c := range caps {
		if err := checkCapWellFormed(c); err != nil {
			return err
		}
	}
	return nil
}

func checkCapWellFormed(c *csi.VolumeCapability) error {
	if c == nil {
		return invalid("volume_capability is required")
	}
	if c.GetAccessMode() == nil || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN {
		return invalid("volume_capability.access_mode is required")
	}
	if c.GetMount() == nil && c.GetBlock() == nil {
		return invalid("volume_capability.access_type (mount or block) is required")
	}
	return nil
}

// accessTypeOf is state.AccessBlock when any capability asks for block.
func accessTypeOf(caps []*csi.VolumeCapability) string {
	for _, c := range caps {
		if c.GetBlock() != nil {
			return state.AccessBlock
		}
	}
	return state.AccessMount
}

// Parameters. The csi.storage.k8s.io/ prefix is reserved for what
// external-provisioner adds (PVC name, namespace, secrets refs); those are
// accepted and not stored. Anything else must be one of these.
const (
	// ParamDirMode is the octal permission of a mount volume's root
	// directory, e.g. "0770". Default DefaultDirMode.
	ParamDirMode = "dirMode"
	// DefaultDirMode lets any pod user write, like a hostPath directory;
	// with fsGroup (CSIDriver fsGroupPolicy: File) kubelet narrows it.
	DefaultDirMode = 0o777
)

// KnownParameters lists every StorageClass parameter the driver accepts
// (besides the csi.storage.k8s.io/ ones), for docs and tests.
var KnownParameters = []string{ParamDirMode}

const reservedPrefix = "csi.storage.k8s.io/"

// userParams returns the parameters without the reserved prefix; a nil map
// when there are none, so records compare equal.
func userParams(p map[string]string) map[string]string {
	var out map[string]string
	for k, v := range p {
		if strings.HasPrefix(k, reservedPrefix) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// volumeParams is a parsed, validated parameter set.
type volumeParams struct {
	dirMode uint32
}

// parseParams validates StorageClass parameters. Errors: INVALID_ARGUMENT
// naming the unknown parameter or the bad value.
func parseParams(p map[string]string) (volumeParams, error) {
	vp := volumeParams{dirMode: DefaultDirMode}
	keys := sort.StringSlice(nil)
	for k := range userParams(p) {
		keys = append(keys, k)
	}
	keys.Sort()
	for _, k := range keys {
		v := p[k]
		switch k {
		case ParamDirMode:
			m, err := strconv.ParseUint(v, 8, 32)
			if err != nil || m > 0o7777 {
				return vp, invalid("parameter %s=%q: want an octal permission such as \"0770\"", k, v)
			}
			vp.dirMode = uint32(m)
		default:
			return vp, invalid("unknown parameter %q (known: %s, and the %s* ones the provisioner adds); remove it from the StorageClass", k, strings.Join(KnownParameters, ", "), reservedPrefix)
		}
	}
	return vp, nil
}

// roundUp rounds n up to a multiple of 4 KiB, the allocation unit. Above
// the largest such multiple that fits in an int64 it returns n unchanged.
func roundUp(n int64) int64 {
	if n > math.MaxInt64-4095 {
		return n
	}
	return (n + 4095) &^ 4095
}

// resolveSize turns a CapacityRange into the size to provision, in bytes.
// Without a range the default size is used (capped by the limit and the
// maximum). Errors: INVALID_ARGUMENT for negative or inverted ranges;
// OUT_OF_RANGE when the request exceeds maxBytes or cannot be met within
// limit_bytes.
func resolveSize(cr *csi.CapacityRange, defBytes, maxBytes int64) (int64, error) {
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if req < 0 || lim < 0 {
		return 0, invalid("capacity_range must not be negative (required_bytes=%d, limit_bytes=%d)", req, lim)
	}
	if lim > 0 && req > lim {
		return 0, invalid("capacity_range.required_bytes (%d) is larger than limit_bytes (%d)", req, lim)
	}
	if maxBytes > 0 && req > maxBytes {
		return 0, status.Errorf(codes.OutOfRange, "required_bytes %d exceeds the maximum volume size of %d bytes", req, maxBytes)
	}
	size := req
	if size == 0 {
		size = defBytes
		if maxBytes > 0 {
			size = min(size, maxBytes)
		}
	}
	size = roundUp(size)
	if maxBytes > 0 && size > maxBytes {
		size = max(req, maxBytes)
	}
	if lim > 0 && size > lim {
		size = lim
	}
	if size < req || size <= 0 {
		return 0, status.Errorf(codes.OutOfRange, "no size satisfies capacity_range (required_bytes=%d, limit_bytes=%d)", req, lim)
	}
	return size, nil
}

// sizeFits reports whether an existing size satisfies a capacity range.
func sizeFits(size int64, cr *csi.CapacityRange) bool {
	if cr == nil {
		return true
	}
	return size >= cr.GetRequiredBytes() && (cr.GetLimitBytes() == 0 || size <= cr.GetLimitBytes())
}

// compatible explains why an existing volume does not match a repeated
// CreateVolume, or returns "" (CSI spec CreateVolume: ALREADY_EXISTS).
func compatible(v *state.Volume, req *csi.CreateVolumeRequest) string {
	if !sizeFits(v.CapacityBytes, req.GetCapacityRange()) {
		return fmt.Sprintf("it has %d bytes, outside the requested capacity_range", v.CapacityBytes)
	}
	if at := accessTypeOf(req.GetVolumeCapabilities()); at != v.AccessType {
		return fmt.Sprintf("it is a %s volume, the request asks for %s", v.AccessType, at)
	}
	if !maps.Equal(v.Parameters, userParams(req.GetParameters())) {
		return "it was created with other parameters"
	}
	src := req.GetVolumeContentSource()
	if src.GetSnapshot().GetSnapshotId() != v.SourceSnapshotID || src.GetVolume().GetVolumeId() != v.SourceVolumeID {
		return "it was created from another content source"
	}
	return ""
}

// Pagination tokens are opaque to the CO: base64url("v1:" + last id). The id
// is validated on the way back in, so a token can never smuggle a path.
const tokenPrefix = "v1:"

func encodeToken(lastID string) string {
	if lastID == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(tokenPrefix + lastID))
}

// decodeToken returns the id to continue after. Errors: ABORTED for a token
// this driver did not issue (CSI spec ListVolumes/ListSnapshots errors).
func decodeToken(tok string, valid func(string) bool) (string, error) {
	if tok == "" {
		return "", nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(tok)
	id, ok := strings.CutPrefix(string(raw), tokenPrefix)
	if err != nil || !ok || !valid(id) {
		return "", status.Errorf(codes.Aborted, "starting_token %q was not issued by this driver", tok)
	}
	return id, nil
}
