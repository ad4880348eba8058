//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The scraper of these tests: a ServiceAccount bound to the
// localdir-metrics-reader ClusterRole that deploy/ (and the chart) install,
// as a Prometheus's would be. It lives in "default", which outlasts the
// reinstalls of TestHelmInstall; the binding names the role, which both
// installs create under the same name.
const (
	scraperNamespace = "default"
	scraperAccount   = "e2e-metrics-scraper"
	readerRole       = "localdir-metrics-reader"
)

// scraper holds its token (kubectl create token), renewed well before the
// hour it is valid for.
var scraper struct {
	sync.Mutex
	token string
	at    time.Time
}

// scraperToken returns a token of scraperAccount, creating the account and
// its binding on first use.
func scraperToken(t testing.TB) string {
	t.Helper()
	scraper.Lock()
	defer scraper.Unlock()
	if scraper.token != "" && time.Since(scraper.at) < 30*time.Minute {
		return scraper.token
	}
	ctx := context.Background()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: scraperAccount, Namespace: scraperNamespace}}
	if _, err := kc.CoreV1().ServiceAccounts(scraperNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: scraperAccount},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: scraperAccount, Namespace: scraperNamespace}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: readerRole},
	}
	if _, err := kc.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tok, err := cl.Kubectl(ctx, "", "create", "token", scraperAccount, "-n", scraperNamespace)
	if err != nil {
		t.Fatal(err)
	}
	scraper.token, scraper.at = tok, time.Now()
	return tok
}

// metricsClient speaks HTTPS to the driver's self-signed certificate
// (deploy/ gives it no --metrics-cert-dir).
var metricsClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}

