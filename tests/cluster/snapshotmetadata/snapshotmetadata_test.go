// Package snapshotmetadata checks what the controller publishes for the
// external-snapshot-metadata sidecar (pkg/cluster SnapshotMetadataEndpoint)
// against a real API server, as the controller's ServiceAccount with the
// permissions of deploy/kubernetes: the SnapshotMetadataService named after
// the driver, and the sidecar's certificate in the Secret deploy/ ships
// empty, which a backup tool trusting the object's caCert accepts in a real
// TLS handshake for the Service's name, before and after a renewal.
package snapshotmetadata

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

// deploy/kubernetes' names (snapshot-metadata.yaml, controller.yaml).
const (
	namespace = "localdir"
	secret    = "localdir-snapshot-metadata-tls"
	address   = "localdir-snapshot-metadata.localdir:6443"
	host      = "localdir-snapshot-metadata.localdir"
	driver    = "localdir.csi.dev"
)

func TestSnapshotMetadataServicePublished(t *testing.T) {
	env := clustertest.Start(t)
	ctx := t.Context()
	c := newClient(t, env.ControllerIdentity(t))
	e := cluster.SnapshotMetadataEndpoint{Driver: driver, Namespace: namespace, Secret: secret,
		Address: address, Audience: driver, Lifetime: app.SnapshotMetadataCertLifetime, CertDir: t.TempDir()}

	// Without the CRD: a clear error, and the sidecar gets its
	// certificate all the same (it starts without the object).
	if err := e.Reconcile(ctx, c); !errors.Is(err, cluster.ErrNoSnapshotMetadataCRD) {
		t.Fatalf("Reconcile without the CRD = %v, want ErrNoSnapshotMetadataCRD", err)
	}
	first := readSecret(t, env.Client)
	if len(first.Data[corev1.TLSCertKey]) == 0 || len(first.Data[corev1.TLSPrivateKeyKey]) == 0 {
		t.Fatalf("the Secret holds no certificate and key without the CRD: %v", keysOf(first.Data))
	}
	env.InstallCRDs(t, filepath.Join("testdata", "crd"))

	if err := reconcileSoon(ctx, e, c); err != nil {
		t.Fatal(err)
	}
	sec := readSecret(t, env.Client)
	if sec.ResourceVersion != first.ResourceVersion {
		t.Error("the Secret's fresh certificate was replaced once the CRD came")
	}
	sms := readSMS(t, env.Client)
	if a, _, _ := unstructured.NestedString(sms.Object, "spec", "address"); a != address {
		t.Errorf("spec.address = %q, want %q", a, address)
	}
	if a, _, _ := unstructured.NestedString(sms.Object, "spec", "audience"); a != driver {
		t.Errorf("spec.audience = %q, want %q", a, driver)
	}
	roots := caPool(t, sms)
	handshake(t, sec.Data, roots, host, true)
	handshake(t, sec.Data, roots, "elsewhere.localdir", false)
	sameFiles(t, ctx, e, c, sec.Data)
	cert := leaf(t, sec.Data[corev1.TLSCertKey])
	if left := time.Until(cert.NotAfter); left < app.SnapshotMetadataCertLifetime-time.Hour {
		t.Errorf("the certificate is valid for %s, want about %s", left, app.SnapshotMetadataCertLifetime)
	}

	// Nothing to do: neither object is written again.
	if err := e.Reconcile(ctx, c); err != nil {
		t.Fatal(err)
	}
	if rv := readSecret(t, env.Client).ResourceVersion; rv != sec.ResourceVersion {
		t.Errorf("the Secret was rewritten though its certificate is fresh (resourceVersion %s → %s)", sec.ResourceVersion, rv)
	}
	if rv := readSMS(t, env.Client).GetResourceVersion(); rv != sms.GetResourceVersion() {
		t.Errorf("the SnapshotMetadataService was rewritten though nothing changed (resourceVersion %s → %s)", sms.GetResourceVersion(), rv)
	}

	// The node plugins may not read the sidecar's key.
	nc := newClient(t, env.NodeIdentity(t, "node-a"))
	if err := nc.Get(ctx, client.ObjectKey{Namespace: namespace, Name: secret}, &corev1.Secret{}); !apierrors.IsForbidden(err) {
		t.Errorf("a node plugin reading the Secret: %v, want Forbidden", err)
	}

	t.Run("Renewal", func(t *testing.T) {
		// A certificate with a day left (less than a third of the
		// lifetime), trusted by the object as the sidecar serves it.
		old := expiringPair(t, host, 24*time.Hour)
		sec := readSecret(t, env.Client)
		sec.Data = old
		if err := env.Client.Update(ctx, sec); err != nil {
			t.Fatal(err)
		}
		sms := readSMS(t, env.Client)
		if err := unstructured.SetNestedField(sms.Object, base64.StdEncoding.EncodeToString(old[corev1.TLSCertKey]), "spec", "caCert"); err != nil {
			t.Fatal(err)
		}
		if err := env.Client.Update(ctx, sms); err != nil {
			t.Fatal(err)
		}
		if err := e.Reconcile(ctx, c); err != nil {
			t.Fatal(err)
		}
		renewed := readSecret(t, env.Client).Data
		if string(renewed[corev1.TLSCertKey]) == string(old[corev1.TLSCertKey]) {
			t.Fatal("a certificate with a day left was not renewed")
		}
		roots := caPool(t, readSMS(t, env.Client))
		handshake(t, renewed, roots, host, true)
		sameFiles(t, ctx, e, c, renewed)
		// A sidecar that has not yet seen the new Secret is still trusted.
		handshake(t, old, roots, host, true)
	})

	t.Run("TwoReplicas", func(t *testing.T) {
		// Two controller replicas renewing at once: whatever the Secret
		// holds afterwards, the object trusts it.
		other := newClient(t, env.ControllerIdentity(t))
		for round := range 5 {
			sec := readSecret(t, env.Client)
			sec.Data = expiringPair(t, host, time.Hour)
			if err := env.Client.Update(ctx, sec); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for _, cl := range []client.Client{c, other} {
				wg.Go(func() { _ = reconcileSoon(ctx, e, cl) })
			}
			wg.Wait()
			if err := reconcileSoon(ctx, e, c); err != nil {
				t.Fatal(err)
			}
			handshake(t, readSecret(t, env.Client).Data, caPool(t, readSMS(t, env.Client)), host, true)
			if t.Failed() {
				t.Fatalf("round %d", round)
			}
		}
	})
}

