package state

import "golang.org/x/sys/unix"

func fdatasyncFd(fd int) error { return unix.Fdatasync(fd) }
