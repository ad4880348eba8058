//go:build !linux

package state

import "syscall"

func fdatasyncFd(fd int) error { return syscall.Fsync(fd) }
