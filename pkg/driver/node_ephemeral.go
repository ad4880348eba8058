package driver

import (
	"context"
	"regexp"
	"strings"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Volume attributes of a CSI ephemeral inline volume (the pod's
// volumeAttributes).
const (
	// AttrSize is the ephemeral volume's size, a Kubernetes quantity.
	AttrSize = "size"
	// DefaultEphemeralBytes is the size when AttrSize is not given: 100Mi.
	DefaultEphemeralBytes = 100 << 20
)

// KnownEphemeralAttributes lists the volumeAttributes an inline volume may
// set besides kubelet's csi.storage.k8s.io/ ones, for docs and tests.
var KnownEphemeralAttributes = []string{AttrSize, ParamDirMode}

// ephemeralIDPattern: kubelet names inline volumes "csi-" + a hex hash. The
// id is never used in a path, but anything path-like is refused outright.
var ephemeralIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// publishEphemeral creates (once) and publishes a CSI ephemeral inline volume
// (publish.Publisher.PublishEphemeral); NodeUnpublishVolume deletes it.
func (s *node) publishEphemeral(ctx context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	coID := req.GetVolumeId()
	size, attrs, params, err := parseEphemeral(coID, req.GetVolumeCapability().GetBlock() != nil, req.GetVolumeContext(), s.d.opts.MaxVolumeBytes)
	if err != nil {
		return nil, err
	}
	err = s.d.pub.PublishEphemeral(contract.CreateSpec{
		Name:        contract.EphemeralName(coID),
		SizeBytes:   size,
		AccessType:  contract.AccessMount,
		Parameters:  attrs,
		DirMode:     params.DirMode,
		Ephemeral:   true,
		EphemeralID: coID,
	}, contract.PublishOptions{
		TargetPath: req.GetTargetPath(),
		AccessType: contract.AccessMount,
		ReadOnly:   readOnly(req),
		MountFlags: req.GetVolumeCapability().GetMount().GetMountFlags(),
	})
	if err != nil {
		return nil, contract.ToStatus(err)
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// parseEphemeral validates an inline volume's CO-chosen id, access type and
// volume attributes (kubelet's csi.storage.k8s.io/ ones ignored) and returns
// its size, the attributes to record and their parameters. Errors:
// INVALID_ARGUMENT, OUT_OF_RANGE (above maxBytes).
func parseEphemeral(coID string, block bool, vc map[string]string, maxBytes int64) (int64, map[string]string, volumeParams, error) {
	if !ephemeralIDPattern.MatchString(coID) || strings.Contains(coID, "..") {
		return 0, nil, volumeParams{}, invalid("volume_id %q is not a valid ephemeral volume id ([A-Za-z0-9._-], at most 128 characters)", coID)
	}
	if contract.ValidVolumeID(coID) {
		// NodeUnpublishVolume, stats and health would take it for a
		// persistent volume and the inline volume would never be deleted.
		return 0, nil, volumeParams{}, invalid("volume_id %q has the form of a volume id this driver issues; an ephemeral volume needs another id", coID)
	}
	if block {
		return 0, nil, volumeParams{}, invalid("ephemeral inline volumes are mount volumes; block is not supported")
	}
	size := int64(DefaultEphemeralBytes)
	attrs := map[string]string{}
	for k, v := range vc {
		if strings.HasPrefix(k, reservedPrefix) {
			continue
		}
		switch k {
		case AttrSize:
			n, err := ParseBytes(v)
			if err != nil || n <= 0 {
				return 0, nil, volumeParams{}, invalid("volume attribute size=%q: want a positive quantity such as 100Mi", v)
			}
			size = roundUp(n)
		case ParamDirMode:
			attrs[k] = v
		default:
			return 0, nil, volumeParams{}, invalid("unknown volume attribute %q for an ephemeral volume (known: %s)", k, strings.Join(KnownEphemeralAttributes, ", "))
		}
	}
	params, err := parseParams(attrs)
	if err != nil {
		return 0, nil, volumeParams{}, err
	}
	if maxBytes > 0 && size > maxBytes {
		return 0, nil, volumeParams{}, status.Errorf(codes.OutOfRange, "ephemeral volume size %d exceeds the maximum volume size of %d bytes", size, maxBytes)
	}
	return size, attrs, params, nil
}
