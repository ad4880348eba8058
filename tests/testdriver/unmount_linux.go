package testdriver

import "golang.org/x/sys/unix"

func unmount(p string) error { return unix.Unmount(p, unix.MNT_DETACH) }
