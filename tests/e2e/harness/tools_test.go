package harness

import (
	"maps"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// modVersion is the version go list reports for a module, the
// replacement's when a replace directive applies.
const modVersion = `{{.Path}} {{if .Replace}}{{.Replace.Version}}{{else}}{{.Version}}{{end}}`

// TestToolsReuseTheModulesCompile keeps the tools of tests/tools/k8s (etcd,
// kube-apiserver, kubectl, helm, the rest of Kubernetes, the CSI sidecars)
// compiling what this module compiles with the same versions, and building
// with the same configuration (CGO off, -trimpath): then a cold build
// compiles client-go, grpc or prometheus once for both, not twice. A
// dependency bump on one side only fails here; `go get` the same version in
// the other module.
func TestToolsReuseTheModulesCompile(t *testing.T) {
	list := func(dir string, args ...string) map[string]string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("go %s in %s: %v", strings.Join(args, " "), dir, err)
		}
		v := map[string]string{}
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if f := strings.Fields(l); len(f) == 2 {
				v[f[0]] = f[1]
			}
		}
		return v
	}
	// What this module compiles, tests included, and what the tools'
	// module selects.
	compiled := list("../../..", "list", "-deps", "-test", "-f", "{{with .Module}}"+modVersion+"{{end}}", "./...")
	tools := list("../../../tests/tools/k8s", "list", "-m", "-f", modVersion, "all")
	shared := 0
	for _, path := range slices.Sorted(maps.Keys(compiled)) {
		v := compiled[path]
		tv, ok := tools[path]
		if !ok || v == "" { // this module itself, or one the tools do not use
			continue
		}
		shared++
		if tv != v {
			t.Errorf("%s: this module compiles %s, tests/tools/k8s selects %s", path, v, tv)
		}
	}
	if shared < 20 {
		t.Errorf("only %d modules shared with tests/tools/k8s; the listing is wrong", shared)
	}
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	builds := regexp.MustCompile(`(?m)^.*\$\(GO\) build .*$`).FindAllString(string(mk), -1)
	n := 0
	for _, b := range builds {
		if !strings.Contains(b, "k8s.io/kubernetes/cmd/") && !strings.Contains(b, "./etcd") &&
			!strings.Contains(b, "helm.sh/helm/v3/cmd/helm") && !strings.Contains(b, "$$pkg") &&
			!strings.Contains(b, "controller-tools/cmd/controller-gen") {
			continue
		}
		n++
		if !strings.Contains(b, "$(NOCGO) $(GO) build $(TRIM) ") {
			t.Errorf("Makefile builds a tool without this module's configuration ($(NOCGO) $(GO) build $(TRIM)):\n%s", b)
		}
	}
	if n != 5 {
		t.Errorf("found %d tool build commands in the Makefile, want 5 (etcd, the Kubernetes binaries, helm, controller-gen, the sidecars)", n)
	}
}
