// Package upgrade checks that objects written under an earlier release's
// CRDs stay readable after the CRDs of this one are applied.
//
// testdata/crds-int-sizes holds the CRDs as they were before sizes became
// resource.Quantity values (every size an int64 of bytes, as `git show
// 6d43d3c:deploy/kubernetes/crds/…` prints them). The served version stays
// v1alpha1: the new schema accepts an integer or a quantity string, so an
// object stored with an integer size needs no conversion.
package upgrade

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
)

const (
	gi      = int64(1) << 30
	oldNode = "node-old"
	newNode = "node-new"
	// oddSize is no multiple of any unit: it must survive exactly.
	oddSize = int64(1000000001)
)

// obj is an unstructured localdir object of kind with the given content.
func obj(kind, name string, content map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: content}
	u.SetAPIVersion(v1.GroupVersion.String())
	u.SetKind(kind)
	u.SetName(name)
	return u
}

// create writes u and then its status (the status subresource ignores
// status on create), as an earlier release's controller and node plugin did.
func create(t *testing.T, c client.Client, u *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	status, hasStatus := u.Object["status"]
	if err := c.Create(ctx, u); err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
	if hasStatus {
		u.Object["status"] = status
		if err := c.Status().Update(ctx, u); err != nil {
			t.Fatalf("status of %s %s: %v", u.GetKind(), u.GetName(), err)
		}
	}
}

// writeOldObjects creates, under the old CRDs, a LocalNode, two Ready
// LocalVolumes and a Ready LocalSnapshot, every size an integer.
func writeOldObjects(t *testing.T, c client.Client) (volID, oddID, snapID string) {
	volID, oddID, snapID = cluster.VolumeIDFor("pvc-old"), cluster.VolumeIDFor("pvc-odd"), cluster.SnapshotIDFor("snap-old")
	now := time.Now().UTC().Format(time.RFC3339)
	create(t, c, obj("LocalNode", oldNode, map[string]any{"status": map[string]any{
		"engine": "dir", "capacityBytes": 10 * gi, "allocatableBytes": 8 * gi, "freeBytes": 9 * gi,
		"maxVolumeBytes": 4 * gi, "driverVersion": "v0.old", "heartbeat": now,
		"orphans": []any{map[string]any{"id": cluster.VolumeIDFor("pvc-orphan"), "kind": "Volume", "path": "/data/volumes/x", "sizeBytes": oddSize}},
	}}))
	for id, size := range map[string]int64{volID: 2 * gi, oddID: oddSize} {
		name := map[string]string{volID: "pvc-old", oddID: "pvc-odd"}[id]
		u := obj("LocalVolume", id, map[string]any{
			"spec":   map[string]any{"node": oldNode, "size": size, "volumeMode": "Filesystem", "csiName": name},
			"status": map[string]any{"phase": "Ready", "capacityBytes": size, "usedBytes": int64(4096), "path": "/data/volumes/" + id},
		})
		u.SetLabels(map[string]string{v1.NodeLabel: oldNode})
		create(t, c, u)
	}
	u := obj("LocalSnapshot", snapID, map[string]any{
		"spec":   map[string]any{"sourceVolume": volID, "node": oldNode, "csiName": "snap-old"},
		"status": map[string]any{"readyToUse": true, "phase": "Ready", "sizeBytes": 2 * gi, "creationTime": now},
	})
	u.SetLabels(map[string]string{v1.NodeLabel: oldNode})
	create(t, c, u)
	return volID, oddID, snapID
}

// stringSizedVolume is a LocalVolume whose size is a quantity string,
// which only the new schema accepts.
func stringSizedVolume(name, size string) *unstructured.Unstructured {
	u := obj("LocalVolume", name, map[string]any{
		"spec": map[string]any{"node": "node-probe", "size": size, "csiName": name},
	})
	u.SetLabels(map[string]string{v1.NodeLabel: "node-probe"})
	return u
}

