// Package metrics checks /metrics of the cluster modes against a real
// kube-apiserver (tests/cluster/clustertest): it is served over HTTPS only,
// and a scrape gets the metrics only when the API server authenticates its
// bearer token (TokenReview) and that token's ServiceAccount is bound to
// the localdir-metrics-reader ClusterRole of deploy/kubernetes
// (SubjectAccessReview). The driver makes both reviews as its own
// ServiceAccount, with the RBAC deploy/kubernetes gives it.
package metrics

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	certutil "k8s.io/client-go/util/cert"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// readerRole is the ClusterRole of deploy/kubernetes that allows a scrape.
const readerRole = "localdir-metrics-reader"

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// tokens makes ServiceAccounts in a namespace of their own and returns a
// token (TokenRequest) of each: "reader", bound to readerRole, and
// "stranger", bound to nothing.
func tokens(t *testing.T, env *clustertest.Env) (reader, stranger string) {
	t.Helper()
	ctx := context.Background()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "metrics-scrapers"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, sa := range []string{"reader", "stranger"} {
		if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("token of %s/%s: %v", ns, sa, err)
		}
		out[sa] = tr.Status.Token
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "metrics-scrapers-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "reader", Namespace: ns}},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: readerRole},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return out["reader"], out["stranger"]
}

// client is an HTTPS client that trusts roots, or, when roots is nil,
// accepts any certificate (the driver's self-signed one).
func client(roots *x509.CertPool) *http.Client {
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, InsecureSkipVerify: roots == nil}}
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// get requests url with token as bearer token (none when empty) and
// returns the status code and the body.
func get(t *testing.T, c *http.Client, url, token string) (int, string, error) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// waitServing waits until /metrics on addr answers over HTTPS.
func waitServing(t *testing.T, c *http.Client, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, _, err := get(t, c, "https://"+addr+"/metrics", "")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics on %s does not answer over HTTPS: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkGuarded scrapes https://addr/metrics without a token, with a token
// the API server does not know, as a ServiceAccount without the reader
// role, and as one with it; and over plain HTTP. Only the reader gets the
// metrics, and its body holds want.
func checkGuarded(t *testing.T, c *http.Client, addr, reader, stranger, want string) {
	t.Helper()
	url := "https://" + addr + "/metrics"
	for _, tc := range []struct {
		who, token string
		codes      []int // what the answer may be
	}{
		{"no token", "", []int{http.StatusUnauthorized}},
		// controller-runtime's filter answers 500 ("Authentication failed")
		// when the TokenReview reports an error, as it does for a token it
		// cannot parse; 401 would say it better.
		{"a token the API server did not issue", "not-a-token", []int{http.StatusUnauthorized, http.StatusInternalServerError}},
		{"a ServiceAccount without " + readerRole, stranger, []int{http.StatusForbidden}},
		{"a ServiceAccount bound to " + readerRole, reader, []int{http.StatusOK}},
	} {
		code, body, err := get(t, c, url, tc.token)
		if err != nil {
			t.Errorf("scrape with %s: %v", tc.who, err)
			continue
		}
		if !slices.Contains(tc.codes, code) {
			t.Errorf("scrape with %s: HTTP %d, want %v: %.300s", tc.who, code, tc.codes, body)
		}
		ok := tc.codes[0] == http.StatusOK
		if served := strings.Contains(body, "localdir_"); served != ok {
			t.Errorf("scrape with %s: metrics in the answer: %v: %.300s", tc.who, served, body)
		}
		if ok && !strings.Contains(body, want) {
			t.Errorf("scrape with %s: no %s in:\n%.2000s", tc.who, want, body)
		}
	}
	// Plain HTTP, even with the reader's token, gets no metrics: the TLS
	// listener answers it with 400.
	code, body, err := get(t, http.DefaultClient, "http://"+addr+"/metrics", reader)
	if err == nil && (code != http.StatusBadRequest || strings.Contains(body, "localdir_")) {
		t.Errorf("plain http:// scrape: HTTP %d, want 400 and no metrics: %.300s", code, body)
	}
}

func TestControllerMetricsNeedAReaderToken(t *testing.T) {
	env := clustertest.Start(t)
	reader, stranger := tokens(t, env)
	addr := freeAddr(t)
	p := env.StartController(t, func(o *driver.Options) { o.MetricsAddress = addr })
	// One RPC, so that a localdir_ counter has a series.
	if _, err := p.Identity.GetPluginInfo(context.Background(), &csi.GetPluginInfoRequest{}); err != nil {
		t.Fatal(err)
	}
	c := client(nil)
	waitServing(t, c, addr)
	checkGuarded(t, c, addr, reader, stranger, `localdir_rpc_requests_total{code="OK",method="GetPluginInfo"}`)
}

// The node plugin, run by app.Run as the binary runs it, with the token of
// its DaemonSet's pod: its ClusterRole allows the reviews too.
func TestNodeMetricsNeedAReaderToken(t *testing.T) {
	env := clustertest.Start(t)
	reader, stranger := tokens(t, env)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.Mode, o.NodeID = driver.ModeNode, "node-metrics"
	o.Kubeconfig = env.NodeIdentity(t, o.NodeID).Kubeconfig
	o.MetricsAddress = freeAddr(t)
	runApp(t, o)
	c := client(nil)
	waitServing(t, c, o.MetricsAddress)
	checkGuarded(t, c, o.MetricsAddress, reader, stranger, `localdir_capacity_bytes{node="node-metrics"}`)
}

// runApp runs app.Run(o) until the test ends.
func runApp(t *testing.T, o driver.Options) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("driver: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("driver did not stop within 30s")
		}
	})
}

