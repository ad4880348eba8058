package driver

import (
	"encoding/base64"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
)

// maxNameBytes is the CSI limit on names and ids the driver accepts ("SP
// SHOULD support the maximum length of 128 bytes", spec "Size Limits").
const maxNameBytes = 128

// checkName validates a CSI name (CreateVolume, CreateSnapshot): non-empty,
// at most maxNameBytes of valid UTF-8, nothing bannedInName. INVALID_ARGUMENT
// names the character as U+XXXX, never raw. Names are never used in a path.
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
		if bannedInName(r) {
			return invalid("%s must not contain the control character %U (the CSI spec bans U+0000-U+0008, U+000B, U+000C, U+000E-U+001F and U+007F-U+009F in names)", field, r)
		}
	}
	return nil
}

// bannedInName reports the control characters the CSI spec bans in names:
// all but tab, line feed and carriage return.
func bannedInName(r rune) bool {
	switch {
	case r <= 0x08, r == 0x0b, r == 0x0c, r >= 0x0e && r <= 0x1f, r >= 0x7f && r <= 0x9f:
		return true
	}
	return false
}

// supportedAccessModes are the single-node modes: a local directory lives on
// one node, so the multi-node modes are refused.
var supportedAccessModes = map[csi.VolumeCapability_AccessMode_Mode]bool{
	csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER:        true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY:   true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER: true,
	csi.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER:  true,
}

// capIssue is why judgeCaps refuses capabilities. CreateVolume answers err,
// node calls and ControllerPublishVolume nodeErr; ValidateVolumeCapabilities
// and GetCapacity answer err only when malformed.
type capIssue struct {
	// malformed: a required part is missing; INVALID_ARGUMENT everywhere.
	malformed bool
	// exceeds: well formed but more than a volume can serve (a multi-node
	// mode, the other access type): FAILED_PRECONDITION, CSI "Exceeds
	// capabilities". Otherwise a refused value: INVALID_ARGUMENT.
	exceeds bool
	msg     string
}

// nodeErr is the gRPC error of a node call (and ControllerPublishVolume).
func (i *capIssue) nodeErr() error {
	if i.exceeds && !i.malformed {
		return status.Error(codes.FailedPrecondition, i.msg)
	}
	return status.Error(codes.InvalidArgument, i.msg)
}

// err is INVALID_ARGUMENT with the issue's message.
func (i *capIssue) err() error { return status.Error(codes.InvalidArgument, i.msg) }

// judgeCaps is the one decision on volume capabilities, shared by every RPC
// that takes them so that none confirms what another refuses. It returns the
// first issue, or nil: malformed (over the whole list first); per capability
// a non-SINGLE_NODE_* mode, a refused mount flag, the fs_type (judgeFsType),
// another access type than vol's; then a list asking for mount and block, or
// two filesystems (CSI: the volume MUST satisfy every capability). An empty
// list is no issue; the RPCs that require capabilities say so.
func judgeCaps(caps []*csi.VolumeCapability, vol *contract.Volume) *capIssue {
	for _, c := range caps {
		if msg := malformedCap(c); msg != "" {
			return &capIssue{malformed: true, msg: msg}
		}
	}
	for _, c := range caps {
		if m := c.GetAccessMode().GetMode(); !supportedAccessModes[m] {
			return &capIssue{exceeds: true, msg: fmt.Sprintf("access mode %s is not supported: localdir volumes live on one node (use a SINGLE_NODE_* mode)", m)}
		}
		if mnt := c.GetMount(); mnt != nil {
			if _, err := mount.ParseFlags(mnt.GetMountFlags()); err != nil {
				return &capIssue{msg: err.Error()}
			}
			if i := judgeFsType(mnt.GetFsType(), vol); i != nil {
				return i
			}
		}
		if at := accessTypeOf([]*csi.VolumeCapability{c}); vol != nil && vol != notLookedUp && at != vol.AccessType {
			return &capIssue{exceeds: true, msg: fmt.Sprintf("the volume is a %s volume; a capability asks for %s", vol.AccessType, at)}
		}
	}
	var mount, blk bool
	fsTypes := map[string]bool{}
	for _, c := range caps {
		mount, blk = mount || c.GetMount() != nil, blk || c.GetBlock() != nil
		if fs := c.GetMount().GetFsType(); fs != "" {
			fsTypes[fs] = true
		}
	}
	if mount && blk {
		return &capIssue{msg: "volume_capabilities ask for both a mount and a block volume; a volume is one or the other, so none satisfies every capability"}
	}
	if len(fsTypes) > 1 {
		return &capIssue{msg: fmt.Sprintf("volume_capabilities ask for several filesystems (%s); a volume holds one", strings.Join(slices.Sorted(maps.Keys(fsTypes)), ", "))}
	}
	return nil
}

