// Package contract holds what localdir's CSI services (pkg/driver) and their
// backends (pkg/volume, pkg/cluster) agree on: the volume and snapshot types,
// topology, StorageClass and mutable parameters, the error sentinels and
// their one mapping to gRPC codes. It imports no other localdir package.
package contract

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TopologyKey is the accessible_topology segment key that pins a volume to
// its node. Its value is the node id.
const TopologyKey = "topology.localdir.csi.dev/node"

// Admits reports whether a topology segment set describes node: every key
// it names must be TopologyKey, with node as its value.
func Admits(t *csi.Topology, node string) bool {
	for k, v := range t.GetSegments() {
		if k != TopologyKey || v != node {
			return false
		}
	}
	return true
}

// Reachable reports whether accessibility_requirements admit node: one
// requisite topology must name it; preferred ones alone are a preference.
func Reachable(req *csi.TopologyRequirement, node string) bool {
	if len(req.GetRequisite()) == 0 {
		return true
	}
	for _, t := range req.GetRequisite() {
		if Admits(t, node) {
			return true
		}
	}
	return false
}

// Parameters. Those with the csi.storage.k8s.io/ prefix (external-provisioner's)
// are accepted and not stored; anything else must be one of these.
const (
	// ParamDirMode is the octal permission of a mount volume's root
	// directory, e.g. "0770". Default DefaultDirMode.
	ParamDirMode = "dirMode"
	// DefaultDirMode lets any pod user write, like a hostPath directory;
	// with fsGroup (CSIDriver fsGroupPolicy: File) kubelet narrows it.
	DefaultDirMode = 0o777
	// ReservedPrefix marks the parameters the CO adds.
	ReservedPrefix = "csi.storage.k8s.io/"
)

// KnownParameters lists every StorageClass parameter the driver accepts
// (besides the csi.storage.k8s.io/ ones), for docs and tests.
var KnownParameters = []string{ParamDirMode, ParamTransferBandwidth, ParamEncryption}

// ParamEncryption encrypts a volume at rest: EncryptionFscrypt (an ext4
// image volume's data directory, or a directory volume's directory on an
// ext4 data root with the encrypt feature, with the key of the
// StorageClass's node-stage Secret) or "none" (the default).
const ParamEncryption = "encryption"

// EncryptionFscrypt is the ParamEncryption value for the kernel's
// filesystem encryption (pkg/volume/fscrypt).
const EncryptionFscrypt = "fscrypt"

// ParamTransferBandwidth caps the bytes per second of one restore or clone
// copied from another node (a quantity, "100Mi"; "0" or absent: no cap).
const ParamTransferBandwidth = "transferBandwidth"

