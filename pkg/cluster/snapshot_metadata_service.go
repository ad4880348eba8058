package cluster

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
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Kubernetes backup tools reach changed block tracking through the
// external-snapshot-metadata sidecar in the controller pod: they find it by
// the cluster-scoped SnapshotMetadataService object named after the driver
// (its address, the CA that signs the sidecar's TLS certificate, and the
// audience of the tokens they present), and the sidecar serves TLS with the
// certificate in a Secret (tls.crt, tls.key). SnapshotMetadataEndpoint keeps
// both: the Secret (shipped empty by deploy/, so the controller needs no
// right to create Secrets) holds a self-signed certificate for the
// address's host, renewed once a third of its lifetime is left; the
// object's caCert holds that certificate and, until they expire, the ones
// it replaced, so a sidecar still serving a replaced one (each replica
// copies the Secret into its pod's CertDir only at its next pass) is still
// trusted. No CA key is kept anywhere.

// SnapshotMetadataServiceGVK is the SnapshotMetadataService kind the
// external-snapshot-metadata sidecar v1.x reads.
var SnapshotMetadataServiceGVK = schema.GroupVersionKind{Group: "cbt.storage.k8s.io", Version: "v1beta1", Kind: "SnapshotMetadataService"}

// caBundleMax bounds the certificates kept in caCert (the current one and
// those it replaced that are still valid).
const caBundleMax = 4

// SnapshotMetadataEndpoint is what the controller publishes for the sidecar.
type SnapshotMetadataEndpoint struct {
	Driver    string // the SnapshotMetadataService's name
	Namespace string // the Secret's
	Secret    string
	Address   string // host:port backup tools dial (the sidecar's Service)
	Audience  string
	Lifetime  time.Duration // of a certificate
	// CertDir, when set, gets the Secret's tls.crt and tls.key after each
	// pass: a directory the sidecar shares with the controller (an
	// emptyDir), current within seconds of the controller's start, where
	// a mounted Secret lags by up to a minute. A sidecar started before
	// the first copy exits and is restarted by the kubelet.
	CertDir string
}

