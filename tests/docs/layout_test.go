package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

const module = "github.com/localdir-csi/localdir/"

// localImports returns the localdir packages the non-test Go files of the
// package in dir import, module prefix removed.
func localImports(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, im := range af.Imports {
			if p, ok := strings.CutPrefix(strings.Trim(im.Path.Value, `"`), module); ok {
				seen[p] = true
			}
		}
	}
	var out []string
	for p := range seen {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// The import table of docs/design.md ("Imports point down only") is the
// rule: every localdir package a package imports is listed for it, and
// every package it names exists. A package under pkg/cluster/ may also
// import its own sub-packages (the API types).
func TestDesignImportTable(t *testing.T) {
	root := clustertest.Root(t)
	raw, err := os.ReadFile(filepath.Join(root, "docs", "design.md"))
	if err != nil {
		t.Fatal(err)
	}
	allowed := map[string][]string{}
	for _, l := range strings.Split(string(raw), "\n") {
		cells := strings.Split(l, "|")
		if len(cells) != 4 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "pkg/") && !strings.HasPrefix(strings.TrimSpace(cells[1]), "cmd/") {
			continue
		}
		var may []string
		for _, m := range strings.Split(cells[2], ",") {
			m = strings.TrimSpace(m)
			if f := strings.Fields(m); len(f) > 0 && f[0] != "none" {
				may = append(may, f[0])
			}
		}
		for _, p := range strings.Split(cells[1], ",") {
			allowed[strings.TrimSpace(p)] = may
		}
	}
	if len(allowed) < 8 {
		t.Fatalf("docs/design.md: import table not found (%d rows)", len(allowed))
	}
	for pkg, may := range allowed {
		if _, err := os.Stat(filepath.Join(root, pkg)); err != nil {
			t.Errorf("docs/design.md names %s, which does not exist", pkg)
			continue
		}
		for _, imp := range localImports(t, filepath.Join(root, pkg)) {
			if !slices.Contains(may, imp) && !(strings.HasPrefix(imp, pkg+"/") && pkg == "pkg/cluster") {
				t.Errorf("%s imports %s, which docs/design.md does not allow it (%v)", pkg, imp, may)
			}
		}
	}
}
