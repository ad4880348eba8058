// Package deploy checks the install manifests against a real API server
// (etcd + kube-apiserver from `make tools`, with the localdir CRDs and, for
// the VolumeSnapshotClass, the snapshot CRDs):
//
//   - `kubectl kustomize deploy/kubernetes` and `helm template
//     deploy/helm/localdir` (attachRequired false and true) pass
//     `kubectl apply --server-side --dry-run=server`, object by object;
//   - `helm lint --strict` passes;
//   - both ship exactly the CRDs `make generate` wrote, the chart in its
//     crds/ folder, so `helm uninstall` keeps them (checked with a real
//     install and uninstall);
//   - both render the same objects and the same pinned images;
//   - `kubectl get localvolumes` shows the printer columns and `kubectl
//     explain localvolume.spec.size` the field's documentation.
//
// helm and kubectl (whose kustomize is the one `kubectl apply -k` uses) are
// built from their Go modules by `make tools` into _output/tools/bin.
package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

// snapshotClientModule holds the snapshot.storage.k8s.io CRDs under
// config/crd, at the external-snapshotter version the cluster tests build.
// They are a cluster add-on, never part of localdir's manifests, so the
// test fetches them through the Go module cache instead of committing them.
const snapshotClientModule = "github.com/kubernetes-csi/external-snapshotter/client/v8@v8.7.0"

var snapshotCRDs = []string{
	"snapshot.storage.k8s.io_volumesnapshotclasses.yaml",
	"snapshot.storage.k8s.io_volumesnapshotcontents.yaml",
	"snapshot.storage.k8s.io_volumesnapshots.yaml",
}

// namespace is the one deploy/kubernetes uses; the chart is rendered into
// the same one with the release name "localdir", so both produce the same
// object names.
const namespace = "localdir"

// attacherImage is the only image the chart leaves out by default
// (attachRequired: false); the kustomize Deployment always has it.
const attacherImage = "registry.k8s.io/sig-storage/csi-attacher"

// snapshotMetadataImage is external-snapshot-metadata's sidecar, which the
// chart leaves out with snapshotMetadata.enabled=false.
const snapshotMetadataImage = "registry.k8s.io/sig-storage/csi-snapshot-metadata"

type tools struct {
	root, helmBin, kubectlBin string
	kubeconfig                string
	home                      string // helm's and kubectl's cache and config
}

func TestDeploy(t *testing.T) {
	root := clustertest.Root(t)
	tl := newTools(t, root)
	env := clustertest.Start(t)
	tl.kubeconfig = env.Kubeconfig
	tl.installPrerequisites(t)
	d := tl.render(t, env)

	t.Run("KustomizeServerDryRun", func(t *testing.T) {
		tl.serverDryRun(t, d.kz)
	})
	t.Run("HelmServerDryRun", func(t *testing.T) {
		tl.serverDryRun(t, d.hm)
	})
	t.Run("HelmServerDryRunAttachRequired", func(t *testing.T) {
		tl.serverDryRun(t, d.hmAttach)
	})
	t.Run("HelmWithoutSnapshotMetadata", d.withoutSnapshotMetadata)
	t.Run("HelmLint", d.helmLint)
	t.Run("BothShipTheGeneratedCRDs", d.bothShipTheGeneratedCRDs)
	t.Run("SameObjects", d.sameObjects)
	t.Run("SameImages", d.sameImages)
	t.Run("MetricsOverHTTPSWithTokens", d.metricsObjects)
	t.Run("PrinterColumns", d.printerColumns)
	t.Run("Explain", d.explain)
	// Last: it installs the chart for real.
	t.Run("HelmUninstallKeepsCRDs", d.helmUninstallKeepsCRDs)
}

// newTools finds helm and kubectl in _output/tools/bin.
func newTools(t *testing.T, root string) *tools {
	t.Helper()
	bin := filepath.Join(root, "_output", "tools", "bin")
	tl := &tools{root: root, home: t.TempDir()}
	for name, p := range map[string]*string{"helm": &tl.helmBin, "kubectl": &tl.kubectlBin} {
		*p = filepath.Join(bin, name)
		if _, err := os.Stat(*p); err != nil {
			t.Fatalf("%s is missing: run `make tools` first (builds it from its Go module into %s)", name, bin)
		}
	}
	return tl
}

