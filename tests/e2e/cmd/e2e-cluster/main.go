// Command e2e-cluster starts and stops the local end-to-end cluster of
// tests/e2e/harness (used by `make demo`, `make demo-down` and `make e2e`).
//
//	e2e-cluster up            wipe the work folder, start the cluster, wait until ready
//	                          (--suite-images: with the Kubernetes e2e suite's images)
//	e2e-cluster down [--check] stop it; --check fails if anything is left behind
//	e2e-cluster env           print KUBECONFIG=… for the running cluster
//	e2e-cluster image --out F build localdir's image as the Dockerfile describes it,
//	                          without Docker, into the OCI archive F (make image-oci)
//
// The work folder is _output/e2e of the repository (E2E_WORK overrides it);
// E2E_NODES is the number of nodes `up` starts (default 1).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	check := fs.Bool("check", false, "down: fail if anything is left behind")
	suiteImages := fs.Bool("suite-images", false, "up: also build the Kubernetes e2e suite's images (make e2e-k8s)")
	out := fs.String("out", "", "image: the OCI archive to write")
	_ = fs.Parse(os.Args[2:])
	root, err := repoRoot()
	if err != nil {
		fail(err)
	}
	nodes, err := harness.NodesFromEnv()
	if err != nil {
		fail(err)
	}
	c := harness.New(harness.Options{Root: root, Work: os.Getenv("E2E_WORK"), NodeCapacity: os.Getenv("E2E_NODE_CAPACITY"),
		Nodes: nodes, SuiteImages: *suiteImages,
		Logf: func(f string, a ...any) { fmt.Printf(f+"\n", a...) }})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch os.Args[1] {
	case "up":
		if err := c.Up(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "e2e-cluster up:", err)
			_ = c.Down(context.Background(), false)
			os.Exit(1)
		}
	case "down":
		if err := c.Down(context.Background(), *check); err != nil {
			fail(err)
		}
	case "env":
		fmt.Printf("export KUBECONFIG=%s\n", c.Kubeconfig)
	case "image":
		if *out == "" {
			usage()
		}
		abs, err := filepath.Abs(*out)
		if err != nil {
			fail(err)
		}
		if err := harness.BuildDriverImage(ctx, root, filepath.Join(root, "_output", "image-build"), abs); err != nil {
			fail(err)
		}
		fmt.Println(abs)
	default:
		usage()
	}
}

func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("run from the localdir repository")
	}
	return filepath.Dir(gomod), nil
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: e2e-cluster up [--suite-images] | down [--check] | env | image --out FILE")
	os.Exit(2)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "e2e-cluster:", err)
	os.Exit(1)
}
