package docs

// Consistency of examples/, deploy/ and the docs with each other and with
// the driver, where a script can tell:
//
//   - every StorageClass, VolumeSnapshotClass, VolumeAttributesClass and
//     VolumeGroupSnapshotClass a PVC, snapshot or command in examples/,
//     docs/ or README.md names is one deploy/kubernetes installs, one
//     examples/ defines, or one a YAML block of the same page defines;
//   - every parameter of a localdir class there (and in Helm's values.yaml)
//     is one the driver accepts, with a value it accepts, and so is every
//     attribute of an inline volume;
//   - every `kubectl drain` in the docs carries --ignore-daemonsets and
//     --delete-emptydir-data (the controller pod has an emptyDir);
//   - every CRD in deploy/kubernetes/crds is named in README.md and
//     docs/install.md;
//   - every localdir-csi flag the docs mention (the README's flag table, and
//     commands that run localdir-csi) and every flag deploy/ passes to the
//     driver container exists in the binary's --help.

import (
	"bytes"
	"errors"
	"fmt"
	"go/build"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

// classRefs maps a field that names a class to the kind of that class.
var classRefs = map[string]string{
	"storageClassName":             "StorageClass",
	"volumeSnapshotClassName":      "VolumeSnapshotClass",
	"volumeAttributesClassName":    "VolumeAttributesClass",
	"volumeGroupSnapshotClassName": "VolumeGroupSnapshotClass",
}

// classRef finds those fields with a value, in YAML (`storageClassName:
// x`) and in the JSON of a kubectl patch (`"volumeAttributesClassName":"x"`),
// comments included.
var classRef = regexp.MustCompile(`\b(storageClassName|volumeSnapshotClassName|volumeAttributesClassName|volumeGroupSnapshotClassName)"?\s*:\s*"?([A-Za-z0-9][-A-Za-z0-9.]*)`)

// doc is one Kubernetes object and where it was found.
type doc struct {
	obj   *unstructured.Unstructured
	where string
}

// decodeYAML parses a multi-document YAML stream; documents that are empty
// or have no kind are skipped (deploy/kubernetes/test-driver*.yaml are the
// e2e suite's driver files, not objects).
func decodeYAML(raw []byte, where string) ([]doc, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(raw), 4096)
	var out []doc
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s: %w", where, err)
		}
		if _, ok := m["kind"].(string); !ok {
			continue
		}
		out = append(out, doc{&unstructured.Unstructured{Object: m}, where})
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// kustomizeObjects are the objects of the files deploy/kubernetes's
// kustomization.yaml lists as resources (the CRDs included).
func kustomizeObjects(t *testing.T, root string) []doc {
	t.Helper()
	dir := filepath.Join(root, "deploy", "kubernetes")
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(read(t, filepath.Join(dir, "kustomization.yaml")), &k); err != nil {
		t.Fatal(err)
	}
	var out []doc
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			t.Fatalf("kustomization.yaml resource %s: not a file (%v)", r, err)
		}
		docs, err := decodeYAML(read(t, p), "deploy/kubernetes/"+r)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, docs...)
	}
	if len(out) < 10 {
		t.Fatalf("deploy/kubernetes: only %d objects", len(out))
	}
	return out
}

// exampleObjects are the objects of examples/*.yaml.
func exampleObjects(t *testing.T, root string) []doc {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	var out []doc
	for _, f := range files {
		docs, err := decodeYAML(read(t, f), "examples/"+filepath.Base(f))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, docs...)
	}
	if len(out) < 10 {
		t.Fatalf("examples: only %d objects", len(out))
	}
	return out
}

var fence = regexp.MustCompile("(?ms)^```(yaml|yml)\\s*\n(.*?)^```")

// markdownObjects are the objects of the ```yaml blocks of a page; a block
// that is not a whole object (a fragment, Helm values) is skipped.
func markdownObjects(raw []byte, where string) []doc {
	var out []doc
	for _, m := range fence.FindAllSubmatch(raw, -1) {
		docs, err := decodeYAML(m[2], where)
		if err != nil {
			continue
		}
		out = append(out, docs...)
	}
	return out
}