// installPrerequisites: the VolumeSnapshotClass needs its CRD, and
// namespaced objects need their namespace to exist even in a dry run:
// install both for real.
func (tl *tools) installPrerequisites(t *testing.T) {
	t.Helper()
	dir := snapshotCRDDir(t)
	for _, f := range snapshotCRDs {
		tl.kubectlOK(t, nil, "apply", "--server-side", "-f", filepath.Join(dir, f))
	}
	tl.kubectlOK(t, nil, "wait", "--for=condition=Established", "--timeout=60s",
		"crd/volumesnapshotclasses.snapshot.storage.k8s.io",
		"crd/volumesnapshotcontents.snapshot.storage.k8s.io",
		"crd/volumesnapshots.snapshot.storage.k8s.io")
	tl.kubectlOK(t, nil, "create", "namespace", namespace)
}

// rendered holds the manifests under test: kubectl kustomize, helm template
// (default values) and helm template with attachRequired=true.
type rendered struct {
	tl               *tools
	env              *clustertest.Env
	chart            string
	kz, hm, hmAttach []byte
}

func (tl *tools) render(t *testing.T, env *clustertest.Env) *rendered {
	t.Helper()
	d := &rendered{tl: tl, env: env, chart: filepath.Join(tl.root, "deploy", "helm", "localdir")}
	d.kz = tl.run(t, nil, tl.kubectlBin, "kustomize", filepath.Join(tl.root, "deploy", "kubernetes"))
	helmArgs := []string{"template", "localdir", d.chart, "--namespace", namespace, "--include-crds"}
	d.hm = tl.run(t, nil, tl.helmBin, helmArgs...)
	d.hmAttach = tl.run(t, nil, tl.helmBin, append(helmArgs, "--set", "attachRequired=true")...)
	return d
}

// withoutSnapshotMetadata: snapshotMetadata.enabled=false leaves out the
// sidecar, its Service, Secret and permissions, and the controller's flag,
// and what is left applies.
func (d *rendered) withoutSnapshotMetadata(t *testing.T) {
	out := d.tl.run(t, nil, d.tl.helmBin, "template", "localdir", d.chart, "--namespace", namespace, "--set", "snapshotMetadata.enabled=false")
	for _, id := range objectIDs(t, out) {
		if strings.Contains(id, "snapshot-metadata") {
			t.Errorf("snapshotMetadata.enabled=false still renders %s", id)
		}
	}
	for _, img := range images(t, out) {
		if strings.HasPrefix(img, snapshotMetadataImage+":") {
			t.Errorf("snapshotMetadata.enabled=false still runs %s", img)
		}
	}
	if strings.Contains(string(out), "--snapshot-metadata-address") {
		t.Error("snapshotMetadata.enabled=false still passes --snapshot-metadata-address")
	}
	d.tl.serverDryRun(t, out)
}

func (d *rendered) helmLint(t *testing.T) {
	for _, extra := range [][]string{nil, {"--set", "attachRequired=true"}} {
		out := d.tl.run(t, nil, d.tl.helmBin, append([]string{"lint", "--strict", d.chart}, extra...)...)
		if !strings.Contains(string(out), "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint --strict %v: unexpected output:\n%s", extra, out)
		}
	}
}

// bothShipTheGeneratedCRDs: exactly what `make generate` wrote to
// deploy/kubernetes/crds: all of it in kustomization.yaml, and in the
// chart's crds/ folder, where Helm keeps CRDs across `helm uninstall`.
func (d *rendered) bothShipTheGeneratedCRDs(t *testing.T) {
	want := crdDocs(t, filepath.Join(d.tl.root, "deploy", "kubernetes", "crds"))
	for name, manifests := range map[string][]byte{
		"kubectl kustomize deploy/kubernetes": d.kz,
		"helm show crds deploy/helm/localdir": d.tl.run(t, nil, d.tl.helmBin, "show", "crds", d.chart),
	} {
		got := crdJSON(t, manifests)
		if !slices.Equal(keys(got), keys(want)) {
			t.Errorf("%s ships CRDs %v, deploy/kubernetes/crds has %v", name, keys(got), keys(want))
		}
		for crd, w := range want {
			if g, ok := got[crd]; ok && g != w {
				t.Errorf("%s: CRD %s differs from deploy/kubernetes/crds", name, crd)
			}
		}
	}
}

// crdJSON returns the CRDs among manifests, name → JSON.
func crdJSON(t *testing.T, manifests []byte) map[string]string {
	t.Helper()
	got := map[string]string{}
	for _, o := range decodeAll(t, manifests) {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		b, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		got[o.GetName()] = string(b)
	}
	return got
}