// Run reconciles at once and then every interval until ctx ends; a failed
// pass (logged) is retried after 2 s, doubling up to every.
func (e SnapshotMetadataEndpoint) Run(ctx context.Context, c client.Client, every time.Duration) {
	var last string
	retry := 2 * time.Second
	for {
		err := e.Reconcile(ctx, c)
		if err == nil || errors.Is(err, ErrNoSnapshotMetadataCRD) {
			err = errors.Join(err, e.WriteFiles(ctx, c))
		}
		wait := every
		if err != nil {
			if err.Error() != last {
				klog.ErrorS(err, "Publishing the SnapshotMetadata service failed; retried", "in", retry)
			}
			last, wait, retry = err.Error(), retry, min(2*retry, every)
		} else {
			last, retry = "", 2*time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// ErrNoSnapshotMetadataCRD: the SnapshotMetadataService CRD is not installed.
var ErrNoSnapshotMetadataCRD = errors.New("the SnapshotMetadataService CRD (cbt.storage.k8s.io) is not installed: backup tools cannot find the SnapshotMetadata service")

// Reconcile makes the Secret hold a usable certificate and the
// SnapshotMetadataService name the address, the audience and every valid
// certificate the sidecar may serve. The object is written before the
// Secret, so a new certificate is trusted before it is served; a write that
// lost a race with another replica fails (conflict) and the next tick
// starts again from what that replica wrote.
func (e SnapshotMetadataEndpoint) Reconcile(ctx context.Context, c client.Client) error {
	host, _, err := net.SplitHostPort(e.Address)
	if err != nil {
		return fmt.Errorf("snapshot metadata address %q: %w", e.Address, err)
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Secret}, sec); err != nil {
		return fmt.Errorf("read Secret %s/%s (deploy/ makes it): %w", e.Namespace, e.Secret, err)
	}
	now := time.Now()
	served, _ := servingCert(sec.Data, host, now) // nil: none, or not for host
	current := served
	fresh := current != nil && current.NotAfter.Sub(now) > e.Lifetime/3
	var certPEM, keyPEM []byte
	if !fresh {
		if certPEM, keyPEM, err = serviceCert(host, now, e.Lifetime); err != nil {
			return err
		}
		if current, err = parsePEMCert(certPEM); err != nil {
			return err
		}
	}

	sms := &unstructured.Unstructured{}
	sms.SetGroupVersionKind(SnapshotMetadataServiceGVK)
	err = c.Get(ctx, client.ObjectKey{Name: e.Driver}, sms)
	missing := apierrors.IsNotFound(err)
	switch {
	case meta.IsNoMatchError(err) || (missing && isNoResource(err)):
		// No object to keep in step: the sidecar still gets its
		// certificate (it starts without the object and looks it up per
		// call), and the object is made with it once the CRD is there.
		if !fresh {
			if err := e.writeSecret(ctx, c, sec, certPEM, keyPEM, current); err != nil {
				return err
			}
		}
		return ErrNoSnapshotMetadataCRD
	case err != nil && !missing:
		return fmt.Errorf("read SnapshotMetadataService %s: %w", e.Driver, err)
	}
	oldBundle, _, _ := unstructured.NestedString(sms.Object, "spec", "caCert")
	bundle := caBundle(current, served, oldBundle, now)
	spec := map[string]any{"address": e.Address, "audience": e.Audience, "caCert": base64.StdEncoding.EncodeToString(bundle)}
	if missing {
		sms = &unstructured.Unstructured{}
		sms.SetGroupVersionKind(SnapshotMetadataServiceGVK)
		sms.SetName(e.Driver)
		sms.SetLabels(map[string]string{"app.kubernetes.io/name": "localdir", "app.kubernetes.io/component": "controller"})
		sms.Object["spec"] = spec
		sms.SetOwnerReferences(e.owner(ctx, c))
		if err := c.Create(ctx, sms); err != nil {
			return fmt.Errorf("create SnapshotMetadataService %s: %w", e.Driver, err)
		}
		klog.InfoS("Created the SnapshotMetadataService", "name", e.Driver, "address", e.Address, "audience", e.Audience)
	} else if old, _, _ := unstructured.NestedMap(sms.Object, "spec"); !sameSpec(old, spec) || len(sms.GetOwnerReferences()) == 0 {
		sms.Object["spec"] = spec
		if len(sms.GetOwnerReferences()) == 0 {
			sms.SetOwnerReferences(e.owner(ctx, c))
		}
		if err := c.Update(ctx, sms); err != nil {
			return fmt.Errorf("update SnapshotMetadataService %s: %w", e.Driver, err)
		}
		klog.InfoS("Updated the SnapshotMetadataService", "name", e.Driver, "address", e.Address, "audience", e.Audience)
	}
	if fresh {
		return nil
	}
	return e.writeSecret(ctx, c, sec, certPEM, keyPEM, current)
}

// writeSecret puts a new certificate and key into sec (as read: a replica
// that wrote it since makes this a conflict).
func (e SnapshotMetadataEndpoint) writeSecret(ctx context.Context, c client.Client, sec *corev1.Secret, certPEM, keyPEM []byte, cert *x509.Certificate) error {
	sec.Data = map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM, "ca.crt": certPEM}
	if err := c.Update(ctx, sec); err != nil {
		return fmt.Errorf("update Secret %s/%s: %w", e.Namespace, e.Secret, err)
	}
	klog.InfoS("New TLS certificate for the snapshot metadata sidecar", "secret", e.Namespace+"/"+e.Secret, "names", cert.DNSNames, "notAfter", cert.NotAfter)
	return nil
}

// WriteFiles copies the Secret's certificate and key into CertDir when
// they are usable and differ from what is there, each file replaced whole
// (the sidecar reloads them when they change).
func (e SnapshotMetadataEndpoint) WriteFiles(ctx context.Context, c client.Client) error {
	if e.CertDir == "" {
		return nil
	}
	host, _, err := net.SplitHostPort(e.Address)
	if err != nil {
		return err
	}
	sec := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: e.Namespace, Name: e.Secret}, sec); err != nil {
		return fmt.Errorf("read Secret %s/%s: %w", e.Namespace, e.Secret, err)
	}
	if _, err := servingCert(sec.Data, host, time.Now()); err != nil {
		return fmt.Errorf("the Secret %s/%s holds no usable certificate yet: %w", e.Namespace, e.Secret, err)
	}
	// The key first: a sidecar that sees the new certificate finds its key.
	for _, k := range []string{corev1.TLSPrivateKeyKey, corev1.TLSCertKey} {
		p := filepath.Join(e.CertDir, k)
		if old, err := os.ReadFile(p); err == nil && bytes.Equal(old, sec.Data[k]) {
			continue
		}
		tmp := p + ".new"
		if err := os.WriteFile(tmp, sec.Data[k], 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, p); err != nil {
			return err
		}
	}
	return nil
}