// pages are the files whose text is checked: README.md, docs/*.md,
// examples/*.md and examples/*.yaml, relative to root.
func pages(t *testing.T, root string) []string {
	t.Helper()
	out := []string{"README.md"}
	for _, pattern := range []string{"docs/*.md", "examples/*.md", "examples/*.yaml"} {
		files, _ := filepath.Glob(filepath.Join(root, pattern))
		for _, f := range files {
			rel, _ := filepath.Rel(root, f)
			out = append(out, rel)
		}
	}
	return out
}

func classNames(docs []doc) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, d := range docs {
		kind := d.obj.GetKind()
		if out[kind] == nil {
			out[kind] = map[string]bool{}
		}
		out[kind][d.obj.GetName()] = true
	}
	return out
}

func TestReferencedClassesExist(t *testing.T) {
	root := clustertest.Root(t)
	shipped := append(kustomizeObjects(t, root), exampleObjects(t, root)...)
	checked := 0
	for _, page := range pages(t, root) {
		raw := read(t, filepath.Join(root, page))
		defined := classNames(append(slices.Clone(shipped), markdownObjects(raw, page)...))
		for i, line := range strings.Split(string(raw), "\n") {
			for _, m := range classRef.FindAllStringSubmatch(line, -1) {
				kind := classRefs[m[1]]
				checked++
				if !defined[kind][m[2]] {
					t.Errorf("%s:%d: %s %q: no %s of that name in deploy/kubernetes (kustomization.yaml resources), examples/ or this page", page, i+1, m[1], m[2], kind)
				}
			}
		}
	}
	t.Logf("%d class references checked", checked)
	if checked < 10 {
		t.Errorf("only %d class references found", checked)
	}
}

// localdirClass tells whether o is a class of the localdir driver: its
// provisioner, driver or driverName.
func localdirClass(o *unstructured.Unstructured) bool {
	for _, f := range []string{"provisioner", "driver", "driverName"} {
		if v, _, _ := unstructured.NestedString(o.Object, f); v == driver.DefaultDriverName {
			return true
		}
	}
	return false
}

// checkClassParameters returns what is wrong with the parameters of a
// localdir class, or "".
func checkClassParameters(o *unstructured.Unstructured) string {
	params, _, err := unstructured.NestedStringMap(o.Object, "parameters")
	if err != nil {
		return fmt.Sprintf("parameters: %v (values must be strings)", err)
	}
	switch o.GetKind() {
	case "StorageClass":
		for k, v := range params {
			switch {
			case k == contract.ReservedPrefix+"fstype":
				if _, ok := contract.FsTypes[v]; !ok {
					return fmt.Sprintf("%s=%q: the driver makes image volumes of %v only", k, v, keys(contract.FsTypes))
				}
			case strings.HasPrefix(k, contract.ReservedPrefix):
			case !slices.Contains(driver.KnownParameters, k):
				return fmt.Sprintf("parameter %q is not one the driver accepts (%v)", k, driver.KnownParameters)
			}
		}
		if _, err := contract.ParseParams(params); err != nil {
			return err.Error()
		}
	case "VolumeAttributesClass":
		for k := range params {
			if !slices.Contains(contract.KnownMutableParameters, k) {
				return fmt.Sprintf("parameter %q is not one the driver accepts (%v)", k, contract.KnownMutableParameters)
			}
		}
		if _, err := contract.ParseMutable(params); err != nil {
			return err.Error()
		}
	case "VolumeSnapshotClass":
		if _, err := driver.SnapshotCopies(params); err != nil {
			return err.Error()
		}
	case "VolumeGroupSnapshotClass":
		if _, err := driver.GroupSnapshotCopies(params); err != nil {
			return err.Error()
		}
	}
	return ""
}

// inlineVolumes returns the volumeAttributes of every CSI inline volume of
// the localdir driver in o (a pod, or a workload's pod template).
func inlineVolumes(o map[string]any) []map[string]any {
	var out []map[string]any
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if csi, ok := v["csi"].(map[string]any); ok && csi["driver"] == driver.DefaultDriverName {
				attrs, _ := csi["volumeAttributes"].(map[string]any)
				out = append(out, attrs)
			}
			for _, c := range v {
				walk(c)
			}
		case []any:
			for _, c := range v {
				walk(c)
			}
		}
	}
	walk(o)
	return out
}