// sameObjects: the chart renders the kustomize objects (but the Namespace,
// which Helm leaves to --create-namespace) when attachRequired is on, and
// leaves out only csi-attacher's RBAC when it is off.
func (d *rendered) sameObjects(t *testing.T) {
	kzObjs := objectIDs(t, d.kz, "Namespace")
	if diff := setDiff(kzObjs, objectIDs(t, d.hmAttach)); diff != "" {
		t.Errorf("kustomize vs helm --set attachRequired=true objects differ:\n%s", diff)
	}
	noAttacher := slices.DeleteFunc(slices.Clone(kzObjs), func(id string) bool {
		return strings.HasSuffix(id, "/localdir-external-attacher")
	})
	if len(noAttacher) != len(kzObjs)-4 {
		t.Errorf("kustomize renders %d csi-attacher RBAC objects, want 4 (ClusterRole, Role and their bindings)", len(kzObjs)-len(noAttacher))
	}
	if diff := setDiff(noAttacher, objectIDs(t, d.hm)); diff != "" {
		t.Errorf("kustomize (without csi-attacher RBAC) vs helm default objects differ:\n%s", diff)
	}
}

// sameImages: kustomize pins the driver and its seven sidecars by tag, helm
// with attachRequired=true renders the same images, and by default the
// same without csi-attacher.
func (d *rendered) sameImages(t *testing.T) {
	kzImages := images(t, d.kz)
	var repos []string
	for _, img := range kzImages {
		repo, tag, ok := strings.Cut(img, ":")
		if !ok || tag == "" || tag == "latest" || strings.Contains(repo, "@") {
			t.Errorf("image %q has no pinned tag: is it missing from kustomization.yaml images:?", img)
		}
		repos = append(repos, repo)
	}
	want := []string{
		"localdir/localdir-csi", attacherImage,
		"registry.k8s.io/sig-storage/csi-provisioner",
		"registry.k8s.io/sig-storage/csi-resizer",
		"registry.k8s.io/sig-storage/csi-snapshotter",
		"registry.k8s.io/sig-storage/csi-node-driver-registrar",
		"registry.k8s.io/sig-storage/livenessprobe",
		snapshotMetadataImage,
	}
	if diff := setDiff(want, repos); diff != "" {
		t.Errorf("kustomize images are not the driver and its seven sidecars:\n%s", diff)
	}
	if diff := setDiff(kzImages, images(t, d.hmAttach)); diff != "" {
		t.Errorf("kustomization.yaml images and helm values.yaml images (attachRequired=true) differ:\n%s", diff)
	}
	noAttacher := slices.DeleteFunc(slices.Clone(kzImages), func(img string) bool {
		return strings.HasPrefix(img, attacherImage+":")
	})
	if diff := setDiff(noAttacher, images(t, d.hm)); diff != "" {
		t.Errorf("helm default images should be kustomize's without csi-attacher:\n%s", diff)
	}
}

// printerColumns: kubectl get localvolumes (and -o wide) print the
// printer columns of a LocalVolume it creates (kept for
// helmUninstallKeepsCRDs).
func (d *rendered) printerColumns(t *testing.T) {
	lv := &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: "vol-00112233445566778899aabbccddeeff", Labels: map[string]string{v1.NodeLabel: "node-a"}},
		Spec:       v1.LocalVolumeSpec{Node: "node-a", Size: resource.MustParse("1Gi"), CSIName: "pvc-printer-columns"},
	}
	if err := d.env.Client.Create(context.Background(), lv); err != nil {
		t.Fatalf("create LocalVolume: %v", err)
	}
	out := string(d.tl.kubectlOK(t, nil, "get", "localvolumes"))
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get localvolumes: want a header and one row, got:\n%s", out)
	}
	if got, want := strings.Fields(lines[0]), []string{"NAME", "NODE", "SIZE", "PHASE", "AGE"}; !slices.Equal(got, want) {
		t.Errorf("kubectl get localvolumes header = %v, want %v", got, want)
	}
	if got := strings.Fields(lines[1]); len(got) < 3 || got[0] != lv.Name || got[1] != "node-a" || got[2] != "1Gi" {
		t.Errorf("kubectl get localvolumes row = %q, want %s node-a 1Gi …", lines[1], lv.Name)
	}
	wide := strings.Split(strings.TrimSpace(string(d.tl.kubectlOK(t, nil, "get", "lv", "-o", "wide"))), "\n")
	if got, want := strings.Fields(wide[0]), []string{"NAME", "NODE", "SIZE", "MODE", "PHASE", "PV", "AGE"}; !slices.Equal(got, want) {
		t.Errorf("kubectl get lv -o wide header = %v, want %v", got, want)
	}
}

