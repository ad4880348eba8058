package driver

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// toStatus turns a storage error into its gRPC status (contract.ToStatus,
// the one mapping, shared with pkg/cluster).
func toStatus(err error) error { return contract.ToStatus(err) }

// codeOf is the gRPC code of a storage error (contract.Code).
func codeOf(err error) codes.Code { return contract.Code(err) }

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
