package harness

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// controllerProcs run in the localdir-controller Deployment's pod and
// nodeProcs (on every node) in the localdir-node DaemonSet's pods; the
// harness runs them as processes because there are no images here.
var (
	controllerProcs = []string{"localdir-controller", "csi-provisioner", "csi-attacher", "csi-resizer", "csi-snapshotter"}
	nodeProcs       = []string{"localdir-node", "registrar"}
)

// Uninstall runs `kubectl delete -k deploy/kubernetes` as a user would
// (CRDs, RBAC, namespace, CSIDriver, classes — everything of the
// kustomization) and, at the same time, stops the processes that stand in
// for the Deployment's and the DaemonSet's pods with SIGTERM and a 5 s
// grace, as the kubelet does when their workloads are deleted. It returns
// when kubectl has waited for every object to be gone. The snapshot
// controller (a cluster add-on) is stopped too, so Reinstall can start it
// with the rest. Pods using localdir volumes keep running.
func (c *Cluster) Uninstall(ctx context.Context) error {
	var wg sync.WaitGroup
	var stopErr error
	wg.Add(1)
	go func() {
		defer wg.Done()
		var errs []error
		var procs []string
		for _, n := range c.Nodes {
			for _, p := range nodeProcs {
				procs = append(procs, n.proc(p))
			}
		}
		for _, p := range append(append(procs, controllerProcs...), "snapshot-controller") {
			errs = append(errs, c.stop(p, 5*time.Second))
		}
		stopErr = errors.Join(errs...)
	}()
	out, err := c.Kubectl(ctx, "", "delete", "-k", filepath.Join(c.Root, "deploy", "kubernetes"),
		"--ignore-not-found", "--wait=true", "--timeout=180s")
	wg.Wait()
	if err != nil {
		return fmt.Errorf("kubectl delete -k deploy/kubernetes: %w", err)
	}
	c.Logf("· kubectl delete -k deploy/kubernetes:\n%s", indent(out))
	return stopErr
}

// Reinstall installs localdir again after Uninstall, as Up does (CRDs,
// then the rest, fresh ServiceAccount tokens), starts the node plugin,
// the controller and their sidecars, and waits until the cluster is ready.
func (c *Cluster) Reinstall(ctx context.Context) error {
	if err := c.runSteps(ctx, []step{
		{"localdir from deploy/kubernetes", c.install},
		{"localdir node plugins and registrars", c.startNodePlugins},
		{"localdir controller, sidecars, snapshot-controller", c.startDriverController},
		{"cluster ready", c.waitReady},
	}); err != nil {
		return fmt.Errorf("reinstall: %w (logs in %s)", err, c.path("logs"))
	}
	return nil
}

// step is one timed stage of bringing the cluster (or localdir) up.
type step struct {
	what string
	f    func(context.Context) error
}

// runSteps runs steps in order, logging each one's duration; the first
// error, prefixed with its step, ends the run.
func (c *Cluster) runSteps(ctx context.Context, steps []step) error {
	for _, s := range steps {
		t := time.Now()
		if err := s.f(ctx); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		c.Logf("· %-58s %5.1fs", s.what, time.Since(t).Seconds())
	}
	return nil
}

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimSpace(s), "\n", "\n    ")
}