// explain: kubectl explain localvolume.spec.size prints the field's
// documentation. The OpenAPI document of a new CRD is published
// asynchronously: retried for up to 60 s.
func (d *rendered) explain(t *testing.T) {
	var out string
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := d.tl.kubectl(t, nil, "explain", "localvolume.spec.size")
		out = strings.Join(strings.Fields(string(b)), " ")
		if err == nil && strings.Contains(out, "capacity in bytes") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("kubectl explain localvolume.spec.size (err %v) does not print the field's documentation:\n%s", err, b)
		}
		time.Sleep(time.Second)
	}
	// A quantity's schema is integer-or-string, which kubectl explain prints
	// as <Object>.
	for _, want := range []string{"KIND: LocalVolume", "FIELD: size <Object>", "Size is the volume's capacity in bytes."} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl explain localvolume.spec.size: %q missing from:\n%s", want, out)
		}
	}
}

// helmUninstallKeepsCRDs installs the chart for real and uninstalls it: a
// CRD in templates/ instead of crds/ would be deleted by `helm uninstall`,
// and with it every LocalVolume, LocalSnapshot and LocalNode of the
// cluster.
func (d *rendered) helmUninstallKeepsCRDs(t *testing.T) {
	tl := d.tl
	for _, id := range objectIDs(t, tl.run(t, nil, tl.helmBin, "template", "localdir", d.chart, "--namespace", namespace)) {
		if strings.HasPrefix(id, "CustomResourceDefinition/") {
			t.Errorf("%s is rendered from templates/: CRDs belong in the chart's crds/ folder", id)
		}
	}
	var lvs v1.LocalVolumeList
	if err := d.env.Client.List(context.Background(), &lvs); err != nil || len(lvs.Items) == 0 {
		t.Fatalf("want the LocalVolume of PrinterColumns to exist before the install (err %v)", err)
	}
	tl.run(t, nil, tl.helmBin, "install", "localdir", d.chart, "--namespace", namespace)
	tl.kubectlOK(t, nil, "get", "csidriver/localdir.csi.dev", "storageclass/localdir", "volumesnapshotclass/localdir")
	tl.kubectlOK(t, nil, "--namespace", namespace, "get", "deployment/localdir-controller", "daemonset/localdir-node")
	tl.run(t, nil, tl.helmBin, "uninstall", "localdir", "--namespace", namespace)
	if out, err := tl.kubectl(t, nil, "get", "csidriver/localdir.csi.dev"); err == nil || !strings.Contains(string(out), "NotFound") {
		t.Errorf("CSIDriver still there after helm uninstall (err %v):\n%s", err, out)
	}
	tl.kubectlOK(t, nil, "get", "crd/localvolumes.localdir.csi.dev", "crd/localsnapshots.localdir.csi.dev", "crd/localnodes.localdir.csi.dev", "crd/localgroupsnapshots.localdir.csi.dev")
	var after v1.LocalVolumeList
	if err := d.env.Client.List(context.Background(), &after); err != nil || len(after.Items) != len(lvs.Items) {
		t.Errorf("after helm uninstall: %d LocalVolumes, want %d (err %v)", len(after.Items), len(lvs.Items), err)
	}
}

// serverDryRun sends manifests to `kubectl apply --server-side
// --dry-run=server` and checks that every object was accepted.
func (tl *tools) serverDryRun(t *testing.T, manifests []byte) {
	t.Helper()
	objs := decodeAll(t, manifests)
	if len(objs) == 0 {
		t.Fatal("nothing rendered")
	}
	out := string(tl.kubectlOK(t, manifests, "apply", "--server-side", "--dry-run=server", "-f", "-"))
	n := strings.Count(out, "(server dry run)")
	if n != len(objs) {
		t.Errorf("server dry run accepted %d objects, %d rendered:\n%s", n, len(objs), out)
	}
}

func (tl *tools) kubectl(t *testing.T, stdin []byte, args ...string) ([]byte, error) {
	t.Helper()
	return tl.exec(t, stdin, tl.kubectlBin, append([]string{"--kubeconfig", tl.kubeconfig, "--cache-dir", filepath.Join(tl.home, "kube-cache")}, args...)...)
}