func TestClassParametersAccepted(t *testing.T) {
	root := clustertest.Root(t)
	all := append(kustomizeObjects(t, root), exampleObjects(t, root)...)
	for _, page := range pages(t, root) {
		if strings.HasSuffix(page, ".md") {
			all = append(all, markdownObjects(read(t, filepath.Join(root, page)), page)...)
		}
	}
	// Helm: the default StorageClass's parameters value.
	var values struct {
		StorageClass struct {
			Parameters map[string]string `json:"parameters"`
		} `json:"storageClass"`
	}
	if err := yaml.Unmarshal(read(t, filepath.Join(root, "deploy", "helm", "localdir", "values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	helmSC := &unstructured.Unstructured{Object: map[string]any{"kind": "StorageClass", "provisioner": driver.DefaultDriverName}}
	helmSC.SetName("values.yaml storageClass")
	if len(values.StorageClass.Parameters) > 0 {
		p := map[string]any{}
		for k, v := range values.StorageClass.Parameters {
			p[k] = v
		}
		helmSC.Object["parameters"] = p
	}
	all = append(all, doc{helmSC, "deploy/helm/localdir/values.yaml"})

	classes, inline := 0, 0
	for _, d := range all {
		if _, isClass := map[string]bool{"StorageClass": true, "VolumeSnapshotClass": true, "VolumeAttributesClass": true, "VolumeGroupSnapshotClass": true}[d.obj.GetKind()]; isClass && localdirClass(d.obj) {
			classes++
			if msg := checkClassParameters(d.obj); msg != "" {
				t.Errorf("%s: %s %s: %s", d.where, d.obj.GetKind(), d.obj.GetName(), msg)
			}
		}
		for _, attrs := range inlineVolumes(d.obj.Object) {
			inline++
			for k, v := range attrs {
				if !slices.Contains(driver.KnownEphemeralAttributes, k) {
					t.Errorf("%s: %s %s: inline volume attribute %q is not one the driver accepts (%v)", d.where, d.obj.GetKind(), d.obj.GetName(), k, driver.KnownEphemeralAttributes)
				}
				if _, ok := v.(string); !ok {
					t.Errorf("%s: %s %s: inline volume attribute %s: %v is not a string", d.where, d.obj.GetKind(), d.obj.GetName(), k, v)
				}
			}
		}
	}
	t.Logf("%d localdir classes and %d inline volumes checked", classes, inline)
	if classes < 6 || inline < 1 {
		t.Errorf("only %d localdir classes and %d inline volumes checked", classes, inline)
	}
}

var drainFlags = []string{"--ignore-daemonsets", "--delete-emptydir-data"}

// drainCommands returns every `kubectl drain` of a page with what follows
// it: in a code block the rest of the command (lines joined at a trailing
// backslash), in prose the rest of the inline code span, or of the
// paragraph when it is not in one.
func drainCommands(raw string) []string {
	var out []string
	inCode := false
	var para []string
	flush := func() {
		text := strings.Join(para, " ")
		para = nil
		for {
			i := strings.Index(text, "kubectl drain")
			if i < 0 {
				return
			}
			rest := text[i:]
			if strings.Count(text[:i], "`")%2 == 1 {
				if j := strings.Index(rest, "`"); j >= 0 {
					rest = rest[:j]
				}
			}
			out = append(out, rest)
			text = text[i+len("kubectl drain"):]
		}
	}
	lines := strings.Split(raw, "\n")
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			flush()
			inCode = !inCode
			continue
		}
		if !inCode {
			if strings.TrimSpace(l) == "" {
				flush()
			} else {
				para = append(para, l)
			}
			continue
		}
		cmd := l
		for strings.HasSuffix(strings.TrimRight(cmd, " "), `\`) && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(strings.TrimRight(cmd, " "), `\`) + " " + lines[i]
		}
		if j := strings.Index(cmd, "kubectl drain"); j >= 0 {
			out = append(out, cmd[j:])
		}
	}
	flush()
	return out
}

func TestDrainCommandsCarryTheFlags(t *testing.T) {
	root := clustertest.Root(t)
	found := 0
	for _, page := range pages(t, root) {
		for _, cmd := range drainCommands(string(read(t, filepath.Join(root, page)))) {
			found++
			fields := strings.Fields(cmd)
			for _, f := range drainFlags {
				if !slices.Contains(fields, f) && !slices.ContainsFunc(fields, func(s string) bool { return strings.HasPrefix(s, f+"=") }) {
					t.Errorf("%s: %q lacks %s (the controller pod has an emptyDir; tests/e2e/multinode_test.go drains with %s)", page, cmd, f, strings.Join(drainFlags, " "))
				}
			}
		}
	}
	t.Logf("%d kubectl drain commands checked", found)
	if found == 0 {
		t.Error("no kubectl drain found in the docs: docs/operations.md should show one")
	}
}

func TestEveryCRDIsNamed(t *testing.T) {
	root := clustertest.Root(t)
	files, _ := filepath.Glob(filepath.Join(root, "deploy", "kubernetes", "crds", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no CRDs in deploy/kubernetes/crds")
	}
	pages := map[string]string{}
	for _, p := range []string{"README.md", "docs/install.md"} {
		pages[p] = string(read(t, filepath.Join(root, p)))
	}
	for _, f := range files {
		docs, err := decodeYAML(read(t, f), f)
		if err != nil || len(docs) != 1 {
			t.Fatalf("%s: want one CRD (%v)", f, err)
		}
		kind, _, _ := unstructured.NestedString(docs[0].obj.Object, "spec", "names", "kind")
		for p, text := range pages {
			if !strings.Contains(text, "`"+kind+"`") && !strings.Contains(text, docs[0].obj.GetName()) {
				t.Errorf("%s does not name the CRD %s (`%s` or %s), which deploy/kubernetes/crds/%s ships", p, kind, kind, docs[0].obj.GetName(), filepath.Base(f))
			}
		}
	}
}

// binaryFlags builds cmd/localdir-csi and returns the long and short names
// of the flags its --help lists (and help itself).
func binaryFlags(t *testing.T, root string) (long, short map[string]bool) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "localdir-csi")
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(build.Default.GOROOT, "bin", "go") // go test run without go on PATH
	}
	gocmd := exec.Command(gobin, "build", "-trimpath", "-o", bin, "./cmd/localdir-csi")
	gocmd.Dir = root
	gocmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := gocmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/localdir-csi: %v\n%s", err, out)
	}
	out, _ := exec.Command(bin, "--help").CombinedOutput() // pflag exits 0 or 2 after --help
	long, short = map[string]bool{"help": true}, map[string]bool{"h": true}
	for _, m := range regexp.MustCompile(`(?m)^\s+(?:-([A-Za-z0-9]), )?--([a-z0-9][-a-z0-9]*)`).FindAllStringSubmatch(string(out), -1) {
		long[m[2]] = true
		if m[1] != "" {
			short[m[1]] = true
		}
	}
	if len(long) < 15 {
		t.Fatalf("localdir-csi --help lists only %d flags:\n%s", len(long), out)
	}
	return long, short
}

var flagToken = regexp.MustCompile("(?:^|[\\s`(,])(--?[A-Za-z][-A-Za-z0-9]*)")

// badFlag says what is wrong with a flag token (--x, -x or -x=…), or "".
func badFlag(tok string, long, short map[string]bool) string {
	name, _, _ := strings.Cut(tok, "=")
	switch {
	case strings.HasPrefix(name, "--"):
		if !long[name[2:]] {
			return "no such flag"
		}
	case len(name) == 2:
		if !short[name[1:]] {
			return "no such shorthand"
		}
	default:
		return "a long flag needs two dashes"
	}
	return ""
}

// runsLocaldir finds the binary used as a command on a line: a word
// localdir-csi, or a path ending in /localdir-csi, that is not part of a
// key=value or an image reference. It returns what follows it, up to the
// end of the command (a pipe, ;, && or a redirection), or ok false.
func runsLocaldir(line string) (rest string, ok bool) {
	fields := strings.Fields(line)
	for i, f := range fields {
		w := strings.Trim(f, "`'\"()")
		if (w == "localdir-csi" || strings.HasSuffix(w, "/localdir-csi")) && !strings.ContainsAny(w, "=:@") {
			var tail []string
			for _, g := range fields[i+1:] {
				if g == "|" || g == ";" || g == "&&" || g == "||" || strings.HasPrefix(g, ">") || strings.HasPrefix(g, "2>") {
					break
				}
				tail = append(tail, g)
				if strings.HasSuffix(g, "`") {
					break // the end of an inline code span
				}
			}
			return strings.Join(tail, " "), true
		}
	}
	return "", false
}

func TestDocumentedFlagsExist(t *testing.T) {
	root := clustertest.Root(t)
	long, short := binaryFlags(t, root)
	checked := 0
	check := func(where, tok string) {
		checked++
		if msg := badFlag(tok, long, short); msg != "" {
			t.Errorf("%s: %s: %s in localdir-csi --help", where, tok, msg)
		}
	}

	// The README's flag table: the first cell of each row.
	readme := string(read(t, filepath.Join(root, "README.md")))
	_, table, ok := strings.Cut(readme, "\n## Flags\n")
	if !ok {
		t.Fatal("README.md has no ## Flags section")
	}
	if i := strings.Index(table, "\n## "); i >= 0 {
		table = table[:i]
	}
	for _, l := range strings.Split(table, "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 3 || strings.Trim(strings.TrimSpace(cells[1]), "-") == "" || strings.TrimSpace(cells[1]) == "flag" {
			continue
		}
		for _, m := range flagToken.FindAllStringSubmatch(cells[1], -1) {
			check("README.md flag table", m[1])
		}
	}

	// Commands that run localdir-csi, in every page (code lines joined at a
	// trailing backslash).
	for _, page := range pages(t, root) {
		lines := strings.Split(string(read(t, filepath.Join(root, page))), "\n")
		for i := 0; i < len(lines); i++ {
			n, l := i+1, lines[i]
			for strings.HasSuffix(strings.TrimRight(l, " "), `\`) && i+1 < len(lines) {
				i++
				l = strings.TrimSuffix(strings.TrimRight(l, " "), `\`) + " " + lines[i]
			}
			if rest, ok := runsLocaldir(l); ok {
				for _, m := range flagToken.FindAllStringSubmatch(rest, -1) {
					check(fmt.Sprintf("%s:%d", page, n), m[1])
				}
			}
		}
	}

	// The arguments deploy/kubernetes gives the driver container.
	for _, d := range kustomizeObjects(t, root) {
		cs, _, _ := unstructured.NestedSlice(d.obj.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			c, _ := c.(map[string]any)
			if img, _ := c["image"].(string); !strings.HasPrefix(img, "localdir/localdir-csi") {
				continue
			}
			args, _ := c["args"].([]any)
			for _, a := range args {
				if s, _ := a.(string); strings.HasPrefix(s, "-") {
					check(fmt.Sprintf("%s %s container %v", d.where, d.obj.GetName(), c["name"]), s)
				}
			}
		}
	}
	// And the chart's: the `- --flag` lines of the localdir container's
	// block in its templates.
	for _, tpl := range []string{"controller.yaml", "node.yaml"} {
		in := false
		for i, l := range strings.Split(string(read(t, filepath.Join(root, "deploy", "helm", "localdir", "templates", tpl))), "\n") {
			if s := strings.TrimSpace(l); strings.HasPrefix(s, "- name: ") && strings.HasPrefix(l, "        - name: ") {
				in = s == "- name: localdir"
				continue
			}
			if s := strings.TrimSpace(l); in && strings.HasPrefix(s, "- -") {
				check(fmt.Sprintf("deploy/helm/localdir/templates/%s:%d", tpl, i+1), strings.TrimPrefix(s, "- "))
			}
		}
	}
	t.Logf("%d flag mentions checked against %d flags of localdir-csi --help", checked, len(long))
	if checked < 40 {
		t.Errorf("only %d flag mentions checked", checked)
	}
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
