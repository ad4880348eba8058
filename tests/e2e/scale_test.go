//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/localdir-csi/localdir/tests/cpustat"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// Binding many PVCs at once: TestScale100PVCs (make e2e) and the
// BenchmarkCluster runs (make bench-cluster) share this measurement.

// scaleRun is the outcome of one bindMany.
type scaleRun struct {
	n                       int
	allBound, p50, p99, max time.Duration // from the first create
	deleted                 time.Duration // from the delete of the PVCs until their PVs are gone
	create, remove          apiRequests   // API requests during the bind and the delete
	// The localdir controller's CreateVolume and DeleteVolume latencies
	// during the run (its localdir_rpc_duration_seconds): the driver's
	// share of the time; no calls for the floor.
	createRPC, deleteRPC rpcLatency
	// The node plugins' LocalVolume work queue during the bind and the
	// delete: how long volumes waited for one of its workers.
	createQueue, removeQueue nodeQueue
	// CPU time of this machine's processes during the bind and the delete.
	createCPU, removeCPU cpustat.Seconds
}

// nodeQueue is the node plugins' LocalVolume work between two scrapes of
// each (controller-runtime's series, summed over the nodes): items taken
// from the queue, their mean wait in it, and the mean reconcile time.
type nodeQueue struct {
	items      float64
	wait, work time.Duration
}

func (q nodeQueue) String() string {
	if q.items <= 0 {
		return "no work"
	}
	return fmt.Sprintf("%.0f items, mean wait in the queue %s, mean reconcile %s", q.items, q.wait.Round(100*time.Microsecond), q.work.Round(100*time.Microsecond))
}

// nodesMetrics scrapes every node plugin's /metrics.
func nodesMetrics(tb testing.TB) []map[string]float64 {
	tb.Helper()
	var out []map[string]float64
	for _, n := range cl.Nodes {
		addr, err := n.MetricsAddress(context.Background())
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, scrapeMetrics(tb, addr))
	}
	return out
}

// nodeQueueOf is the nodeQueue between the scrapes before and after.
func nodeQueueOf(before, after []map[string]float64) nodeQueue {
	const queue, ctrl = `{controller="localvolume",name="localvolume"}`, `{controller="localvolume"}`
	var items, wait, reconciles, work float64
	for i := range after {
		d := func(k string) float64 { return after[i][k] - before[i][k] }
		items += d("workqueue_queue_duration_seconds_count" + queue)
		wait += d("workqueue_queue_duration_seconds_sum" + queue)
		reconciles += d("controller_runtime_reconcile_time_seconds_count" + ctrl)
		work += d("controller_runtime_reconcile_time_seconds_sum" + ctrl)
	}
	var q nodeQueue
	q.items = items
	if items > 0 {
		q.wait = time.Duration(wait / items * float64(time.Second))
	}
	if reconciles > 0 {
		q.work = time.Duration(work / reconciles * float64(time.Second))
	}
	return q
}

// rpcLatency summarizes the calls of one CSI method between two scrapes of
// localdir_rpc_duration_seconds: how many, their mean, and the upper
// bounds of the histogram buckets holding the median and the 99th
// percentile.
type rpcLatency struct {
	calls          float64
	mean, p50, p99 time.Duration
}

func (l rpcLatency) String() string {
	if l.calls == 0 {
		return "no calls"
	}
	return fmt.Sprintf("%.0f calls, mean %s, p50 ≤ %s, p99 ≤ %s", l.calls, l.mean.Round(100*time.Microsecond), l.p50, l.p99)
}

// rpcLatencyOf is method's rpcLatency from the scrapes before and after.
func rpcLatencyOf(before, after map[string]float64, method string) rpcLatency {
	sel := `{method="` + method + `"}`
	var l rpcLatency
	l.calls = after["localdir_rpc_duration_seconds_count"+sel] - before["localdir_rpc_duration_seconds_count"+sel]
	if l.calls <= 0 {
		return rpcLatency{}
	}
	l.mean = time.Duration((after["localdir_rpc_duration_seconds_sum"+sel] - before["localdir_rpc_duration_seconds_sum"+sel]) / l.calls * float64(time.Second))
	type bucket struct{ le, n float64 }
	var buckets []bucket
	prefix := `localdir_rpc_duration_seconds_bucket{method="` + method + `",le="`
	for k, v := range after {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		le, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(k, prefix), `"}`), 64)
		if err == nil {
			buckets = append(buckets, bucket{le, v - before[k]})
		}
	}
	sort.Slice(buckets, func(i, j int) bool { return buckets[i].le < buckets[j].le })
	at := func(q float64) time.Duration {
		for _, b := range buckets {
			if b.n >= q*l.calls {
				return time.Duration(b.le * float64(time.Second))
			}
		}
		return 0
	}
	l.p50, l.p99 = at(0.5), at(0.99)
	return l
}

