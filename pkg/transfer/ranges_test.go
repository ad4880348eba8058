package transfer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

const (
	snapA = "snap-0123456789abcdef0123456789abcdef"
	snapB = "snap-fedcba9876543210fedcba9876543210"
)

// rangesChannel serves block ranges to the controller identity ctl: 3000
// ranges of snapA (more than one buffer), or NOT_FOUND, or a failure after
// 100 ranges when the base is snapB.
func rangesChannel(t *testing.T) (addr string, server, ctl *Identity, served *int) {
	t.Helper()
	var err error
	if server, err = NewIdentity("a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if ctl, err = NewIdentity("controller", time.Hour); err != nil {
		t.Fatal(err)
	}
	old, err := NewIdentity("controller", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served = new(int)
	s := &Server{
		Identity: server,
		Ranges: func(base, target string, start int64, yield func(off, n int64) error) error {
			*served++
			if target != snapA {
				return fmt.Errorf("%w: snapshot %s", contract.ErrNotFound, target)
			}
			for i := int64(0); i < 3000; i++ {
				if base == snapB && i == 100 {
					return fmt.Errorf("%w: the base went away", contract.ErrPrecondition)
				}
				if err := yield(start+i*8192, 4096); err != nil {
					return err
				}
			}
			return nil
		},
		ControllerCerts: func(context.Context) ([]string, error) {
			return []string{old.CertificatePEM(), ctl.CertificatePEM()}, nil
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return lis.Addr().String(), server, ctl, served
}

// The controller gets a snapshot's ranges whole and in order; the node's
// error keeps its gRPC code, after the ranges before it; a client with any
// other key (a node plugin's, one under the controller's name) gets
// nothing and the node computes nothing.
func TestRangesOnlyToTheController(t *testing.T) {
	addr, server, ctl, served := rangesChannel(t)
	ctx := context.Background()
	var got [][2]int64
	collect := func(off, n int64) error { got = append(got, [2]int64{off, n}); return nil }
	if err := (&Client{Identity: ctl}).Ranges(ctx, "a", addr, server.CertificatePEM(), snapA, "", 4096, collect); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3000 || got[0] != [2]int64{4096, 4096} || got[2999] != [2]int64{4096 + 2999*8192, 4096} {
		t.Fatalf("%d ranges, first %v, last %v", len(got), got[0], got[len(got)-1])
	}
	got = nil
	err := (&Client{Identity: ctl}).Ranges(ctx, "a", addr, server.CertificatePEM(), snapA, snapB, 0, collect)
	if status.Code(contract.ToStatus(err)) != codes.FailedPrecondition || len(got) != 100 {
		t.Fatalf("failure after 100 ranges: %v with %d ranges", err, len(got))
	}
	err = (&Client{Identity: ctl}).Ranges(ctx, "a", addr, server.CertificatePEM(), snapB, "", 0, collect)
	if status.Code(contract.ToStatus(err)) != codes.NotFound {
		t.Fatalf("unknown snapshot: %v, want NOT_FOUND", err)
	}
	// A caller's error stops the stream with it.
	stop := errors.New("stop")
	if err := (&Client{Identity: ctl}).Ranges(ctx, "a", addr, server.CertificatePEM(), snapA, "", 0, func(int64, int64) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("yield error: %v", err)
	}

	before := *served
	node, _ := NewIdentity("b", time.Hour)
	impostor, _ := NewIdentity("controller", time.Hour)
	for _, id := range []*Identity{node, impostor} {
		err := (&Client{Identity: id}).Ranges(ctx, "a", addr, server.CertificatePEM(), snapA, "", 0, collect)
		if !errors.Is(err, contract.ErrRefused) {
			t.Errorf("client %s with an unpublished key: %v, want refused", id.node, err)
		}
	}
	// A server other than the published one is never asked.
	if err := (&Client{Identity: ctl}).Ranges(ctx, "a", addr, node.CertificatePEM(), snapA, "", 0, collect); err == nil {
		t.Error("a server with another certificate was accepted")
	}
	if *served != before {
		t.Errorf("the node computed ranges %d times for refused clients", *served-before)
	}
}
