package driver

import (
	"context"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// rangesBackend answers SnapshotRanges with fixed ranges (the Backend's
// other methods are not called).
type rangesBackend struct {
	Backend
	size   int64
	ranges [][2]int64
	failAt int // yield error after this many ranges (-1: none)
}

func (b *rangesBackend) Snapshot(_ context.Context, id string) (*contract.Snapshot, error) {
	return &contract.Snapshot{ID: id, SizeBytes: b.size, AccessType: contract.AccessBlock}, nil
}

func (b *rangesBackend) ServesMetadata() bool { return true }

var errBackend = errors.New("backend failed")

func (b *rangesBackend) SnapshotRanges(_ context.Context, _, _ string, _ int64, yield func(off, n int64) error) error {
	for i, r := range b.ranges {
		if i == b.failAt {
			return errBackend
		}
		if err := yield(r[0], r[1]); err != nil {
			return err
		}
	}
	return nil
}

type allocatedStream struct {
	grpc.ServerStream
	ctx  context.Context
	msgs []*csi.GetMetadataAllocatedResponse
}

func (s *allocatedStream) Context() context.Context { return s.ctx }
func (s *allocatedStream) Send(m *csi.GetMetadataAllocatedResponse) error {
	s.msgs = append(s.msgs, m)
	return nil
}

// FuzzSnapshotMetadataPaging: whatever the ranges and max_results, the
// responses carry every range once, in order, at most max_results each
// (the default when 0), all with the type and the capacity; no ranges is
// one empty response; a backend error ends the stream with its code after
// the full responses before it.
func FuzzSnapshotMetadataPaging(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8}, int32(0), int16(-1))
	f.Add([]byte{}, int32(1), int16(-1))
	f.Add(make([]byte, 4*2100), int32(0), int16(2050))
	f.Add([]byte{9, 9, 9, 9}, int32(3), int16(0))
	f.Fuzz(func(t *testing.T, data []byte, maxResults int32, failAt int16) {
		if maxResults < 0 {
			return // INVALID_ARGUMENT, checked in tests/cases
		}
		b := &rangesBackend{size: 1 << 40, failAt: int(failAt)}
		off := int64(0)
		for len(data) >= 4 {
			gap, n := int64(binary.LittleEndian.Uint16(data)), int64(binary.LittleEndian.Uint16(data[2:]))+1
			data = data[4:]
			off += gap * contract.BlockBytes
			b.ranges = append(b.ranges, [2]int64{off, n * contract.BlockBytes})
			off += (n + 1) * contract.BlockBytes
		}
		s := &snapshotMetadata{d: &Driver{opts: Options{Mode: ModeAll}, backend: b}, b: b}
		st := &allocatedStream{ctx: context.Background()}
		err := s.GetMetadataAllocated(&csi.GetMetadataAllocatedRequest{SnapshotId: "snap-x", MaxResults: maxResults}, st)
		limit := int(maxResults)
		if limit == 0 {
			limit = defaultMaxResults
		}
		want := b.ranges
		failed := b.failAt >= 0 && b.failAt < len(b.ranges)
		if failed {
			if status.Code(err) != codes.Internal {
				t.Fatalf("backend failure: %v, want INTERNAL", err)
			}
			want = want[:b.failAt/limit*limit] // only full responses went out
		} else if err != nil {
			t.Fatal(err)
		}
		var got [][2]int64
		for i, m := range st.msgs {
			if m.GetBlockMetadataType() != csi.BlockMetadataType_VARIABLE_LENGTH || m.GetVolumeCapacityBytes() != b.size {
				t.Fatalf("response %d: type %v, capacity %d", i, m.GetBlockMetadataType(), m.GetVolumeCapacityBytes())
			}
			if len(m.GetBlockMetadata()) > limit || (len(m.GetBlockMetadata()) == 0 && (len(st.msgs) > 1 || len(b.ranges) > 0)) {
				t.Fatalf("response %d of %d: %d ranges (limit %d)", i, len(st.msgs), len(m.GetBlockMetadata()), limit)
			}
			for _, r := range m.GetBlockMetadata() {
				got = append(got, [2]int64{r.GetByteOffset(), r.GetSizeBytes()})
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%d ranges sent, want %d", len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("range %d: %v, want %v", i, got[i], want[i])
			}
		}
		if !failed && len(b.ranges) == 0 && len(st.msgs) != 1 {
			t.Fatalf("no ranges: %d responses, want 1", len(st.msgs))
		}
	})
}