// controllerMetrics scrapes the localdir controller pod's /metrics.
func controllerMetrics(tb testing.TB) map[string]float64 {
	tb.Helper()
	addr, err := cl.ControllerMetricsAddress(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	return scrapeMetrics(tb, addr)
}

// apiRequests are kube-apiserver's apiserver_request_total counters by
// "verb resource[/subresource]" and API group.
type apiRequests map[[2]string]float64

// localdirGroup is the API group of LocalVolume, LocalSnapshot, LocalNode.
const localdirGroup = "localdir.csi.dev"

// readAPIRequests reads apiserver_request_total from kube-apiserver's
// /metrics (the admin user may).
func readAPIRequests(tb testing.TB) apiRequests {
	tb.Helper()
	raw, err := kc.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(string(raw)))
	if err != nil {
		tb.Fatal(err)
	}
	out := apiRequests{}
	for _, m := range fams["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		what := strings.ToLower(l["verb"]) + " " + l["resource"]
		if l["subresource"] != "" {
			what += "/" + l["subresource"]
		}
		out[[2]string{what, l["group"]}] += m.GetCounter().GetValue()
	}
	return out
}

// since returns the requests counted after before.
func (a apiRequests) since(before apiRequests) apiRequests {
	out := apiRequests{}
	for k, v := range a {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// total sums the requests of group ("" = every group).
func (a apiRequests) total(group string) float64 {
	var n float64
	for k, v := range a {
		if group == "" || k[1] == group {
			n += v
		}
	}
	return n
}

// perVolume lists group's requests per volume, e.g. "create localvolumes
// 1.00, update localvolumes/status 1.00".
func (a apiRequests) perVolume(group string, n int) string {
	var parts []string
	for k, v := range a {
		if k[1] == group {
			parts = append(parts, fmt.Sprintf("%s %.2f", k[0], v/float64(n)))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// bindMany creates n PVCs of 1Mi of class in ns at once (with a pod each,
// mounting it, when pods), waits until all are Bound, calls afterBind (if
// not nil), then deletes them (the pods first, unmeasured) and waits until
// their PVs are gone.
func bindMany(tb testing.TB, ns, class string, n int, pods bool, afterBind func()) scaleRun {
	tb.Helper()
	ctx := context.Background()
	r := scaleRun{n: n}
	// An informer on the namespace's PVCs notes when each is first seen
	// Bound (it re-lists and re-watches on its own if a watch ends).
	var mu sync.Mutex
	boundAt := map[string]time.Time{}
	allBound := make(chan struct{})
	inf := informers.NewSharedInformerFactoryWithOptions(kc, 0, informers.WithNamespace(ns)).Core().V1().PersistentVolumeClaims().Informer()
	note := func(o any) {
		p, ok := o.(*corev1.PersistentVolumeClaim)
		if !ok || p.Status.Phase != corev1.ClaimBound {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if _, seen := boundAt[p.Name]; !seen {
			boundAt[p.Name] = time.Now()
			if len(boundAt) == n {
				close(allBound)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note, UpdateFunc: func(_, o any) { note(o) }}); err != nil {
		tb.Fatal(err)
	}
	stop := make(chan struct{})
	defer close(stop)
	go inf.Run(stop)
	if !cache.WaitForCacheSync(stop, inf.HasSynced) {
		tb.Fatal("the PVC informer never synced")
	}
	before := readAPIRequests(tb)
	rpcBefore := controllerMetrics(tb)
	nodesBefore := nodesMetrics(tb)
	cpuBefore := cpustat.Read(tb)
	created := make([]time.Time, n)
	t0 := time.Now()
	csitest.Each(tb, n, 50, func(i int) error {
		name := fmt.Sprintf("pvc-%04d", i)
		p := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.PersistentVolumeClaimSpec{
			StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Mi")}}}}
		created[i] = time.Now() // the create request is sent
		if _, err := kc.CoreV1().PersistentVolumeClaims(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			return err
		}
		if pods {
			return createScalePod(ctx, ns, fmt.Sprintf("pod-%04d", i), name)
		}
		return nil
	})
	select {
	case <-allBound:
	case <-time.After(10 * time.Minute):
		mu.Lock()
		defer mu.Unlock()
		tb.Fatalf("%d of %d PVCs Bound after 10 minutes", len(boundAt), n)
	}
	r.createCPU = cpustat.Read(tb).Since(cpuBefore)
	r.create = readAPIRequests(tb).since(before)
	rpcAfter := controllerMetrics(tb)
	r.createRPC = rpcLatencyOf(rpcBefore, rpcAfter, "CreateVolume")
	r.createQueue = nodeQueueOf(nodesBefore, nodesMetrics(tb))
	mu.Lock()
	var lat []time.Duration
	for name, at := range boundAt {
		r.allBound = max(r.allBound, at.Sub(t0))
		var i int
		if _, err := fmt.Sscanf(name, "pvc-%d", &i); err != nil {
			tb.Fatal(err)
		}
		lat = append(lat, at.Sub(created[i]))
	}
	mu.Unlock()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1)+0.5)] }
	r.p50, r.p99, r.max = pct(0.50), pct(0.99), lat[len(lat)-1]
	if afterBind != nil {
		afterBind()
	}

	if pods {
		// Not forced: a pod is gone once its kubelet unmounted its volume.
		one := int64(1)
		if err := kc.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &one}, metav1.ListOptions{}); err != nil {
			tb.Fatal(err)
		}
		waitFor(tb, "the pods of "+ns+" to be gone", 10*time.Minute, func() (bool, error) {
			l, err := kc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, retryTransient(tb, err)
			}
			return len(l.Items) == 0, nil
		})
	}
	before = readAPIRequests(tb)
	rpcBefore = controllerMetrics(tb)
	nodesBefore = nodesMetrics(tb)
	cpuBefore = cpustat.Read(tb)
	t1 := time.Now()
	if err := kc.CoreV1().PersistentVolumeClaims(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		tb.Fatal(err)
	}
	waitFor(tb, "all PVs of "+ns+" deleted", 10*time.Minute, func() (bool, error) {
		pvs, err := kc.CoreV1().PersistentVolumes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, retryTransient(tb, err)
		}
		for _, pv := range pvs.Items {
			if pv.Spec.ClaimRef != nil && pv.Spec.ClaimRef.Namespace == ns {
				return false, nil
			}
		}
		return true, nil
	})
	r.deleted = time.Since(t1)
	r.removeCPU = cpustat.Read(tb).Since(cpuBefore)
	r.remove = readAPIRequests(tb).since(before)
	r.deleteRPC = rpcLatencyOf(rpcBefore, controllerMetrics(tb), "DeleteVolume")
	r.removeQueue = nodeQueueOf(nodesBefore, nodesMetrics(tb))
	return r
}

