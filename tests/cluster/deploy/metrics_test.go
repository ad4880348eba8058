package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// metricsObjects: /metrics is HTTPS with a bearer token in both installs.
// The kustomize component deploy/kubernetes/components/metrics and the
// chart's metrics.serviceMonitor.enabled add the same Service and
// ServiceMonitor (scheme https, Prometheus's token, the self-signed
// certificate accepted); both ship the same localdir-metrics-reader
// ClusterRole, and give the controller and the node plugin the right to
// review tokens and access. The chart's metrics.certSecret mounts the
// Secret where --metrics-cert-dir points.
func (d *rendered) metricsObjects(t *testing.T) {
	tl := d.tl
	overlay := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(overlay, filepath.Join(tl.root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kz := "resources: [" + rel("deploy/kubernetes") + "]\ncomponents: [" + rel("deploy/kubernetes/components/metrics") + "]\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kz), 0o644); err != nil {
		t.Fatal(err)
	}
	kzM := tl.run(t, nil, tl.kubectlBin, "kustomize", overlay)
	helm := []string{"template", "localdir", d.chart, "--namespace", namespace}
	hmM := tl.run(t, nil, tl.helmBin, append(helm, "--set", "metrics.serviceMonitor.enabled=true")...)

	want := []string{"Service/localdir/localdir-metrics", "ServiceMonitor/localdir/localdir"}
	if diff := setDiff(want, added(t, d.kz, kzM)); diff != "" {
		t.Errorf("the metrics component adds other objects than %v:\n%s", want, diff)
	}
	if diff := setDiff(want, added(t, d.hm, hmM)); diff != "" {
		t.Errorf("metrics.serviceMonitor.enabled adds other objects than %v:\n%s", want, diff)
	}
	for _, id := range want {
		k, h := specJSON(t, find(t, kzM, id)), specJSON(t, find(t, hmM, id))
		if k != h {
			t.Errorf("%s: kustomize and helm differ:\n  kustomize %s\n  helm      %s", id, k, h)
		}
	}
	eps, _, _ := unstructured.NestedSlice(find(t, kzM, want[1]).Object, "spec", "endpoints")
	for _, e := range eps {
		e, _ := e.(map[string]any)
		skip, _, _ := unstructured.NestedBool(e, "tlsConfig", "insecureSkipVerify")
		if e["scheme"] != "https" || e["bearerTokenFile"] != "/var/run/secrets/kubernetes.io/serviceaccount/token" || !skip {
			t.Errorf("ServiceMonitor endpoint %v: want scheme https, Prometheus's ServiceAccount token and the self-signed certificate accepted", e)
		}
	}
	if len(eps) != 1 {
		t.Errorf("ServiceMonitor has %d endpoints, want 1", len(eps))
	}

	reader := "ClusterRole//localdir-metrics-reader"
	if k, h := rulesJSON(t, find(t, d.kz, reader)), rulesJSON(t, find(t, d.hm, reader)); k != h || k != `[{"nonResourceURLs":["/metrics"],"verbs":["get"]}]` {
		t.Errorf("%s rules: kustomize %s, helm %s; want get on /metrics only", reader, k, h)
	}
	for _, m := range []struct{ name, manifests string }{{"kustomize", string(d.kz)}, {"helm", string(d.hm)}} {
		for _, role := range []string{"ClusterRole//localdir-controller", "ClusterRole//localdir-node"} {
			rules := rulesJSON(t, find(t, []byte(m.manifests), role))
			for _, r := range []string{
				`{"apiGroups":["authentication.k8s.io"],"resources":["tokenreviews"],"verbs":["create"]}`,
				`{"apiGroups":["authorization.k8s.io"],"resources":["subjectaccessreviews"],"verbs":["create"]}`,
			} {
				if !strings.Contains(rules, r) {
					t.Errorf("%s %s does not allow %s: %s", m.name, role, r, rules)
				}
			}
		}
	}

	// metrics.certSecret: the Secret mounted read-only where
	// --metrics-cert-dir points, in both workloads.
	hmCert := tl.run(t, nil, tl.helmBin, append(helm, "--set", "metrics.certSecret=localdir-metrics-tls")...)
	for _, id := range []string{"Deployment/localdir/localdir-controller", "DaemonSet/localdir/localdir-node"} {
		spec, _, _ := unstructured.NestedMap(find(t, hmCert, id).Object, "spec", "template", "spec")
		var vol string
		vols, _, _ := unstructured.NestedSlice(spec, "volumes")
		for _, v := range vols {
			v, _ := v.(map[string]any)
			if s, _, _ := unstructured.NestedString(v, "secret", "secretName"); s == "localdir-metrics-tls" {
				vol, _ = v["name"].(string)
			}
		}
		cs, _, _ := unstructured.NestedSlice(spec, "containers")
		for _, c := range cs {
			c, _ := c.(map[string]any)
			if c["name"] != "localdir" {
				continue
			}
			args, _, _ := unstructured.NestedStringSlice(c, "args")
			var dir string
			for _, a := range args {
				if v, ok := strings.CutPrefix(a, "--metrics-cert-dir="); ok {
					dir = v
				}
			}
			mounted := false
			mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
			for _, m := range mounts {
				m, _ := m.(map[string]any)
				mounted = mounted || (vol != "" && m["name"] == vol && m["mountPath"] == dir && m["readOnly"] == true)
			}
			if dir == "" || !mounted {
				t.Errorf("%s with metrics.certSecret: --metrics-cert-dir=%q, Secret volume %q mounted there read-only: %v", id, dir, vol, mounted)
			}
		}
	}
}

// added lists the objects of after that before does not have.
func added(t *testing.T, before, after []byte) []string {
	t.Helper()
	had := objectIDs(t, before)
	return slices.DeleteFunc(objectIDs(t, after), func(id string) bool { return slices.Contains(had, id) })
}

// find returns the object kind/namespace/name of manifests.
func find(t *testing.T, manifests []byte, id string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range decodeAll(t, manifests) {
		if o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName() == id {
			return o
		}
	}
	t.Fatalf("%s is not rendered", id)
	return nil
}

func specJSON(t *testing.T, o *unstructured.Unstructured) string { return fieldJSON(t, o, "spec") }

func rulesJSON(t *testing.T, o *unstructured.Unstructured) string { return fieldJSON(t, o, "rules") }

// fieldJSON is o's top-level field as JSON (keys sorted).
func fieldJSON(t *testing.T, o *unstructured.Unstructured, field string) string {
	t.Helper()
	b, err := json.Marshal(o.Object[field])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
