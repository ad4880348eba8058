// Command pause is the pod sandbox ("pause") image's only binary for the
// end-to-end cluster, which has no registry to pull registry.k8s.io/pause
// from: it sleeps until SIGINT or SIGTERM and reaps the zombies it inherits
// as PID 1 of the pod's PID namespace. Built static (CGO off) and packed
// into an OCI image by tests/e2e.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
