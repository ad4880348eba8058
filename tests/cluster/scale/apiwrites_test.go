package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/cpustat"
	"github.com/localdir-csi/localdir/tests/csitest"
)

// BenchmarkAPIWrites measures what each of the writes a LocalVolume's life
// costs in cluster mode takes of kube-apiserver's CPU (/proc/<pid>/stat,
// tests/cpustat), in milliseconds per request: the controller's create, the node plugin's
// status update, the controller's delete intent (a merge patch of
// spec.deleteData) and the node plugin's delete (with a UID
// precondition), LOCALDIR_APICOST_VOLUMES (default 1,000) of each, 32 at
// once, with two watches open as the controller's and the node plugin's
// informers. It runs with the CRDs of deploy/kubernetes/crds and again
// with their CEL validation rules (x-kubernetes-validations) taken out,
// which prices those rules. With LOCALDIR_APICOST_PROF set to a folder,
// it also saves a 4-second kube-apiserver CPU profile
// (/debug/pprof/profile) of each kind of request there. Figures:
// docs/benchmarks.md.
func BenchmarkAPIWrites(b *testing.B) {
	n := envCount(b, "LOCALDIR_APICOST_VOLUMES", 1000)
	for _, crds := range []string{"crds", "crds-without-cel"} {
		b.Run(crds, func(b *testing.B) {
			for range b.N {
				apiWrites(b, n, crds)
			}
		})
	}
}

func apiWrites(b *testing.B, n int, crds string) {
	ctx := context.Background()
	var env *clustertest.Env
	if crds == "crds-without-cel" {
		env = clustertest.StartWithCRDs(b, withoutCEL(b))
	} else {
		env = clustertest.Start(b)
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: env.Client.Scheme()})
	if err != nil {
		b.Fatal(err)
	}
	// The controller watches every LocalVolume, a node plugin its own.
	for _, o := range []client.ListOption{client.MatchingLabels{}, client.MatchingLabels{v1.NodeLabel: scaleNode}} {
		w, err := wc.Watch(ctx, &v1.LocalVolumeList{}, o)
		if err != nil {
			b.Fatal(err)
		}
		go func() {
			for range w.ResultChan() {
			}
		}()
		b.Cleanup(w.Stop)
	}
	prof, err := profiler(env.Config)
	if err != nil {
		b.Fatal(err)
	}
	c := env.Client
	lvs := make([]*v1.LocalVolume, n)
	for i := range lvs {
		name := fmt.Sprintf("pvc-%08d-0000-4000-8000-000000000000", i)
		lvs[i] = &v1.LocalVolume{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: scaleNode}},
			Spec:       v1.LocalVolumeSpec{Node: scaleNode, Size: resource.MustParse("1Mi"), CSIName: name, Engine: "btrfs"},
		}
	}
	for _, step := range []struct {
		what string
		do   func(lv *v1.LocalVolume) error
	}{
		{"create", func(lv *v1.LocalVolume) error { return c.Create(ctx, lv) }},
		{"status", func(lv *v1.LocalVolume) error {
			lv.Status = v1.LocalVolumeStatus{Phase: v1.PhaseReady, CapacityBytes: lv.Spec.Size, Path: "/var/lib/localdir/volumes/" + lv.Name,
				ObservedGeneration: lv.Generation, Conditions: []metav1.Condition{{Type: v1.ConditionReady, Status: metav1.ConditionTrue,
					Reason: "Created", Message: "the volume's data exists", LastTransitionTime: metav1.Now()}}}
			return c.Status().Update(ctx, lv)
		}},
		{"intent", func(lv *v1.LocalVolume) error {
			patch := client.MergeFrom(lv.DeepCopy())
			lv.Spec.DeleteData = true
			return c.Patch(ctx, lv, patch)
		}},
		{"delete", func(lv *v1.LocalVolume) error {
			return c.Delete(ctx, lv, client.Preconditions{UID: &lv.UID})
		}},
	} {
		saved := make(chan error, 1)
		if dir := os.Getenv("LOCALDIR_APICOST_PROF"); dir != "" {
			go func() { saved <- prof(ctx, filepath.Join(dir, crds+"-"+step.what+".pprof")) }()
		} else {
			saved <- nil
		}
		cpu0, t0 := cpustat.Read(b), time.Now()
		csitest.Each(b, n, 32, func(i int) error { return step.do(lvs[i]) })
		cpu, took := cpustat.Read(b)["kube-apiserver"]-cpu0["kube-apiserver"], time.Since(t0)
		if err := <-saved; err != nil {
			b.Fatal(err)
		}
		fmt.Printf("APIWRITES %-16s %-6s kube-apiserver %5.2f ms CPU per request, %4.0f requests/s\n",
			crds, step.what, cpu*1000/float64(n), float64(n)/took.Seconds())
		b.ReportMetric(cpu*1000/float64(n), step.what+"-cpu-ms")
	}
}

// withoutCEL writes the CRDs of deploy/kubernetes/crds without their
// x-kubernetes-validations rules into a temporary folder.
func withoutCEL(b *testing.B) string {
	dir := b.TempDir()
	src := clustertest.CRDDir(b)
	ents, err := os.ReadDir(src)
	if err != nil {
		b.Fatal(err)
	}
	for _, e := range ents {
		raw, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			b.Fatal(err)
		}
		crd := &apiextv1.CustomResourceDefinition{}
		if err := yaml.Unmarshal(raw, crd); err != nil {
			b.Fatal(err)
		}
		for i := range crd.Spec.Versions {
			dropRules(crd.Spec.Versions[i].Schema.OpenAPIV3Schema)
		}
		out, err := yaml.Marshal(crd)
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), out, 0o600); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

func dropRules(s *apiextv1.JSONSchemaProps) {
	if s == nil {
		return
	}
	s.XValidations = nil
	for k, p := range s.Properties {
		dropRules(&p)
		s.Properties[k] = p
	}
	if s.Items != nil {
		dropRules(s.Items.Schema)
	}
	if s.AdditionalProperties != nil {
		dropRules(s.AdditionalProperties.Schema)
	}
}

// profiler returns a function that saves a 4-second CPU profile of the API
// server of cfg into a file.
func profiler(cfg *rest.Config) (func(ctx context.Context, file string) error, error) {
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, file string) error {
		raw, err := kc.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").Param("seconds", "4").DoRaw(ctx)
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		return os.WriteFile(file, raw, 0o600)
	}, nil
}
