package driver

import (
	"context"
	"time"

	"github.com/kubernetes-csi/csi-lib-utils/protosanitizer"
	"k8s.io/klog/v2"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/metrics"
)

// MetadataBackend is a Backend that answers the SnapshotMetadata service
// (changed block tracking): in all mode the node's snapshots, in controller
// mode the node plugins holding them (pkg/cluster).
type MetadataBackend interface {
	// ServesMetadata says whether the service is served (advertised).
	ServesMetadata() bool
	// SnapshotRanges yields the block ranges of image snapshot targetID
	// from start that hold data (baseID "") or may differ from snapshot
	// baseID's, ascending and apart.
	SnapshotRanges(ctx context.Context, baseID, targetID string, start int64, yield func(off, n int64) error) error
}

// ServesMetadata implements MetadataBackend: always, from the node's store.
func (b *LocalBackend) ServesMetadata() bool { return true }

// SnapshotRanges implements MetadataBackend.
func (b *LocalBackend) SnapshotRanges(_ context.Context, baseID, targetID string, start int64, yield func(off, n int64) error) error {
	return b.Snapshots.Ranges(baseID, targetID, start, yield)
}

func (d *Driver) metadataBackend() (MetadataBackend, bool) {
	if d.opts.Mode == ModeNode {
		return nil, false
	}
	m, ok := d.backend.(MetadataBackend)
	return m, ok && m.ServesMetadata()
}

// defaultMaxResults is how many ranges a response holds when the CO sets
// no max_results.
const defaultMaxResults = 1024

// snapshotMetadata serves the CSI SnapshotMetadata service for snapshots of
// image and raw block volumes. Ranges are VARIABLE_LENGTH: they come from
// the filesystem's extents, whole 4096-byte blocks, adjacent ones merged,
// so a large change is one range rather than thousands of fixed blocks.
type snapshotMetadata struct {
	csi.UnimplementedSnapshotMetadataServer
	d *Driver
	b MetadataBackend
}

// GetMetadataAllocated streams the ranges of a snapshot that hold data.
// Errors: INVALID_ARGUMENT (no snapshot_id, a negative max_results),
// NOT_FOUND, OUT_OF_RANGE (starting_offset negative or past the volume's
// size), FAILED_PRECONDITION (a directory volume's snapshot).
func (s *snapshotMetadata) GetMetadataAllocated(req *csi.GetMetadataAllocatedRequest, stream csi.SnapshotMetadata_GetMetadataAllocatedServer) error {
	if req.GetSnapshotId() == "" {
		return invalid("snapshot_id is required")
	}
	send := func(capacity int64, ranges []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataAllocatedResponse{
			BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: capacity, BlockMetadata: ranges,
		})
	}
	return s.serve(stream.Context(), "", req.GetSnapshotId(), req.GetStartingOffset(), req.GetMaxResults(), send)
}

// GetMetadataDelta streams the ranges of target_snapshot_id that may differ
// from base_snapshot_id (it never leaves out one that differs). Errors as
// GetMetadataAllocated's, and FAILED_PRECONDITION for snapshots of two
// volumes: no delta can be given, the CO makes a full backup.
func (s *snapshotMetadata) GetMetadataDelta(req *csi.GetMetadataDeltaRequest, stream csi.SnapshotMetadata_GetMetadataDeltaServer) error {
	if req.GetBaseSnapshotId() == "" {
		return invalid("base_snapshot_id is required")
	}
	if req.GetTargetSnapshotId() == "" {
		return invalid("target_snapshot_id is required")
	}
	send := func(capacity int64, ranges []*csi.BlockMetadata) error {
		return stream.Send(&csi.GetMetadataDeltaResponse{
			BlockMetadataType: csi.BlockMetadataType_VARIABLE_LENGTH, VolumeCapacityBytes: capacity, BlockMetadata: ranges,
		})
	}
	return s.serve(stream.Context(), req.GetBaseSnapshotId(), req.GetTargetSnapshotId(), req.GetStartingOffset(), req.GetMaxResults(), send)
}

// serve checks the common fields, then streams the backend's ranges in
// responses of at most maxResults; an empty answer is one response without
// ranges (it still carries the capacity).
func (s *snapshotMetadata) serve(ctx context.Context, baseID, targetID string, start int64, maxResults int32,
	send func(capacity int64, ranges []*csi.BlockMetadata) error) error {
	if maxResults < 0 {
		return invalid("max_results must not be negative (got %d)", maxResults)
	}
	if start < 0 {
		return status.Errorf(codes.OutOfRange, "starting_offset must not be negative (got %d)", start)
	}
	limit := int(maxResults)
	if limit == 0 {
		limit = defaultMaxResults
	}
	target, err := s.d.backend.Snapshot(ctx, targetID)
	if err != nil {
		return contract.ToStatus(err)
	}
	capacity := target.SizeBytes
	batch := make([]*csi.BlockMetadata, 0, min(limit, defaultMaxResults))
	sent := false
	err = s.b.SnapshotRanges(ctx, baseID, targetID, start, func(off, n int64) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		batch = append(batch, &csi.BlockMetadata{ByteOffset: off, SizeBytes: n})
		if len(batch) < limit {
			return nil
		}
		sent = true
		err := send(capacity, batch)
		batch = batch[:0:0]
		return err
	})
	if err != nil {
		return contract.ToStatus(err)
	}
	if len(batch) > 0 || !sent {
		return contract.ToStatus(send(capacity, batch))
	}
	return nil
}

// logStreamRPC is logRPC for the streaming calls: the request (secrets
// stripped), the code, how many responses were sent and the duration.
func logStreamRPC(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	start := time.Now()
	ls := &loggedStream{ServerStream: ss}
	err := handler(srv, ls)
	metrics.ObserveRPC(methodName(info.FullMethod), status.Code(err).String(), time.Since(start))
	if err != nil {
		st, _ := status.FromError(err)
		klog.ErrorS(nil, "GRPC failed", "method", info.FullMethod, "code", st.Code().String(), "message", st.Message(),
			"request", protosanitizer.StripSecrets(ls.req), "responses", ls.sent, "duration", time.Since(start))
	} else if klog.V(4).Enabled() {
		klog.V(4).InfoS("GRPC done", "method", info.FullMethod, "request", protosanitizer.StripSecrets(ls.req), "responses", ls.sent, "duration", time.Since(start))
	}
	return err
}

// loggedStream keeps a stream's request and counts its responses.
type loggedStream struct {
	grpc.ServerStream
	req  any
	sent int
}

func (l *loggedStream) RecvMsg(m any) error {
	err := l.ServerStream.RecvMsg(m)
	if err == nil && l.req == nil {
		l.req = m
	}
	return err
}

func (l *loggedStream) SendMsg(m any) error {
	err := l.ServerStream.SendMsg(m)
	if err == nil {
		l.sent++
	}
	return err
}
