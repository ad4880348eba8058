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

func selfSigned(t *testing.T, notAfter time.Time) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "x"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestTransferAuthorizer: node a allows a pull of a LocalVolume's source
// only while that volume is being created on another node from a's data,
// naming that node and the certificate it published (which the channel's
// server holds the client to: pkg/transfer).
func TestTransferAuthorizer(t *testing.T) {
	bPEM := selfSigned(t, time.Now().Add(time.Hour))
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
	)
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(
		withCert("b", bPEM),
		lv(moving, "b", "a", v1.PhasePending, false),
		lv(local, "a", "a", v1.PhasePending, false),
		lv(elsewise, "b", "c", v1.PhasePending, false),
		lv(done, "b", "a", v1.PhaseReady, false),
		lv(deleting, "b", "a", v1.PhasePending, true),
	).Build()
	a := &TransferAuthorizer{Reader: c, NodeID: "a"}
	ctx := context.Background()
	spec, node, cert, err := a.Authorize(ctx, moving, "")
	if err != nil || spec.ID != moving || spec.SourceSnapshotID != "snap-0123456789abcdef0123456789abcdef" || spec.SizeBytes != mi || node != "b" || cert != bPEM {
		t.Fatalf("b pulling its volume from a: %+v on %q with its certificate %v, %v", spec, node, cert == bPEM, err)
	}
	for _, tc := range []struct {
		name, id string
		want     error
		msg      string
	}{
		{"a volume made from a's data locally", local, contract.ErrRefused, "does not belong to another node"},
		{"a volume moving from another node", elsewise, contract.ErrRefused, "not being created from data on node a"},
		{"a volume already Ready", done, contract.ErrRefused, "Ready already"},
		{"a volume being deleted", deleting, contract.ErrRefused, "being deleted"},
		{"no such volume", "vol-0000000000000000000000000000ffff", contract.ErrNotFound, "no LocalVolume"},
	} {
		if _, _, _, err := a.Authorize(ctx, tc.id, ""); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

// TestTransferAuthorizerCopies: node a allows a pull of a snapshot copy only
// for the copy object of a snapshot that a cut, while the copy is being
// made on the node the object names, with that node's certificate.
func TestTransferAuthorizerCopies(t *testing.T) {
	bPEM := selfSigned(t, time.Now().Add(time.Hour))
	const (
		onA = "snap-0123456789abcdef0123456789abcdef"
		onC = "snap-0123456789abcdef0123456789abcde0"
	)
	snap := func(id, node string) *v1.LocalSnapshot {
		return &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: node}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: "vol-00000000000000000000000000000001", Node: node, Copies: 2},
			Status:     v1.LocalSnapshotStatus{ReadyToUse: true, Phase: v1.PhaseReady, SizeBytes: quantity(mi), VolumeMode: "Block"},
		}
	}
	copyOf := func(id, node, phase string) *v1.LocalSnapshot {
		return &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: contract.SnapshotCopyName(id, node), Labels: map[string]string{v1.NodeLabel: node}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: "vol-00000000000000000000000000000001", Node: node, CopyOf: id},
			Status:     v1.LocalSnapshotStatus{Phase: phase},
		}
	}
	misnamed := copyOf(onA, "b", v1.PhasePending)
	misnamed.Name = contract.SnapshotCopyName(onA, "x")
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(
		&v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: v1.LocalNodeStatus{Transfer: &v1.TransferEndpoint{Address: "b:9811", Certificate: bPEM}}},
		snap(onA, "a"), snap(onC, "c"),
		copyOf(onA, "b", v1.PhasePending), copyOf(onC, "b", v1.PhasePending), copyOf(onA, "d", v1.PhaseReady), copyOf(onA, "a", v1.PhasePending), misnamed,
	).Build()
	a := &TransferAuthorizer{Reader: c, NodeID: "a"}
	ctx := context.Background()
	spec, node, cert, err := a.Authorize(ctx, contract.SnapshotCopyName(onA, "b"), "")
	if err != nil || spec.SourceSnapshotID != onA || spec.SizeBytes != mi || spec.AccessType != contract.AccessBlock || node != "b" || cert != bPEM {
		t.Fatalf("b pulling its copy of a's snapshot: %+v on %q with its certificate %v, %v", spec, node, cert == bPEM, err)
	}
	for _, tc := range []struct {
		name, id string
		want     error
		msg      string
	}{
		{"a copy of another node's snapshot", contract.SnapshotCopyName(onC, "b"), contract.ErrRefused, "not cut on node a"},
		{"a copy already made", contract.SnapshotCopyName(onA, "d"), contract.ErrRefused, "Ready already"},
		{"a copy on a itself", contract.SnapshotCopyName(onA, "a"), contract.ErrRefused, "does not belong to another node"},
		{"a copy object named for another node", misnamed.Name, contract.ErrRefused, "is not a copy of snapshot"},
		{"no such copy", contract.SnapshotCopyName(onA, "e"), contract.ErrNotFound, "no LocalSnapshot"},
	} {
		if _, _, _, err := a.Authorize(ctx, tc.id, ""); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

// TestTransferAuthorizerMoves: node a allows a pull for a move object only
// when it moves a volume a holds, from a, to the node the object names,
// while the move runs; it sends the volume itself (the move's spec is the
// volume's, under the volume's id).
func TestTransferAuthorizerMoves(t *testing.T) {
	bPEM := selfSigned(t, time.Now().Add(time.Hour))
	const (
		onA  = "vol-00000000000000000000000000000001"
		onC  = "vol-00000000000000000000000000000002"
		gone = "vol-00000000000000000000000000000003"
	)
	vol := func(id, node string) *v1.LocalVolume {
		return &v1.LocalVolume{
			ObjectMeta: metav1.ObjectMeta{Name: id, Labels: map[string]string{v1.NodeLabel: node}},
			Spec:       v1.LocalVolumeSpec{Node: node, Size: quantity(3 * mi), CSIName: "pv-" + id, VolumeMode: "Block"},
			Status:     v1.LocalVolumeStatus{Phase: v1.PhaseReady},
		}
	}
	move := func(id, node, source, phase string) *v1.LocalVolume {
		mv := vol(id, node)
		mv.Name = contract.VolumeMoveName(id, node)
		mv.Labels[v1.MoveOfLabel] = id
		mv.Spec.MoveOf, mv.Spec.ContentSource = id, &v1.ContentSource{Volume: id, Node: source}
		mv.Status.Phase = phase
		return mv
	}
	misnamed := move(onA, "b", "a", v1.PhasePending)
	misnamed.Name = contract.VolumeMoveName(onA, "x")
	fromSnap := move(onA, "e", "a", v1.PhasePending)
	fromSnap.Spec.ContentSource.Snapshot = "snap-0123456789abcdef0123456789abcdef"
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(
		&v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: v1.LocalNodeStatus{Transfer: &v1.TransferEndpoint{Address: "b:9811", Certificate: bPEM}}},
		vol(onA, "a"), vol(onC, "c"),
		move(onA, "b", "a", v1.PhasePending), move(onC, "b", "a", v1.PhasePending), move(onA, "d", "a", v1.PhaseReady),
		move(onA, "f", "c", v1.PhasePending), move(gone, "b", "a", v1.PhasePending), misnamed, fromSnap,
	).Build()
	a := &TransferAuthorizer{Reader: c, NodeID: "a"}
	ctx := context.Background()
	spec, node, cert, err := a.Authorize(ctx, contract.VolumeMoveName(onA, "b"), "")
	if err != nil || spec.ID != onA || spec.SourceVolumeID != onA || spec.SourceSnapshotID != "" || spec.SizeBytes != 3*mi ||
		spec.AccessType != contract.AccessBlock || node != "b" || cert != bPEM {
		t.Fatalf("b pulling the volume moving to it from a: %+v on %q with its certificate %v, %v", spec, node, cert == bPEM, err)
	}
	for _, tc := range []struct {
		name, id string
		want     error
		msg      string
	}{
		{"a move of a volume held on another node", contract.VolumeMoveName(onC, "b"), contract.ErrRefused, "not held on node a"},
		{"a move from another node", contract.VolumeMoveName(onA, "f"), contract.ErrRefused, "from node a"},
		{"a move already made", contract.VolumeMoveName(onA, "d"), contract.ErrRefused, "Ready already"},
		{"a move object named for another node", misnamed.Name, contract.ErrRefused, "is not a move of volume"},
		{"a move from a snapshot", fromSnap.Name, contract.ErrRefused, "does not move volume"},
		{"a move of a volume without a LocalVolume", contract.VolumeMoveName(gone, "b"), contract.ErrNotFound, "no LocalVolume " + gone},
		{"no such move", contract.VolumeMoveName(onA, "g"), contract.ErrNotFound, "no LocalVolume"},
	} {
		if _, _, _, err := a.Authorize(ctx, tc.id, ""); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
}

// TestTransferAuthorizerCopyBase: the base a copy's node asks for is used
// only when it is another ready snapshot of the same volume cut on this
// node of which that node holds a ready copy; otherwise the whole snapshot
// is sent (no BaseSnapshotID), never refused.
func TestTransferAuthorizerCopyBase(t *testing.T) {
	bPEM := selfSigned(t, time.Now().Add(time.Hour))
	const (
		vol      = "vol-00000000000000000000000000000001"
		snap     = "snap-00000000000000000000000000000001"
		base     = "snap-00000000000000000000000000000002"
		noCopy   = "snap-00000000000000000000000000000003"
		otherVol = "snap-00000000000000000000000000000004"
	)
	mk := func(id, node, source, copyOf string, ready bool) *v1.LocalSnapshot {
		name := id
		if copyOf != "" {
			name = contract.SnapshotCopyName(copyOf, node)
		}
		return &v1.LocalSnapshot{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{v1.NodeLabel: node}},
			Spec:       v1.LocalSnapshotSpec{SourceVolume: source, Node: node, CopyOf: copyOf},
			Status:     v1.LocalSnapshotStatus{ReadyToUse: ready, Phase: v1.PhaseReady, SizeBytes: quantity(mi), VolumeMode: "Block"},
		}
	}
	pending := mk("", "b", vol, snap, false)
	pending.Status.Phase = v1.PhasePending
	c := fake.NewClientBuilder().WithScheme(Scheme()).WithObjects(
		&v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: "b"}, Status: v1.LocalNodeStatus{Transfer: &v1.TransferEndpoint{Address: "b:9811", Certificate: bPEM}}},
		mk(snap, "a", vol, "", true), pending,
		mk(base, "a", vol, "", true), mk("", "b", vol, base, true),
		mk(noCopy, "a", vol, "", true),
		mk(otherVol, "a", "vol-00000000000000000000000000000002", "", true), mk("", "b", "vol-00000000000000000000000000000002", otherVol, true),
	).Build()
	a := &TransferAuthorizer{Reader: c, NodeID: "a"}
	for _, tc := range []struct{ base, want string }{
		{base, base}, {noCopy, ""}, {otherVol, ""}, {snap, ""}, {"snap-000000000000000000000000000000ff", ""}, {"", ""},
	} {
		spec, _, _, err := a.Authorize(context.Background(), contract.SnapshotCopyName(snap, "b"), tc.base)
		if err != nil || spec.SourceSnapshotID != snap || spec.BaseSnapshotID != tc.want {
			t.Errorf("base %q: %+v, %v; want base %q", tc.base, spec, err, tc.want)
		}
	}
}