// owner makes the CSIDriver object of the driver the owner of the
// SnapshotMetadataService, so uninstalling the driver (which deletes it)
// removes the cluster-scoped object too; none when it cannot be read.
func (e SnapshotMetadataEndpoint) owner(ctx context.Context, c client.Client) []metav1.OwnerReference {
	d := &unstructured.Unstructured{}
	d.SetGroupVersionKind(schema.GroupVersionKind{Group: "storage.k8s.io", Version: "v1", Kind: "CSIDriver"})
	if err := c.Get(ctx, client.ObjectKey{Name: e.Driver}, d); err != nil {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: "storage.k8s.io/v1", Kind: "CSIDriver", Name: d.GetName(), UID: d.GetUID()}}
}

// isNoResource: a NotFound for the resource itself (its CRD is missing),
// not for the object.
func isNoResource(err error) bool {
	var s apierrors.APIStatus
	if !errors.As(err, &s) {
		return false
	}
	d := s.Status().Details
	return d == nil || d.Name == ""
}

func sameSpec(a, b map[string]any) bool {
	for _, k := range []string{"address", "audience", "caCert"} {
		if fmt.Sprint(a[k]) != fmt.Sprint(b[k]) {
			return false
		}
	}
	return true
}

// servingCert is the certificate of a Secret's data (tls.crt, tls.key) when
// it goes with its key, is valid at now and names host.
func servingCert(data map[string][]byte, host string, now time.Time) (*x509.Certificate, error) {
	pair, err := tls.X509KeyPair(data[corev1.TLSCertKey], data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return nil, errors.New("expired or not yet valid")
	}
	if err := leaf.VerifyHostname(host); err != nil {
		return nil, err
	}
	return leaf, nil
}

// caBundle is current, then served (the Secret's certificate while it is
// being replaced), then the still-valid certificates of the old bundle
// (base64 of PEM), without repeats, at most caBundleMax.
func caBundle(current, served *x509.Certificate, old string, now time.Time) []byte {
	certs := []*x509.Certificate{current}
	if served != nil {
		certs = append(certs, served)
	}
	if raw, err := base64.StdEncoding.DecodeString(old); err == nil {
		for rest := raw; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if c, err := x509.ParseCertificate(b.Bytes); err == nil && now.Before(c.NotAfter) {
				certs = append(certs, c)
			}
		}
	}
	var out []byte
	seen := map[string]bool{}
	for _, c := range certs {
		if seen[string(c.Raw)] || len(seen) == caBundleMax {
			continue
		}
		seen[string(c.Raw)] = true
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// serviceCert makes a key and a self-signed serving certificate for host,
// valid from a minute before now for lifetime; it is its own CA (backup
// tools verify the sidecar against it).
func serviceCert(host string, now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: host, Organization: []string{"localdir.csi.dev"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if ip := net.ParseIP(host); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{host}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	k, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: k}), nil
}

func parsePEMCert(p []byte) (*x509.Certificate, error) {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}