// UserParams returns the parameters without the reserved prefix; a nil map
// when there are none, so records compare equal.
func UserParams(p map[string]string) map[string]string {
	var out map[string]string
	for k, v := range p {
		if strings.HasPrefix(k, ReservedPrefix) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// Params is a parsed, validated parameter set.
type Params struct {
	// DirMode is the chmod(2) permission bits of a mount volume's root.
	DirMode uint32
	// TransferBandwidth is ParamTransferBandwidth in bytes per second (0:
	// no cap).
	TransferBandwidth uint64
	// Encryption is ParamEncryption: EncryptionFscrypt, or "" for none.
	Encryption string
}

// ParseParams validates StorageClass parameters (a request's or a record's).
// Errors: INVALID_ARGUMENT naming the unknown parameter or the bad value.
func ParseParams(p map[string]string) (Params, error) {
	vp := Params{DirMode: DefaultDirMode}
	keys := sort.StringSlice(nil)
	for k := range UserParams(p) {
		keys = append(keys, k)
	}
	keys.Sort()
	for _, k := range keys {
		v := p[k]
		switch k {
		case ParamDirMode:
			m, err := ParseDirMode(k, v)
			if err != nil {
				return vp, err
			}
			vp.DirMode = m
		case ParamTransferBandwidth:
			n, err := parseRate(k, v)
			if err != nil {
				return vp, err
			}
			vp.TransferBandwidth = n
		case ParamEncryption:
			switch v {
			case EncryptionFscrypt:
				vp.Encryption = v
			case "none":
			default:
				return vp, status.Errorf(codes.InvalidArgument, "parameter %s=%q: want %q or \"none\"", k, v, EncryptionFscrypt)
			}
		default:
			return vp, status.Errorf(codes.InvalidArgument, "unknown parameter %q (known: %s, and the %s* ones the provisioner adds); remove it from the StorageClass", k, strings.Join(KnownParameters, ", "), ReservedPrefix)
		}
	}
	return vp, nil
}

// Encrypted reports whether volume parameters p (a record's, so valid) ask
// for encryption at rest.
func Encrypted(p map[string]string) bool { return p[ParamEncryption] == EncryptionFscrypt }

// CheckEncryption refuses (INVALID_ARGUMENT, before anything is made)
// encryption on a volume that cannot have it: the data directory of an
// ext4 image volume, or a directory volume (whose data root the node
// checks: ext4 with the encrypt feature), is encrypted; xfs and btrfs have
// no fscrypt here, a raw block volume has no filesystem of the driver's.
func CheckEncryption(p Params, accessType AccessType, fsType string) error {
	if p.Encryption == "" {
		return nil
	}
	switch {
	case accessType == AccessBlock:
		return status.Errorf(codes.InvalidArgument, "parameter %s=%s: a raw block volume cannot be encrypted by the driver (its filesystem is the pod's); use volumeMode Filesystem with csi.storage.k8s.io/fstype ext4", ParamEncryption, p.Encryption)
	case fsType != "" && fsType != "ext4":
		return status.Errorf(codes.InvalidArgument, "parameter %s=%s needs an ext4 image volume (csi.storage.k8s.io/fstype: ext4) or a directory volume on an ext4 data root made with the encrypt feature; the request asks for fs_type %s, which has no fscrypt in the node's kernel", ParamEncryption, p.Encryption, fsType)
	}
	return nil
}

// Mutable parameters: what a VolumeAttributesClass may set, in CreateVolume
// and ControllerModifyVolume. Only the keys given are changed.
const (
	// ParamCompression is the btrfs compression of a directory volume on
	// btrfs (one of Compressions), for data written after the change.
	ParamCompression = "compression"

	// I/O limits of an image volume per pod on its loop device, per second: a
	// quantity or integer ("10Mi", "500"), "0" for none. The node keeps them on
	// the pod's cgroup from NodePublishVolume to NodeUnpublishVolume.
	ParamReadBytesPerSecond  = "readBytesPerSecond"
	ParamWriteBytesPerSecond = "writeBytesPerSecond"
	ParamReadIOPS            = "readIOPS"
	ParamWriteIOPS           = "writeIOPS"
)

// IOLimitParameters are the mutable parameters that are I/O limits.
var IOLimitParameters = []string{ParamReadBytesPerSecond, ParamWriteBytesPerSecond, ParamReadIOPS, ParamWriteIOPS}

// IOLimits are an image volume's I/O limits per pod; 0 is no limit.
type IOLimits struct {
	// ReadBPS and WriteBPS in bytes per second.
	ReadBPS, WriteBPS uint64
	// ReadIOPS and WriteIOPS in operations per second.
	ReadIOPS, WriteIOPS uint64
}

// field is the IOLimits field of I/O limit parameter k, nil for another key.
func (l *IOLimits) field(k string) *uint64 {
	switch k {
	case ParamReadBytesPerSecond:
		return &l.ReadBPS
	case ParamWriteBytesPerSecond:
		return &l.WriteBPS
	case ParamReadIOPS:
		return &l.ReadIOPS
	case ParamWriteIOPS:
		return &l.WriteIOPS
	}
	return nil
}

// IOLimitsOf reads the I/O limits of a volume's mutable parameters (as
// stored, so already valid: a bad value counts as no limit).
func IOLimitsOf(p map[string]string) IOLimits {
	var l IOLimits
	for _, k := range IOLimitParameters {
		if v, ok := p[k]; ok {
			n, _ := parseRate(k, v)
			*l.field(k) = n
		}
	}
	return l
}

// parseRate parses the value v of I/O limit parameter k: a non-negative
// integer quantity. Errors: INVALID_ARGUMENT naming k and v.
func parseRate(k, v string) (uint64, error) {
	q, err := resource.ParseQuantity(strings.TrimSpace(v))
	n, ok := q.AsInt64()
	if err != nil || !ok || n < 0 {
		return 0, status.Errorf(codes.InvalidArgument, "parameter %s=%q: want a whole number (a quantity such as \"10Mi\" or \"500\"), 0 for no limit", k, v)
	}
	return uint64(n), nil
}

// Compressions are the values of ParamCompression.
var Compressions = []string{"none", "zstd", "lzo", "zlib"}

// KnownMutableParameters lists every mutable parameter, for docs and tests;
// ParamDirMode changes a filesystem volume's root permission in place.
var KnownMutableParameters = append([]string{ParamCompression, ParamDirMode}, IOLimitParameters...)

// Mutable is a parsed, validated set of mutable parameters; nil fields
// were not given and stay as they are.
type Mutable struct {
	// Compression is a value of Compressions.
	Compression *string
	// DirMode is chmod(2) permission bits for the volume's root.
	DirMode *uint32
	// IO are the I/O limit parameters given (IOLimitParameters), parsed.
	IO map[string]uint64
}

// ParseMutable validates mutable parameters (a request's or a record's).
// Errors: INVALID_ARGUMENT naming the unknown parameter or the bad value.
func ParseMutable(p map[string]string) (Mutable, error) {
	var m Mutable
	keys := make([]string, 0, len(p))
	for k := range p {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := p[k]
		switch k {
		case ParamCompression:
			if !slices.Contains(Compressions, v) {
				return m, status.Errorf(codes.InvalidArgument, "mutable parameter %s=%q: want one of %s", k, v, strings.Join(Compressions, ", "))
			}
			m.Compression = &v
		case ParamDirMode:
			mode, err := ParseDirMode(k, v)
			if err != nil {
				return m, err
			}
			m.DirMode = &mode
		case ParamReadBytesPerSecond, ParamWriteBytesPerSecond, ParamReadIOPS, ParamWriteIOPS:
			n, err := parseRate(k, v)
			if err != nil {
				return m, err
			}
			if m.IO == nil {
				m.IO = map[string]uint64{}
			}
			m.IO[k] = n
		default:
			return m, status.Errorf(codes.InvalidArgument, "unknown mutable parameter %q (known: %s); remove it from the VolumeAttributesClass", k, strings.Join(KnownMutableParameters, ", "))
		}
	}
	return m, nil
}

// MergeMutable is have with params set on top (only the keys given change);
// a new map, never nil.
func MergeMutable(have, params map[string]string) map[string]string {
	out := make(map[string]string, len(have)+len(params))
	maps.Copy(out, have)
	maps.Copy(out, params)
	return out
}

// ParseDirMode parses the dirMode value v of parameter k: octal permission
// bits, 0000–7777. Errors: INVALID_ARGUMENT naming k and v.
func ParseDirMode(k, v string) (uint32, error) {
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, status.Errorf(codes.InvalidArgument, "parameter %s=%q: want an octal permission such as \"0770\"", k, v)
	}
	return uint32(m), nil
}

// ToStatus is the one place storage errors become gRPC codes (CSI "Error
// Scheme"); an error with a status keeps it, one without a sentinel is INTERNAL.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(Code(err), err.Error())
}

// Code is the gRPC code of a data-plane error: the pkg/volume sentinel it
// wraps, a context error, else INTERNAL.
func Code(err error) codes.Code {
	var r *Reported
	switch {
	case errors.As(err, &r):
		return r.Code
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrExists):
		return codes.AlreadyExists
	case errors.Is(err, ErrNoSpace):
		return codes.ResourceExhausted
	case errors.Is(err, ErrOutOfRange):
		return codes.OutOfRange
	case errors.Is(err, ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, ErrPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, ErrBusy):
		return codes.Aborted
	case errors.Is(err, ErrRefused):
		return codes.PermissionDenied
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

// Reported is the failure of an operation another localdir process carried
// out, with the gRPC code it reported (a node plugin's status.errorCode).
type Reported struct {
	Code    codes.Code
	Message string
}

func (e *Reported) Error() string { return e.Message }

// GRPCStatus is e as a status, for ToStatus.
func (e *Reported) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }
