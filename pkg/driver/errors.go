package driver

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

func toStatus(err error) error { return contract.ToStatus(err) }

func codeOf(err error) codes.Code { return contract.Code(err) }

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
