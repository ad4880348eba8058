// Package docs checks the documentation: every relative link in README.md
// and docs/ resolves (file and, for #anchors, heading), and every parameter
// the code accepts is in the parameter tables.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

var link = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// anchor is GitHub's heading → fragment rule: lower case, spaces to dashes,
// punctuation dropped.
func anchor(heading string) string {
	h := strings.ToLower(strings.TrimSpace(heading))
	var b strings.Builder
	for _, r := range h {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9'):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(t *testing.T, file string) map[string]bool {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	inCode := false
	for _, l := range strings.Split(string(raw), "\n") {
		if strings.HasPrefix(l, "```") {
			inCode = !inCode
		}
		if !inCode && strings.HasPrefix(l, "#") {
			out[anchor(strings.TrimLeft(l, "#"))] = true
		}
	}
	return out
}

func TestMarkdownLinksResolve(t *testing.T) {
	root := clustertest.Root(t)
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	checked := 0
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(raw), -1) {
			target := m[1]
			if strings.HasPrefix(target, "http://") || strings.HasPrefix(target, "https://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			if _, err := os.Stat(dest); err != nil {
				t.Errorf("%s: link %q: %v", filepath.Base(f), target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(dest, ".md") && !anchors(t, dest)[frag] {
				t.Errorf("%s: link %q: no heading #%s in %s", filepath.Base(f), target, frag, filepath.Base(dest))
			}
			checked++
		}
	}
	if checked < 15 {
		t.Errorf("only %d relative links checked", checked)
	}
}

// tableNames returns the first column (`name`) of markdown tables in a
// section of a file.
func tableNames(t *testing.T, file, section string) map[string]bool {
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(raw), section)
	if !ok {
		t.Fatalf("%s has no section %q", file, section)
	}
	if i := strings.Index(rest, "\n## "); i >= 0 {
		rest = rest[:i]
	}
	out := map[string]bool{}
	for _, l := range strings.Split(rest, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) > 2 {
			out[strings.Trim(strings.TrimSpace(cells[1]), "`")] = true
		}
	}
	return out
}

func TestEveryParameterIsDocumented(t *testing.T) {
	root := clustertest.Root(t)
	doc := filepath.Join(root, "docs", "parameters.md")
	sc := tableNames(t, doc, "## StorageClass `parameters`")
	for _, p := range driver.KnownParameters {
		if !sc[p] {
			t.Errorf("StorageClass parameter %q is accepted by the driver but missing from docs/parameters.md", p)
		}
	}
	vac := tableNames(t, doc, "## VolumeAttributesClass `parameters`")
	for _, p := range contract.KnownMutableParameters {
		if !vac[p] {
			t.Errorf("VolumeAttributesClass parameter %q is accepted by the driver but missing from docs/parameters.md", p)
		}
	}
	inline := tableNames(t, doc, "## CSI ephemeral inline volumes")
	for _, p := range driver.KnownEphemeralAttributes {
		if !inline[p] {
			t.Errorf("inline volume attribute %q is accepted but missing from docs/parameters.md", p)
		}
	}
	// And the README's table names the same StorageClass parameters.
	readme := tableNames(t, filepath.Join(root, "README.md"), "## StorageClass parameters")
	for _, p := range driver.KnownParameters {
		if !readme[p] {
			t.Errorf("StorageClass parameter %q missing from README.md", p)
		}
	}
}
