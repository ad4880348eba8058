package driver

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/volume"
)

// ToStatus is toStatus for other packages (the cluster node agent records
// the code of a failed create for the controller to return).
func ToStatus(err error) error { return toStatus(err) }

// toStatus is the one boundary where storage errors become gRPC codes (CSI
// spec, "Error Scheme"). An error that already carries a status keeps it; an
// error wrapping none of the volume sentinels is INTERNAL.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, volume.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, volume.ErrExists):
		return codes.AlreadyExists
	case errors.Is(err, volume.ErrNoSpace):
		return codes.ResourceExhausted
	case errors.Is(err, volume.ErrOutOfRange):
		return codes.OutOfRange
	case errors.Is(err, volume.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, volume.ErrPrecondition):
		return codes.FailedPrecondition
	case errors.Is(err, volume.ErrBusy):
		return codes.Aborted
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	}
	return codes.Internal
}

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