// sameFiles: WriteFiles puts the Secret's key pair into CertDir, where the
// sidecar reads it.
func sameFiles(t *testing.T, ctx context.Context, e cluster.SnapshotMetadataEndpoint, c client.Client, want map[string][]byte) {
	t.Helper()
	if err := e.WriteFiles(ctx, c); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{corev1.TLSCertKey, corev1.TLSPrivateKeyKey} {
		got, err := os.ReadFile(filepath.Join(e.CertDir, k))
		if err != nil || !bytes.Equal(got, want[k]) {
			t.Errorf("%s in the sidecar's directory is not the Secret's (%v)", k, err)
		}
	}
}

func newClient(t *testing.T, id clustertest.Identity) client.Client {
	t.Helper()
	c, err := client.New(id.Config, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// reconcileSoon retries Reconcile for a few seconds: right after the CRD
// is installed the API server's discovery may not list it yet, and a
// replica that lost a race sees a conflict.
func reconcileSoon(ctx context.Context, e cluster.SnapshotMetadataEndpoint, c client.Client) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := e.Reconcile(ctx, c)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func readSecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: namespace, Name: secret}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func readSMS(t *testing.T, c client.Client) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(cluster.SnapshotMetadataServiceGVK)
	if err := c.Get(t.Context(), client.ObjectKey{Name: driver}, u); err != nil {
		t.Fatal(err)
	}
	return u
}

// caPool is what a backup tool trusts: the object's caCert.
func caPool(t *testing.T, sms *unstructured.Unstructured) *x509.CertPool {
	t.Helper()
	b64, _, _ := unstructured.NestedString(sms.Object, "spec", "caCert")
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		t.Fatalf("spec.caCert: %v", err)
	}
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(raw) {
		t.Fatalf("spec.caCert holds no PEM certificate: %q", raw)
	}
	return p
}

// handshake serves TLS on loopback with the Secret's key pair and dials it
// as a backup tool does (roots, server name); ok says whether it must work.
func handshake(t *testing.T, data map[string][]byte, roots *x509.CertPool, serverName string, ok bool) {
	t.Helper()
	pair, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatalf("the Secret's key pair: %v", err)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		conn, err := l.Accept()
		if err == nil {
			_ = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
	}()
	conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: roots, ServerName: serverName})
	if err == nil {
		conn.Close()
	}
	if ok && err != nil {
		t.Errorf("TLS to the sidecar as %s: %v", serverName, err)
	}
	if !ok && err == nil {
		t.Errorf("TLS to the sidecar as %s succeeded, want refused", serverName)
	}
}

func leaf(t *testing.T, certPEM []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(certPEM)
	if b == nil {
		t.Fatalf("no PEM certificate in %q", certPEM)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// expiringPair is a self-signed key pair for host with left to live.
func expiringPair(t *testing.T, host string, left time.Duration) map[string][]byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: host},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(left), DNSNames: []string{host},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return map[string][]byte{
		corev1.TLSCertKey:       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		corev1.TLSPrivateKeyKey: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}),
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
