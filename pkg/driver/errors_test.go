package driver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func TestToStatus(t *testing.T) {
	if contract.ToStatus(nil) != nil {
		t.Fatal("contract.ToStatus(nil) != nil")
	}
	tests := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"not found", contract.ErrNotFound, codes.NotFound},
		{"exists", contract.ErrExists, codes.AlreadyExists},
		{"no space", contract.ErrNoSpace, codes.ResourceExhausted},
		{"out of range", contract.ErrOutOfRange, codes.OutOfRange},
		{"invalid", contract.ErrInvalid, codes.InvalidArgument},
		{"precondition", contract.ErrPrecondition, codes.FailedPrecondition},
		{"deadline", context.DeadlineExceeded, codes.DeadlineExceeded},
		{"canceled", context.Canceled, codes.Canceled},
		{"plain error", errors.New("disk on fire"), codes.Internal},
		{"os error", &os.PathError{Op: "open", Path: "/x", Err: os.ErrPermission}, codes.Internal},
		{"joined sentinel", errors.Join(errors.New("x"), contract.ErrPrecondition), codes.FailedPrecondition},
	}
	for _, tc := range tests {
		for _, wrapped := range []struct {
			name string
			err  error
		}{
			{"bare", tc.err},
			{"wrapped", fmt.Errorf("volume vol-1: %w", tc.err)},
			{"wrapped twice", fmt.Errorf("stage: %w", fmt.Errorf("%w: volume %q", tc.err, "vol-1"))},
		} {
			t.Run(tc.name+"/"+wrapped.name, func(t *testing.T) {
				if got := contract.Code(wrapped.err); got != tc.code {
					t.Fatalf("contract.Code(%v) = %s, want %s", wrapped.err, got, tc.code)
				}
				got := contract.ToStatus(wrapped.err)
				st, ok := status.FromError(got)
				if !ok {
					t.Fatalf("contract.ToStatus(%v) = %v carries no status", wrapped.err, got)
				}
				if st.Code() != tc.code || st.Message() != wrapped.err.Error() {
					t.Fatalf("contract.ToStatus(%v) = %s %q, want %s %q", wrapped.err, st.Code(), st.Message(), tc.code, wrapped.err.Error())
				}
			})
		}
	}

	// An error that already is a status keeps it, unchanged.
	for _, c := range []codes.Code{codes.Aborted, codes.NotFound, codes.Unavailable, codes.InvalidArgument} {
		in := status.Error(c, "already a status")
		if got := contract.ToStatus(in); got != in {
			t.Errorf("contract.ToStatus(status %s) = %v, want the same error", c, got)
		}
	}
	// A status wrapped in context keeps its code, not Internal.
	in := fmt.Errorf("while staging: %w", status.Error(codes.Unavailable, "try later"))
	if got := status.Code(contract.ToStatus(in)); got != codes.Unavailable {
		t.Errorf("contract.ToStatus(wrapped status) code = %s, want Unavailable", got)
	}
	// A status error wins over a sentinel in the same chain.
	in = fmt.Errorf("%w: %w", status.Error(codes.Aborted, "busy"), contract.ErrNotFound)
	if got := status.Code(contract.ToStatus(in)); got != codes.Aborted {
		t.Errorf("contract.ToStatus(status+sentinel) code = %s, want Aborted", got)
	}
}
