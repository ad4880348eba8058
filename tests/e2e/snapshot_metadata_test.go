//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"net"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The changed block tracking endpoint as deploy/ installs it: the
// controller made the SnapshotMetadataService localdir.csi.dev (its CRD
// installed by the harness as a cluster add-on) naming the Service's
// address and the driver's audience, and every controller pod's
// csi-snapshot-metadata container (the harness's stand-in: the real image
// cannot be built here) serves TLS on port 50051 with the certificate the
// driver copied there from the Secret, which a backup tool trusting the
// object's caCert accepts for the Service's name.
func TestSnapshotMetadataServiceReachable(t *testing.T) {
	needCluster(t)
	ctx := context.Background()
	var address, audience, caCert string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := cl.Kubectl(ctx, "", "get", "snapshotmetadataservices.cbt.storage.k8s.io", "localdir.csi.dev",
			"-o", `jsonpath={.spec.address}{" "}{.spec.audience}{" "}{.spec.caCert}`)
		if f := strings.Fields(out); err == nil && len(f) == 3 {
			address, audience, caCert = f[0], f[1], f[2]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no SnapshotMetadataService localdir.csi.dev after 2 min: %v %s", err, out)
		}
		time.Sleep(time.Second)
	}
	if owner, _ := cl.Kubectl(ctx, "", "get", "snapshotmetadataservices.cbt.storage.k8s.io", "localdir.csi.dev",
		"-o", `jsonpath={.metadata.ownerReferences[0].kind}/{.metadata.ownerReferences[0].name}`); owner != "CSIDriver/localdir.csi.dev" {
		t.Errorf("SnapshotMetadataService owned by %q, want the CSIDriver (an uninstall removes it)", owner)
	}
	if address != "localdir-snapshot-metadata.localdir:6443" || audience != "localdir.csi.dev" {
		t.Errorf("SnapshotMetadataService: address %q, audience %q", address, audience)
	}
	raw, err := base64.StdEncoding.DecodeString(caCert)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(raw) {
		t.Fatalf("caCert holds no certificate: %q", raw)
	}
	host, _, _ := net.SplitHostPort(address)
	pods, err := kc.CoreV1().Pods("localdir").List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=controller"})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) == 0 {
		t.Fatal("no controller pods")
	}
	for _, p := range pods.Items {
		for _, cs := range p.Status.ContainerStatuses {
			if cs.Name != "csi-snapshot-metadata" {
				continue
			}
			if !cs.Ready {
				t.Errorf("pod %s: csi-snapshot-metadata not Ready", p.Name)
			}
			// Other scenarios SIGKILL pods' processes (exit 137); it never
			// exits on its own (it would without its certificate).
			if term := cs.LastTerminationState.Terminated; term != nil && term.ExitCode != 137 {
				t.Errorf("pod %s: csi-snapshot-metadata last ended %s (exit %d): %s", p.Name, term.Reason, term.ExitCode, term.Message)
			}
		}
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", net.JoinHostPort(p.Status.PodIP, "50051"),
			&tls.Config{RootCAs: roots, ServerName: host, NextProtos: []string{"h2"}})
		if err != nil {
			t.Errorf("TLS to pod %s's csi-snapshot-metadata as %s: %v", p.Name, host, err)
			continue
		}
		conn.Close()
		conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", net.JoinHostPort(p.Status.PodIP, "50051"),
			&tls.Config{RootCAs: x509.NewCertPool(), ServerName: host, NextProtos: []string{"h2"}})
		if err == nil {
			conn.Close()
			t.Errorf("TLS to pod %s's csi-snapshot-metadata trusting nothing succeeded", p.Name)
		}
	}
}
