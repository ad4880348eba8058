package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Uninstall runs `kubectl delete -k deploy/kubernetes` as a user would
// (CRDs, RBAC, namespace, CSIDriver, classes, the Deployment and the
// DaemonSet — everything of the kustomization) and returns when kubectl
// has waited for every object to be gone, the localdir namespace with its
// pods included. The snapshot controller (a cluster add-on) is stopped
// too, so Reinstall can start it with the rest. Pods using localdir
// volumes keep running.
func (c *Cluster) Uninstall(ctx context.Context) error {
	out, err := c.Kubectl(ctx, "", "delete", "-k", filepath.Join(c.Root, "deploy", "kubernetes"),
		"--ignore-not-found", "--wait=true", "--timeout=180s")
	if err != nil {
		return fmt.Errorf("kubectl delete -k deploy/kubernetes: %w", err)
	}
	c.Logf("· kubectl delete -k deploy/kubernetes:\n%s", indent(out))
	return c.stop("snapshot-controller", 5*time.Second)
}

// Reinstall installs localdir again after Uninstall, as Up does (the
// snapshot CRDs and controller, localdir's CRDs, then the rest), and
// waits until the cluster is ready.
func (c *Cluster) Reinstall(ctx context.Context) error {
	if err := c.runSteps(ctx, []step{
		{"snapshot CRDs, snapshot-controller", c.startSnapshotController},
		{"localdir from deploy/kubernetes (kubectl apply -k)", c.install},
		{"localdir pods Running, driver registered, cluster ready", c.waitReady},
	}); err != nil {
		return fmt.Errorf("reinstall: %w (logs in %s)", err, c.path("logs"))
	}
	return nil
}

// HelmRelease is the release name HelmInstall gives localdir's chart.
const HelmRelease = "localdir"

// HelmInstall installs localdir with `helm install` of deploy/helm/localdir
// instead of kustomize (after Uninstall): the snapshot add-on first, then
// the chart into the localdir namespace with the tests' timings as values
// (what installOverlay patches into the kustomize install), and waits
// until the cluster is ready. HelmUninstall removes it again.
func (c *Cluster) HelmInstall(ctx context.Context) error {
	install := func(ctx context.Context) error {
		args := []string{"install", HelmRelease, filepath.Join(c.Root, "deploy", "helm", "localdir"),
			"--namespace", "localdir", "--create-namespace", "--wait", "--timeout=3m",
			"--set", "heartbeatInterval=" + HeartbeatInterval, "--set", "nodeStaleAfter=" + NodeStaleAfter,
			"--set", "controller.capacityPollInterval=3s"}
		if c.NodeCapacity != "" {
			args = append(args, "--set", "capacity="+c.NodeCapacity)
		}
		out, err := c.Helm(ctx, args...)
		if err != nil {
			return err
		}
		c.Logf("· helm install:\n%s", indent(out))
		return nil
	}
	if err := c.runSteps(ctx, []step{
		{"snapshot CRDs, snapshot-controller", c.startSnapshotController},
		{"localdir from deploy/helm/localdir (helm install)", install},
		{"localdir pods Running, driver registered, cluster ready", c.waitReady},
	}); err != nil {
		return fmt.Errorf("helm install: %w (logs in %s)", err, c.path("logs"))
	}
	return nil
}

// HelmUninstall runs `helm uninstall --wait` of HelmInstall's release
// (the chart's CRDs stay, as Helm keeps them) and stops the snapshot
// controller; the localdir namespace goes too.
func (c *Cluster) HelmUninstall(ctx context.Context) error {
	out, err := c.Helm(ctx, "uninstall", HelmRelease, "--namespace", "localdir", "--wait", "--timeout=3m", "--ignore-not-found")
	if err != nil {
		return err
	}
	c.Logf("· helm uninstall:\n%s", indent(out))
	if _, err := c.Kubectl(ctx, "", "delete", "namespace", "localdir", "--wait=true", "--timeout=120s"); err != nil {
		return err
	}
	return c.stop("snapshot-controller", 5*time.Second)
}

// Helm runs helm with the admin kubeconfig.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.tool("helm"), append([]string{"--kubeconfig=" + c.Kubeconfig}, args...)...)
	// Helm's cache and config in the work folder, not in $HOME.
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+c.path("helm", "cache"), "HELM_CONFIG_HOME="+c.path("helm", "config"),
		"HELM_DATA_HOME="+c.path("helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
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
