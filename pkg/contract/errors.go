package contract

import "errors"

// Sentinel errors of the data plane. Every error pkg/volume and pkg/cluster
// return for a caller mistake or a state conflict wraps exactly one of them;
// ToStatus maps them to gRPC codes. Anything else is an internal failure.
var (
	// ErrNotFound: the volume, snapshot or path does not exist (NOT_FOUND).
	ErrNotFound = errors.New("not found")
	// ErrExists: a different object already occupies the name or path
	// (ALREADY_EXISTS).
	ErrExists = errors.New("already exists")
	// ErrNoSpace: not enough capacity left (RESOURCE_EXHAUSTED).
	ErrNoSpace = errors.New("not enough capacity")
	// ErrOutOfRange: a size no retry can satisfy, e.g. above the maximum
	// volume size (OUT_OF_RANGE).
	ErrOutOfRange = errors.New("out of range")
	// ErrInvalid: malformed input, e.g. an unknown mount flag or a target
	// path that is a symlink (INVALID_ARGUMENT).
	ErrInvalid = errors.New("invalid argument")
	// ErrPrecondition: the object is in the wrong state for the call, e.g. a
	// mounted volume deleted (FAILED_PRECONDITION).
	ErrPrecondition = errors.New("failed precondition")
	// ErrBusy: a conflicting operation on the same volume or snapshot is in
	// progress (ABORTED: the CO retries).
	ErrBusy = errors.New("operation pending")
	// ErrRefused: the caller is not allowed this, e.g. a node-to-node
	// transfer asked by a peer the API does not name (PERMISSION_DENIED).
	ErrRefused = errors.New("refused")
)