// writeCert writes a certificate for 127.0.0.1 signed by a new CA, and its
// key, as tls.crt and tls.key into dir, and returns the CA.
func writeCert(t *testing.T, dir string) *x509.CertPool {
	t.Helper()
	crt, key, err := certutil.GenerateSelfSignedCertKey("localdir-metrics.localdir.svc", []net.IP{net.IPv4(127, 0, 0, 1)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// crt holds the certificate, then the CA that signed it.
	leaf, rest := pem.Decode(crt)
	if leaf == nil {
		t.Fatal("no certificate in the generated PEM")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rest) {
		t.Fatal("no CA in the generated PEM")
	}
	// The key first: the driver reloads once both files are a pair.
	for _, f := range []struct {
		name string
		data []byte
	}{{"tls.key", key}, {"tls.crt", crt}} {
		tmp := filepath.Join(dir, "."+f.name)
		if err := os.WriteFile(tmp, f.data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, f.name)); err != nil {
			t.Fatal(err)
		}
	}
	return roots
}

// --metrics-cert-dir: the driver serves the certificate there (a client
// that trusts only its CA verifies it), takes a renewed one without a
// restart, and does not start when the directory holds no key pair.
func TestMetricsCertDir(t *testing.T) {
	env := clustertest.Start(t)
	reader, _ := tokens(t, env)
	certs := t.TempDir()

	t.Run("NoKeyPair", func(t *testing.T) {
		dir := testdriver.TempDir(t)
		o := testdriver.DefaultOptions(dir)
		o.Mode = driver.ModeController
		o.Kubeconfig = env.ControllerIdentity(t).Kubeconfig
		o.MetricsAddress, o.MetricsCertDir = freeAddr(t), certs
		err := app.Run(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "--metrics-cert-dir") || !strings.Contains(err.Error(), "tls.crt") {
			t.Fatalf("app.Run with an empty --metrics-cert-dir = %v, want an error naming the flag and tls.crt", err)
		}
		if _, err := os.Stat(strings.TrimPrefix(o.Endpoint, "unix://")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the CSI socket exists after the failed start (stat: %v)", err)
		}
	})

	first := writeCert(t, certs)
	addr := freeAddr(t)
	env.StartController(t, func(o *driver.Options) { o.MetricsAddress, o.MetricsCertDir = addr, certs })
	waitServing(t, client(nil), addr)
	url := "https://" + addr + "/metrics"
	if code, body, err := get(t, client(first), url, reader); err != nil || code != http.StatusOK || !strings.Contains(body, "localdir_") {
		t.Fatalf("scrape trusting only the CA of --metrics-cert-dir: HTTP %d, %v: %.300s", code, err, body)
	}

	second := writeCert(t, certs)
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, _, err := get(t, client(second), url, reader)
		if err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the renewed certificate is not served 30s after it was written: HTTP %d, %v", code, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	var unknown x509.UnknownAuthorityError
	if _, _, err := get(t, client(first), url, reader); !errors.As(err, &unknown) {
		t.Errorf("scrape trusting only the first CA after the renewal: %v, want an unknown authority error", err)
	}
}