// getMetrics requests url with token as bearer token (none when empty).
func getMetrics(url, token string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := metricsClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// scrapeMetrics reads a /metrics page, over HTTPS as the scraper, into
// "name{labels}" → value: the localdir_ series and the node agent's
// controller-runtime ones (controller_runtime_, workqueue_).
func scrapeMetrics(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	code, body, err := getMetrics("https://"+addr+"/metrics", scraperToken(t))
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	if code != http.StatusOK {
		t.Fatalf("scrape %s as %s/%s: HTTP %d: %.300s", addr, scraperNamespace, scraperAccount, code, body)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "localdir_") && !strings.HasPrefix(line, "controller_runtime_") && !strings.HasPrefix(line, "workqueue_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// TestMetricsAndUnplaceablePVC scrapes the controller's and the node
// plugin's /metrics while volumes are created and one cannot be placed:
// the RPC, capacity and error series move, the node agent's reconcile
// and work queue series count the new volume, and the PVC that does not
// fit carries an event saying why. The pods serve /metrics over HTTPS to
// a token bound to localdir-metrics-reader only: without a token (401),
// with one of a ServiceAccount not bound to it (403) and over plain HTTP
// (400) there are no metrics.
func TestMetricsAndUnplaceablePVC(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "metrics")
	// On the first node (a class pinned to it), whose metrics are read.
	on := cl.Nodes[0]
	// The pods' IPs: deploy/ serves metrics on port 9810 of each pod.
	ctx := context.Background()
	ctrlAddr, err := cl.ControllerMetricsAddress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nodeAddr, err := on.MetricsAddress(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Only the scraper reads them: no token, a ServiceAccount the reader
	// role is not bound to, and plain HTTP get no metrics.
	stranger, err := cl.Kubectl(ctx, "", "create", "token", "default", "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{ctrlAddr, nodeAddr} {
		for _, tc := range []struct {
			who, token string
			code       int
		}{{"no token", "", http.StatusUnauthorized}, {ns + "/default", stranger, http.StatusForbidden}} {
			code, body, err := getMetrics("https://"+addr+"/metrics", tc.token)
			if err != nil || code != tc.code || strings.Contains(body, "localdir_") {
				t.Errorf("scrape %s with %s: HTTP %d, %v, want %d and no metrics: %.300s", addr, tc.who, code, err, tc.code, body)
			}
		}
		if code, body, err := getMetrics("http://"+addr+"/metrics", scraperToken(t)); err == nil && (code != http.StatusBadRequest || strings.Contains(body, "localdir_")) {
			t.Errorf("plain http:// scrape of %s: HTTP %d, want 400 and no metrics: %.300s", addr, code, body)
		}
	}
	ctrlBefore := scrapeMetrics(t, ctrlAddr)
	nodeBefore := scrapeMetrics(t, nodeAddr)
	okKey := `localdir_rpc_requests_total{code="OK",method="CreateVolume"}`
	exhaustedKey := `localdir_rpc_requests_total{code="ResourceExhausted",method="CreateVolume"}`
	allocKey := `localdir_allocatable_bytes{node="` + on.Name + `"}`
	reconciledKey := `controller_runtime_reconcile_total{controller="localvolume",result="success"}`
	queuedKey := `workqueue_queue_duration_seconds_count{controller="localvolume",name="localvolume"}`

	createPVC(t, ns, "fits", pinnedClass(t, scImmediate, on.Name), "64Mi")
	waitBound(t, ns, "fits", time.Minute)
	// Far larger than the node's capacity: no node can take it.
	createPVC(t, ns, "too-big", scImmediate, "1Ti")
	var why string
	waitFor(t, "the ProvisioningFailed event of the PVC that does not fit", 2*time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "PersistentVolumeClaim", "too-big") {
			if strings.Contains(e, "ProvisioningFailed") && strings.Contains(e, "not enough capacity") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("event on the PVC that cannot be placed: %s", why)
	for _, n := range cl.Nodes {
		if !strings.Contains(why, n.Name) {
			t.Errorf("the event does not name node %s: %s", n.Name, why)
		}
	}
	if !strings.Contains(why, "free space on a node, pick a smaller size, or add nodes") {
		t.Errorf("the event does not say what to change: %s", why)
	}

	var ctrlAfter, nodeAfter map[string]float64
	waitFor(t, "the metrics to show the new volume and the failure", time.Minute, func() (bool, error) {
		ctrlAfter = scrapeMetrics(t, ctrlAddr)
		nodeAfter = scrapeMetrics(t, nodeAddr)
		return ctrlAfter[okKey] > ctrlBefore[okKey] && ctrlAfter[exhaustedKey] > ctrlBefore[exhaustedKey] &&
			nodeAfter[allocKey] <= nodeBefore[allocKey]-64<<20 &&
			nodeAfter[reconciledKey] > nodeBefore[reconciledKey] && nodeAfter[queuedKey] > nodeBefore[queuedKey], nil
	})
	depth := false
	for k := range nodeAfter {
		depth = depth || strings.HasPrefix(k, `workqueue_depth{controller="localvolume",`)
	}
	if !depth {
		t.Errorf("the node plugin serves no work queue depth of its LocalVolume reconciler")
	}
	for _, n := range cl.Nodes {
		if ctrlAfter[`localdir_capacity_bytes{node="`+n.Name+`"}`] <= 0 {
			t.Errorf("controller reports no capacity for node %s", n.Name)
		}
	}
	if ctrlAfter[`localdir_volumes{node="`+on.Name+`",phase="Ready"}`] < 1 {
		t.Errorf("controller reports no Ready volume on %s", on.Name)
	}
	t.Logf("CreateVolume OK %v→%v, ResourceExhausted %v→%v; node allocatable %v→%v; node LocalVolume reconciles %v→%v",
		ctrlBefore[okKey], ctrlAfter[okKey], ctrlBefore[exhaustedKey], ctrlAfter[exhaustedKey], nodeBefore[allocKey], nodeAfter[allocKey],
		nodeBefore[reconciledKey], nodeAfter[reconciledKey])
}
