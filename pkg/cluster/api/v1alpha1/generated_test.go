package v1alpha1

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// controllerGen is the generator `make generate` uses, at the same version.
const controllerGen = "sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0"

func repoRoot(t *testing.T) string {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(strings.TrimSpace(string(out)))
}

func gen(t *testing.T, root string, args ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"run", controllerGen}, args...)...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("controller-gen %v: %v\n%s", args, err, out)
	}
}

// TestGeneratedFilesAreCurrent regenerates the CRDs and the deepcopy code
// into scratch directories and fails when they differ from what is
// committed: run `make generate` after changing types.go.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	root := repoRoot(t)
	crdDir := t.TempDir()
	gen(t, root, "crd:crdVersions=v1", "paths=./pkg/cluster/api/...", "output:crd:artifacts:config="+crdDir)
	committed := filepath.Join(root, "deploy", "kubernetes", "crds")
	fresh, _ := os.ReadDir(crdDir)
	have, _ := os.ReadDir(committed)
	if len(fresh) == 0 || len(fresh) != len(have) {
		t.Fatalf("generated %d CRD files, %s has %d: run make generate", len(fresh), committed, len(have))
	}
	for _, f := range fresh {
		want, _ := os.ReadFile(filepath.Join(crdDir, f.Name()))
		got, err := os.ReadFile(filepath.Join(committed, f.Name()))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make generate", filepath.Join(committed, f.Name()))
		}
	}

	// Deepcopy: generate for a copy of the package inside the module (so
	// imports resolve), in the ignored _output folder.
	scratch := filepath.Join(root, "_output", "gencheck", "v1alpha1")
	if err := os.MkdirAll(scratch, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(filepath.Dir(scratch)) })
	src, err := os.ReadFile(filepath.Join(root, "pkg", "cluster", "api", "v1alpha1", "types.go"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(scratch, "types.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	gen(t, root, "object", "paths=./_output/gencheck/v1alpha1")
	want, err := os.ReadFile(filepath.Join(scratch, "zz_generated.deepcopy.go"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(filepath.Join(root, "pkg", "cluster", "api", "v1alpha1", "zz_generated.deepcopy.go"))
	if !bytes.Equal(got, want) {
		t.Errorf("zz_generated.deepcopy.go is stale: run make generate")
	}
}
