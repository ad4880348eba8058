package cluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

func selfSigned(t *testing.T, notAfter time.Time) (der []byte, pemText string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err = x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der, string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestTransferAuthorizer: node a serves the source of a LocalVolume only to
// the key its target node published, and only while that volume is being
// created from a's data.
func TestTransferAuthorizer(t *testing.T) {
	bKey, bPEM := selfSigned(t, time.Now().Add(time.Hour))
	cKey, cPEM := selfSigned(t, time.Now().Add(time.Hour))
	oldKey, oldPEM := selfSigned(t, time.Now().Add(-time.Minute))
	withCert := func(name, pemText string) *v1.LocalNode {
		return &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: v1.LocalNodeStatus{Transfer: &v1.TransferEndpoint{Address: name + ":9811", Certificate: pemText}}}
	}
	lv := func(id, node, sourceNode, phase string, deleting bool) *v1.LocalVolume {
		return &v1.LocalVolume{
			ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: node}},
			Spec: v1.LocalVolumeSpec{Node: node, Size: quantity(mi), CSIName: id, DeleteData: deleting,
				ContentSource: &v1.ContentSource{Snapshot: "snap-0123456789abcdef0123456789abcdef", Node: sourceNode}},
			Status: v1.LocalVolumeStatus{Phase: phase},
		}
	}
	const (
		moving   = "vol-00000000000000000000000000000001"
		local    = "vol-00000000000000000000000000000002"
		elsewise = "vol-00000000000000000000000000000003"
		done     = "vol-00000000000000000000000000000004"
		deleting = "vol-00000000000000000000000000000005"
		toOld    = "vol-00000000000000000000000000000006"
	)
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(
		withCert("b", bPEM), withCert("c", cPEM), withCert("old", oldPEM),
		lv(moving, "b", "a", v1.PhasePending, false),
		lv(local, "a", "a", v1.PhasePending, false),
		lv(elsewise, "b", "c", v1.PhasePending, false),
		lv(done, "b", "a", v1.PhaseReady, false),
		lv(deleting, "b", "a", v1.PhasePending, true),
		lv(toOld, "old", "a", v1.PhasePending, false),
	).Build()
	a := &TransferAuthorizer{Reader: c, NodeID: "a"}
	ctx := context.Background()
	spec, err := a.Authorize(ctx, moving, bKey)
	if err != nil || spec.ID != moving || spec.SourceSnapshotID != "snap-0123456789abcdef0123456789abcdef" || spec.SizeBytes != mi {
		t.Fatalf("b pulling its volume from a: %+v, %v", spec, err)
	}
	for _, tc := range []struct {
		name, id string
		peer     []byte
		want     error
		msg      string
	}{
		{"another node's key", moving, cKey, contract.ErrRefused, "not the one that node published"},
		{"a volume made from a's data locally", local, bKey, contract.ErrRefused, "does not belong to another node"},
		{"a volume moving from another node", elsewise, bKey, contract.ErrRefused, "not being created from data on node a"},
		{"a volume already Ready", done, bKey, contract.ErrRefused, "Ready already"},
		{"a volume being deleted", deleting, bKey, contract.ErrRefused, "being deleted"},
		{"an expired published key", toOld, oldKey, contract.ErrRefused, "expired"},
		{"no such volume", "vol-0000000000000000000000000000ffff", bKey, contract.ErrNotFound, "no LocalVolume"},
	} {
		if _, err := a.Authorize(ctx, tc.id, tc.peer); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
}