func kubectl(t *testing.T, env *clustertest.Env, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(clustertest.ToolsDir(t), "kubectl"), append([]string{"--kubeconfig", env.Kubeconfig}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// TestIntegerSizesReadAfterUpgrade installs the CRDs of the release before
// sizes were quantities, writes objects with integer sizes, applies this
// release's CRDs and reads the objects back through the typed client and
// through ControllerBackend (the CSI controller's code path) with every
// size exact to the byte; then checks what the new schema writes, prints
// and refuses.
func TestIntegerSizesReadAfterUpgrade(t *testing.T) {
	env := clustertest.StartWithCRDs(t, filepath.Join("testdata", "crds-int-sizes"))
	ctx := context.Background()
	c := env.Client
	volID, oddID, snapID := writeOldObjects(t, c)

	// The old schema refuses a quantity string: the upgrade below really
	// changes what is accepted.
	if err := c.Create(ctx, stringSizedVolume("vol-probe-old", "1Gi")); !apierrors.IsInvalid(err) {
		t.Fatalf("old CRD: creating a LocalVolume with size \"1Gi\": %v, want Invalid", err)
	}

	env.InstallCRDs(t, clustertest.CRDDir(t))
	// The API server switches to the new schema asynchronously.
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := c.Create(ctx, stringSizedVolume(cluster.VolumeIDFor("probe"), "1Gi"))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new CRD: a LocalVolume with size \"1Gi\" is still refused: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("TypedClient", func(t *testing.T) {
		for id, want := range map[string]int64{volID: 2 * gi, oddID: oddSize} {
			lv := &v1.LocalVolume{}
			if err := c.Get(ctx, client.ObjectKey{Name: id}, lv); err != nil {
				t.Fatal(err)
			}
			if lv.Spec.Size.Value() != want || lv.Status.CapacityBytes.Value() != want || lv.Status.UsedBytes.Value() != 4096 {
				t.Errorf("LocalVolume %s: size %s, capacity %s, used %s; want %d, %d, 4096",
					id, &lv.Spec.Size, &lv.Status.CapacityBytes, &lv.Status.UsedBytes, want, want)
			}
		}
		ls := &v1.LocalSnapshot{}
		if err := c.Get(ctx, client.ObjectKey{Name: snapID}, ls); err != nil {
			t.Fatal(err)
		}
		if ls.Status.SizeBytes.Value() != 2*gi {
			t.Errorf("LocalSnapshot size %s, want %d", &ls.Status.SizeBytes, 2*gi)
		}
		ln := &v1.LocalNode{}
		if err := c.Get(ctx, client.ObjectKey{Name: oldNode}, ln); err != nil {
			t.Fatal(err)
		}
		st := ln.Status
		got := []int64{st.CapacityBytes.Value(), st.AllocatableBytes.Value(), st.FreeBytes.Value(), st.MaxVolumeBytes.Value()}
		if want := []int64{10 * gi, 8 * gi, 9 * gi, 4 * gi}; !slices.Equal(got, want) || len(st.Orphans) != 1 || st.Orphans[0].SizeBytes.Value() != oddSize {
			t.Errorf("LocalNode sizes %v, orphans %+v; want %v and one orphan of %d bytes", got, st.Orphans, want, oddSize)
		}
	})

	b, err := cluster.NewControllerBackend(t.Context(), rest.CopyConfig(env.Config), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("ControllerBackend", func(t *testing.T) {
		v, err := b.Volume(ctx, volID)
		if err != nil || v.CapacityBytes != 2*gi || v.Node != oldNode || v.Name != "pvc-old" {
			t.Fatalf("Volume(%s) = %+v, %v; want %d bytes on %s", volID, v, err, 2*gi, oldNode)
		}
		if v, err := b.VolumeByName(ctx, "pvc-odd"); err != nil || v == nil || v.CapacityBytes != oddSize {
			t.Errorf("VolumeByName(pvc-odd) = %+v, %v; want %d bytes", v, err, oddSize)
		}
		vols, _, err := b.ListVolumes(ctx, "", 0)
		if err != nil {
			t.Fatal(err)
		}
		sizes := map[string]int64{}
		for _, v := range vols {
			sizes[v.ID] = v.CapacityBytes
		}
		if sizes[volID] != 2*gi || sizes[oddID] != oddSize || len(sizes) != 2 {
			t.Errorf("ListVolumes sizes %v; want %s: %d and %s: %d (the probe is not Ready)", sizes, volID, 2*gi, oddID, oddSize)
		}
		if s, err := b.Snapshot(ctx, snapID); err != nil || s.SizeBytes != 2*gi || s.SourceVolumeID != volID {
			t.Errorf("Snapshot(%s) = %+v, %v; want %d bytes of %s", snapID, s, err, 2*gi, volID)
		}
		// Room on the old node: min(10Gi − 2Gi − oddSize, 9Gi free − the
		// volumes it never reported as counted: an earlier node plugin
		// writes no allocatedBytes/headroomBytes, so all of them count as
		// still to be filled); the largest volume is capped by its 4Gi
		// maxVolumeBytes.
		total, largest, err := b.Capacity(ctx, &csi.Topology{Segments: map[string]string{contract.TopologyKey: oldNode}})
		if want := 9*gi - 2*gi - oddSize; err != nil || total != want || largest != 4*gi {
			t.Errorf("Capacity(%s) = %d, %d, %v; want %d, %d", oldNode, total, largest, err, want, 4*gi)
		}
	})

	t.Run("NewObjectsAreQuantities", func(t *testing.T) {
		ln := &v1.LocalNode{ObjectMeta: metav1.ObjectMeta{Name: newNode}}
		if err := c.Create(ctx, ln); err != nil {
			t.Fatal(err)
		}
		ln.Status = v1.LocalNodeStatus{
			Engine: "dir", CapacityBytes: resource.MustParse("100Gi"), AllocatableBytes: resource.MustParse("100Gi"),
			FreeBytes: resource.MustParse("100Gi"), Heartbeat: metav1.Now(),
		}
		if err := c.Status().Update(ctx, ln); err != nil {
			t.Fatal(err)
		}
		// The controller places from its object cache: wait until it shows
		// the new node's room.
		for i := 0; ; i++ {
			total, _, err := b.Capacity(ctx, &csi.Topology{Segments: map[string]string{contract.TopologyKey: newNode}})
			if err == nil && total > 0 {
				break
			}
			if i == 500 {
				t.Fatalf("the controller's cache never showed LocalNode %s: Capacity %d, %v", newNode, total, err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// CreateVolume records the LocalVolume on the node with most room,
		// then waits for a node plugin, which this test does not run.
		wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err := b.CreateVolume(wctx, contract.CreateSpec{Name: "pvc-new", SizeBytes: 2 * gi, AccessType: contract.AccessMount}, nil)
		if contract.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("CreateVolume without a node plugin: %v, want DEADLINE_EXCEEDED", err)
		}
		newID := cluster.VolumeIDFor("pvc-new")
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(v1.GroupVersion.WithKind("LocalVolume"))
		if err := c.Get(ctx, client.ObjectKey{Name: newID}, u); err != nil {
			t.Fatal(err)
		}
		if size, _, _ := unstructured.NestedFieldNoCopy(u.Object, "spec", "size"); size != "2Gi" {
			t.Errorf("stored spec.size of a new LocalVolume = %#v, want \"2Gi\"", size)
		}
		rows := map[string][]string{}
		for _, l := range strings.Split(strings.TrimSpace(kubectl(t, env, "get", "lv", "--no-headers", newID, volID)), "\n") {
			f := strings.Fields(l)
			rows[f[0]] = f
		}
		// NAME NODE SIZE PHASE AGE; the old object shows what it stores.
		if r := rows[newID]; len(r) < 3 || r[1] != newNode || r[2] != "2Gi" {
			t.Errorf("kubectl get lv %s = %v, want %s 2Gi …", newID, r, newNode)
		}
		if r := rows[volID]; len(r) < 3 || r[2] != "2147483648" {
			t.Errorf("kubectl get lv %s = %v, want %s 2147483648 …", volID, r, oldNode)
		}
		if r := strings.Fields(kubectl(t, env, "get", "lnode", "--no-headers", newNode)); len(r) < 4 || r[2] != "100Gi" || r[3] != "100Gi" {
			t.Errorf("kubectl get lnode %s = %v, want dir 100Gi 100Gi …", newNode, r)
		}
	})

	t.Run("Validation", func(t *testing.T) {
		for _, size := range []string{"0", "100m", "-1Gi", "2 Gi"} {
			if err := c.Create(ctx, stringSizedVolume(cluster.VolumeIDFor("bad-"+size), size)); !apierrors.IsInvalid(err) {
				t.Errorf("LocalVolume with size %q: %v, want Invalid", size, err)
			}
		}
		lv := &v1.LocalVolume{}
		if err := c.Get(ctx, client.ObjectKey{Name: oddID}, lv); err != nil {
			t.Fatal(err)
		}
		lv.Status.ErrorCode = "NoSuchCode"
		if err := c.Status().Update(ctx, lv); !apierrors.IsInvalid(err) {
			t.Errorf("status.errorCode %q: %v, want Invalid", lv.Status.ErrorCode, err)
		}
		lv.Status.ErrorCode = v1.ErrorCode(codes.ResourceExhausted.String())
		if err := c.Status().Update(ctx, lv); err != nil {
			t.Errorf("status.errorCode %q: %v", lv.Status.ErrorCode, err)
		}
	})
}