// notLookedUp stands in judgeCaps for the volume of a node call judged before
// the lookup: only what needs no volume is decided then.
var notLookedUp = &contract.Volume{}

// judgeFsType is judgeCaps' decision on a mount capability's fs_type for vol
// (nil: a new volume, which needs "" or one of contract.FsTypes). A directory
// volume accepts any fs_type: it has no filesystem of its own to check, and a
// CO may send one for it (external-provisioner's --default-fstype, a PV
// written by hand).
func judgeFsType(fs string, vol *contract.Volume) *capIssue {
	switch {
	case fs == "" || vol == notLookedUp:
		return nil
	case vol == nil:
		if _, ok := contract.FsTypes[fs]; !ok {
			return &capIssue{msg: fmt.Sprintf("fs_type %q is not supported: leave it empty for a directory volume, or use %s for an image volume", fs, strings.Join(slices.Sorted(maps.Keys(contract.FsTypes)), " or "))}
		}
	case vol.FsType != "" && fs != vol.FsType:
		return &capIssue{exceeds: true, msg: fmt.Sprintf("the volume holds an %s filesystem; a capability asks for fs_type %q", vol.FsType, fs)}
	}
	return nil
}

// fsTypeOf is the fs_type the mount capabilities ask for ("" for none or
// a directory volume); judgeCaps has refused lists asking for two.
func fsTypeOf(caps []*csi.VolumeCapability) string {
	for _, c := range caps {
		if fs := c.GetMount().GetFsType(); fs != "" {
			return fs
		}
	}
	return ""
}

func malformedCap(c *csi.VolumeCapability) string {
	switch {
	case c == nil:
		return "volume_capability is required"
	case c.GetAccessMode() == nil || c.GetAccessMode().GetMode() == csi.VolumeCapability_AccessMode_UNKNOWN:
		return "volume_capability.access_mode is required"
	case c.GetMount() == nil && c.GetBlock() == nil:
		return "volume_capability.access_type (mount or block) is required"
	}
	return ""
}

// checkNodeCap judges the one capability of a node call (or
// ControllerPublishVolume) for vol. Codes: see nodeErr.
func checkNodeCap(c *csi.VolumeCapability, vol *contract.Volume) error {
	if i := judgeCaps([]*csi.VolumeCapability{c}, vol); i != nil {
		return i.nodeErr()
	}
	return nil
}

// accessTypeOf is contract.AccessBlock when any capability asks for block.
func accessTypeOf(caps []*csi.VolumeCapability) contract.AccessType {
	for _, c := range caps {
		if c.GetBlock() != nil {
			return contract.AccessBlock
		}
	}
	return contract.AccessMount
}

// StorageClass parameters: see pkg/contract, which pkg/cluster shares.
const (
	// ParamDirMode is contract.ParamDirMode.
	ParamDirMode = contract.ParamDirMode
	// DefaultDirMode is contract.DefaultDirMode.
	DefaultDirMode = contract.DefaultDirMode
	reservedPrefix = contract.ReservedPrefix
)

// KnownParameters lists every StorageClass parameter the driver accepts
// (besides the csi.storage.k8s.io/ ones), for docs and tests.
var KnownParameters = contract.KnownParameters

func userParams(p map[string]string) map[string]string { return contract.UserParams(p) }

type volumeParams = contract.Params

func parseParams(p map[string]string) (volumeParams, error) { return contract.ParseParams(p) }

// roundUp rounds n up to a multiple of 4 KiB, the allocation unit. Above
// the largest such multiple that fits in an int64 it returns n unchanged.
func roundUp(n int64) int64 {
	if n > math.MaxInt64-4095 {
		return n
	}
	return (n + 4095) &^ 4095
}

// resolveSize turns a CapacityRange into the size to provision; without one,
// the default size capped by the limit and maximum. Errors: INVALID_ARGUMENT
// (negative or inverted range), OUT_OF_RANGE (above maxBytes or limit_bytes).
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

