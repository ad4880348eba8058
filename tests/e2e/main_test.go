//go:build e2e

// Package e2e runs localdir's end-to-end scenarios on a whole local
// Kubernetes cluster (tests/e2e/harness): StorageClasses, PVCs, pods,
// snapshots, clones, resize, raw block, inline volumes, fsGroup,
// capacity, delete and retain, a node plugin crash, and 100 PVCs at once.
// Each scenario asserts through the Kubernetes API and inside the pods
// (kubectl exec). `make e2e` runs them (as root, after `make e2e-tools`)
// with the build tag e2e, which keeps them out of `go test ./...`.
package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

var (
	cl  *harness.Cluster
	kc  kubernetes.Interface
	dyn dynamic.Interface
)

// NodeCapacity is the node plugin's --capacity in the e2e cluster: less
// than the 8Gi btrfs image, so capacity tests have a known ceiling.
const NodeCapacity = "6Gi"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "go env GOMOD:", err)
		return 1
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	nodes, err := harness.NodesFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cl = harness.New(harness.Options{Root: root, Work: os.Getenv("E2E_WORK"), NodeCapacity: NodeCapacity, Nodes: nodes,
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
	// Tear down on SIGINT/SIGTERM too; `make e2e` also runs
	// `e2e-cluster down --check` after this process, whatever happened.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sigs
		fmt.Println("tests/e2e: interrupted, tearing down")
		_ = cl.Down(context.Background(), true)
		os.Exit(1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := cl.Up(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "cluster up:", err)
		_ = cl.Down(context.Background(), false)
		return 1
	}
	code := 1
	if err := connect(); err != nil {
		fmt.Fprintln(os.Stderr, err)
	} else {
		code = m.Run()
	}
	if err := cl.Down(context.Background(), true); err != nil {
		fmt.Fprintln(os.Stderr, "cluster down:", err)
		code = 1
	}
	return code
}

func connect() error {
	cfg, err := clientcmd.BuildConfigFromFlags("", cl.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 300
	if kc, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	dyn, err = dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return createClasses()
}

// needCluster skips a test when the cluster is not up (go test ./...).
func needCluster(t *testing.T) {
	t.Helper()
	if kc == nil {
		t.Skip("needs the e2e cluster: make e2e")
	}
}
