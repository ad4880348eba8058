package driver

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}