// alignBlocks fits the size resolveSize chose for an image or raw block
// volume to whole contract.BlockBytes blocks: resolveSize leaves it
// unaligned only at a bound (limit_bytes, --max-volume-size), so it rounds
// down, and OUT_OF_RANGE when that falls below required_bytes.
func alignBlocks(size int64, cr *csi.CapacityRange) (int64, error) {
	if size%contract.BlockBytes == 0 {
		return size, nil
	}
	aligned := size &^ (contract.BlockBytes - 1)
	if aligned <= 0 || aligned < cr.GetRequiredBytes() {
		return 0, status.Errorf(codes.OutOfRange, "an image or raw block volume is a whole number of %d-byte blocks (its loop device's sector); none lies between required_bytes %d and %d bytes (limit_bytes %d)",
			contract.BlockBytes, cr.GetRequiredBytes(), size, cr.GetLimitBytes())
	}
	return aligned, nil
}

// resolveCreateSize is the size of a new volume: resolveSize's without a
// content source; with one, max(required_bytes rounded up, srcSize), never
// the default (a zero field is unspecified, CSI CapacityRange). OUT_OF_RANGE
// too when limit_bytes or maxBytes is below srcSize.
func resolveCreateSize(cr *csi.CapacityRange, srcSize, defBytes, maxBytes int64) (int64, error) {
	if srcSize <= 0 {
		return resolveSize(cr, defBytes, maxBytes)
	}
	req, lim := cr.GetRequiredBytes(), cr.GetLimitBytes()
	if req < 0 || lim < 0 || (lim > 0 && req > lim) {
		return resolveSize(cr, defBytes, maxBytes) // the INVALID_ARGUMENT of a bad range
	}
	if lim > 0 && srcSize > lim {
		return 0, status.Errorf(codes.OutOfRange, "the content source holds %d bytes, more than limit_bytes %d; a volume cannot be smaller than its source", srcSize, lim)
	}
	if maxBytes > 0 && srcSize > maxBytes {
		return 0, status.Errorf(codes.OutOfRange, "the content source holds %d bytes, more than the maximum volume size of %d bytes", srcSize, maxBytes)
	}
	return resolveSize(&csi.CapacityRange{RequiredBytes: max(req, srcSize), LimitBytes: lim}, defBytes, maxBytes)
}

// fitFsType rounds the size of a new image volume up to the smallest
// filesystem its mkfs makes (contract.FsTypes), when limit_bytes and
// maxBytes allow it. Errors: OUT_OF_RANGE.
func fitFsType(size int64, fsType string, limit, maxBytes int64) (int64, error) {
	minSize := contract.FsTypes[fsType]
	if size >= minSize {
		return size, nil
	}
	if limit > 0 && limit < minSize {
		return 0, status.Errorf(codes.OutOfRange, "an %s volume needs at least %d bytes (the smallest filesystem mkfs.%s makes); limit_bytes %d is below it",
			fsType, minSize, fsType, limit)
	}
	if maxBytes > 0 && maxBytes < minSize {
		return 0, status.Errorf(codes.OutOfRange, "an %s volume needs at least %d bytes (the smallest filesystem mkfs.%s makes); the driver's maximum volume size (--max-volume-size) %d is below it",
			fsType, minSize, fsType, maxBytes)
	}
	return minSize, nil
}

func sizeFits(size int64, cr *csi.CapacityRange) bool {
	if cr == nil {
		return true
	}
	return size >= cr.GetRequiredBytes() && (cr.GetLimitBytes() == 0 || size <= cr.GetLimitBytes())
}

// compatible explains why an existing volume does not match a repeated
// CreateVolume, or returns "" (CSI spec CreateVolume: ALREADY_EXISTS).
func compatible(v *contract.Volume, req *csi.CreateVolumeRequest) string {
	if !sizeFits(v.CapacityBytes, req.GetCapacityRange()) {
		return fmt.Sprintf("it has %d bytes, outside the requested capacity_range", v.CapacityBytes)
	}
	if at := accessTypeOf(req.GetVolumeCapabilities()); at != v.AccessType {
		return fmt.Sprintf("it is a %s volume, the request asks for %s", v.AccessType, at)
	}
	if fs := fsTypeOf(req.GetVolumeCapabilities()); fs != v.FsType {
		return fmt.Sprintf("it holds fs_type %q, the request asks for %q", v.FsType, fs)
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