func (tl *tools) kubectlOK(t *testing.T, stdin []byte, args ...string) []byte {
	t.Helper()
	out, err := tl.kubectl(t, stdin, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// run runs a tool and returns its standard output; it fails the test on a
// non-zero exit.
func (tl *tools) run(t *testing.T, stdin []byte, bin string, args ...string) []byte {
	t.Helper()
	out, err := tl.exec(t, stdin, bin, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, out)
	}
	return out
}

// exec returns standard output, or standard output and standard error
// together with the error.
func (tl *tools) exec(t *testing.T, stdin []byte, bin string, args ...string) ([]byte, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = tl.root
	cmd.Env = append(os.Environ(),
		"KUBECONFIG="+tl.kubeconfig,
		"HELM_CACHE_HOME="+filepath.Join(tl.home, "helm-cache"),
		"HELM_CONFIG_HOME="+filepath.Join(tl.home, "helm-config"),
		"HELM_DATA_HOME="+filepath.Join(tl.home, "helm-data"),
	)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// snapshotCRDDir downloads snapshotClientModule into the module cache and
// returns its config/crd directory.
func snapshotCRDDir(t *testing.T) string {
	t.Helper()
	cmd := exec.Command("go", "mod", "download", "-json", snapshotClientModule)
	cmd.Dir = t.TempDir() // outside any module: nothing's go.mod changes
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); jerr != nil || err != nil || mod.Error != "" {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			out = append(out, ee.Stderr...)
		}
		t.Fatalf("go mod download %s: %v %s\n%s", snapshotClientModule, err, mod.Error, out)
	}
	dir := filepath.Join(mod.Dir, "config", "crd")
	for _, f := range snapshotCRDs {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Fatalf("%s has no %s: %v", snapshotClientModule, f, err)
		}
	}
	return dir
}

// decodeAll parses a multi-document YAML stream; empty documents are
// skipped.
func decodeAll(t *testing.T, manifests []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifests), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("parse rendered manifests: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// objectIDs are kind/namespace/name of the rendered objects, without the
// kinds in skip.
func objectIDs(t *testing.T, manifests []byte, skip ...string) []string {
	t.Helper()
	var ids []string
	for _, o := range decodeAll(t, manifests) {
		if slices.Contains(skip, o.GetKind()) {
			continue
		}
		ids = append(ids, fmt.Sprintf("%s/%s/%s", o.GetKind(), o.GetNamespace(), o.GetName()))
	}
	return ids
}

// images lists the distinct container images of the rendered workloads.
func images(t *testing.T, manifests []byte) []string {
	t.Helper()
	seen := map[string]bool{}
	for _, o := range decodeAll(t, manifests) {
		for _, field := range []string{"containers", "initContainers"} {
			cs, _, err := unstructured.NestedSlice(o.Object, "spec", "template", "spec", field)
			if err != nil {
				t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
			}
			for _, c := range cs {
				img, _ := c.(map[string]any)["image"].(string)
				if img == "" {
					t.Errorf("%s %s has a container without an image", o.GetKind(), o.GetName())
				}
				seen[img] = true
			}
		}
	}
	return keys(seen)
}

// crdDocs maps the name of each CRD in dir to its JSON form.
func crdDocs(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no CRDs in %s: %v", dir, err)
	}
	docs := map[string]string{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range decodeAll(t, b) {
			j, err := json.Marshal(o.Object)
			if err != nil {
				t.Fatal(err)
			}
			docs[o.GetName()] = string(j)
		}
	}
	return docs
}

func keys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// setDiff describes how the sets a and b differ, or returns "" when they
// are equal; an element repeated within one side is reported too.
func setDiff(a, b []string) string {
	inA, inB := map[string]int{}, map[string]int{}
	all := map[string]bool{}
	for _, s := range a {
		inA[s]++
		all[s] = true
	}
	for _, s := range b {
		inB[s]++
		all[s] = true
	}
	var out []string
	for _, s := range keys(all) {
		switch {
		case inB[s] == 0:
			out = append(out, "  only in the first:  "+s)
		case inA[s] == 0:
			out = append(out, "  only in the second: "+s)
		case inA[s] > 1 || inB[s] > 1:
			out = append(out, fmt.Sprintf("  %s appears %d and %d times", s, inA[s], inB[s]))
		}
	}
	return strings.Join(out, "\n")
}