// createScalePod creates a pod that mounts claim and does nothing (the
// pause image: the least a kubelet can start).
func createScalePod(ctx context.Context, ns, name, claim string) error {
	grace := int64(0)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: &grace,
			Containers:                    []corev1.Container{{Name: "app", Image: harness.PauseImage, ImagePullPolicy: corev1.PullIfNotPresent, VolumeMounts: []corev1.VolumeMount{{Name: "v", MountPath: "/data"}}}},
			Volumes:                       []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	_, err := kc.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
	return err
}

// report prints r as a line of docs/benchmarks.md's cluster table.
func (r scaleRun) report(tb testing.TB, what string) {
	tb.Logf("SCALE %s: %d PVCs all Bound in %.2fs (p50 %.2fs, p99 %.2fs, max %.2fs); all PVs deleted in %.2fs",
		what, r.n, r.allBound.Seconds(), r.p50.Seconds(), r.p99.Seconds(), r.max.Seconds(), r.deleted.Seconds())
	tb.Logf("SCALE %s: API requests per volume: bind %.1f (localdir objects %.2f: %s), delete %.1f (localdir objects %.2f: %s)",
		what, r.create.total("")/float64(r.n), r.create.total(localdirGroup)/float64(r.n), r.create.perVolume(localdirGroup, r.n),
		r.remove.total("")/float64(r.n), r.remove.total(localdirGroup)/float64(r.n), r.remove.perVolume(localdirGroup, r.n))
	tb.Logf("SCALE %s: localdir controller: CreateVolume %s; DeleteVolume %s", what, r.createRPC, r.deleteRPC)
	tb.Logf("SCALE %s: localdir node plugins, LocalVolume queue: bind %s; delete %s", what, r.createQueue, r.removeQueue)
	tb.Logf("SCALE %s: CPU during the bind %s", what, r.createCPU)
	tb.Logf("SCALE %s: CPU during the delete %s", what, r.removeCPU)
}

// 10. Scale: TestScale100PVCs binds 100 PVCs of an Immediate class at once: every one
// is Bound with a LocalVolume, and deleting them removes every PV. Its
// timings are printed (SCALE), not asserted; make bench-cluster measures
// them against the control plane's floor.
func TestScale100PVCs(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "scale")
	const n = 100
	var lvs int
	r := bindMany(t, ns, scImmediate, n, false, func() {
		l, err := dyn.Resource(gvrLocalVolume).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		lvs = len(l.Items)
	})
	if lvs < n {
		t.Fatalf("%d LocalVolumes for %d Bound PVCs", lvs, n)
	}
	r.report(t, "localdir, Immediate")
}
