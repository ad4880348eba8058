package multinode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/testfs"
	"github.com/localdir-csi/localdir/tests/treecmp"
)

const moveGate = "MutablePVNodeAffinity=true"

// startMoveNodes is startTransferNodes on an API server with gates.
func startMoveNodes(t *testing.T, gates string, capacities ...int64) (*fixture, kubernetes.Interface) {
	c := transferNodesOn(t, clustertest.StartWithFeatureGates(t, gates), capacities...)
	// A second replica, as deploy/kubernetes runs: one mover leads.
	c.env.StartController(t, nil)
	kube, err := kubernetes.NewForConfig(c.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c, kube
}

// boundClaim creates a volume of CSI name on node-0 and, as the
// provisioner and the PV controller would, its PV (pinned to node-0) and a
// PVC bound to it in namespace default.
func boundClaim(t *testing.T, c *fixture, kube kubernetes.Interface, name string, caps []*csi.VolumeCapability) *csi.Volume {
	t.Helper()
	ctx := context.Background()
	resp, err := c.ctrl.Controller.CreateVolume(ctx, &csi.CreateVolumeRequest{
		Name: name, VolumeCapabilities: caps, CapacityRange: &csi.CapacityRange{RequiredBytes: 64 * mi},
		AccessibilityRequirements: &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}},
		// Slow enough for a test to see the move in progress.
		Parameters: map[string]string{contract.ParamTransferBandwidth: "2Mi"},
	})
	if err != nil {
		t.Fatal(err)
	}
	mode := corev1.PersistentVolumeFilesystem
	if caps[0].GetBlock() != nil {
		mode = corev1.PersistentVolumeBlock
	}
	size := resource.MustParse("64Mi")
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:    corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			VolumeMode:  &mode,
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{
				Driver: driver.DefaultDriverName, VolumeHandle: resp.GetVolume().GetVolumeId(),
			}},
			ClaimRef:     &corev1.ObjectReference{Kind: "PersistentVolumeClaim", Namespace: "default", Name: name},
			NodeAffinity: nodeAffinityOf(contract.TopologyKey, "node-0"),
		},
	}
	if _, err := kube.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	empty := ""
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}, VolumeMode: &mode, StorageClassName: &empty,
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: size}}, VolumeName: name,
		},
	}
	out, err := kube.CoreV1().PersistentVolumeClaims("default").Create(ctx, pvc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out.Status.Phase = corev1.ClaimBound
	if _, err := kube.CoreV1().PersistentVolumeClaims("default").UpdateStatus(ctx, out, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume()
}

func nodeAffinityOf(key, node string) *corev1.VolumeNodeAffinity {
	return &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
		MatchExpressions: []corev1.NodeSelectorRequirement{{Key: key, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
	}}}}
}

// pvAffinity is "key=node" of the PV's one node affinity term.
func pvAffinity(t *testing.T, kube kubernetes.Interface, name string) string {
	t.Helper()
	pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e := pv.Spec.NodeAffinity.Required.NodeSelectorTerms[0].MatchExpressions[0]
	return e.Key + "=" + strings.Join(e.Values, ",")
}

func annotateMove(t *testing.T, kube kubernetes.Interface, name, node string) {
	t.Helper()
	value := "null"
	if node != "" {
		value = `"` + node + `"`
	}
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%s}}}`, v1.MoveToAnnotation, value)
	if _, err := kube.CoreV1().PersistentVolumeClaims("default").Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitEvent waits for an Event of reason on the object of kind and name in
// default whose message contains want, and returns its message.
func waitEvent(t *testing.T, kube kubernetes.Interface, kind, name, reason, want string) string {
	t.Helper()
	var seen []string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		evs, err := kube.CoreV1().Events("default").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name {
				seen = append(seen, e.Reason+": "+e.Message)
				if e.Reason == reason && strings.Contains(e.Message, want) {
					return e.Message
				}
			}
		}
	}
	t.Fatalf("no %s Event on %s %s with %q; its Events: %q", reason, kind, name, want, seen)
	return ""
}

func podUsing(name, claim, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:   node,
			Containers: []corev1.Container{{Name: "c", Image: "busybox"}},
			Volumes: []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
			}}},
		},
	}
}

func deletePod(t *testing.T, kube kubernetes.Interface, name string) {
	t.Helper()
	zero := int64(0)
	if err := kube.CoreV1().Pods("default").Delete(context.Background(), name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeMoveInPlace: with the MutablePVNodeAffinity gate on, a PVC
// annotated localdir.csi.dev/move-to=node-1 (a directory volume and a raw
// block volume) is refused while a scheduled pod uses it, then, once that
// pod is gone, moved: a pod created meanwhile (not scheduled) gets a
// WaitingForVolumeMove Event, the PV points at no node during the copy and
// at node-1 after; the volume's LocalVolume is on node-1, Ready, its data
// there byte for byte and gone from node-0; the move object is gone; the
// PVC says VolumeMoved. The PVC and PV are the same objects.
func TestVolumeMoveInPlace(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c, kube := startMoveNodes(t, moveGate, 300*mi, 300*mi)
	ctx := context.Background()
	root := func(n string) string { return c.nodes[n].Opts.DataRoot }
	for _, kind := range []struct {
		name string
		caps []*csi.VolumeCapability
		path func(root, id string) string
	}{
		{"dir", mnt, func(root, id string) string { return filepath.Join(root, "volumes", id, "data") }},
		{"block", blk, func(root, id string) string { return filepath.Join(root, "block", id+".img") }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			name := "move-" + kind.name
			vol := boundClaim(t, c, kube, name, kind.caps)
			id := vol.GetVolumeId()
			data := treecmp.RandomBytes(uint64(len(name)), 3*mi+11)
			if kind.name == "block" {
				f, err := os.OpenFile(kind.path(root("node-0"), id), os.O_WRONLY, 0)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := f.WriteAt(data, 0); err != nil {
					t.Fatal(err)
				}
				f.Close()
				data = append(data, make([]byte, 64*mi-len(data))...)
			} else if err := os.WriteFile(kind.path(root("node-0"), id), data, 0o640); err != nil {
				t.Fatal(err)
			}
			pvc, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pvUID := mustPV(t, kube, name).UID

			// In use by a pod scheduled to node-0: refused, nothing changes.
			if _, err := kube.CoreV1().Pods("default").Create(ctx, podUsing(name+"-running", name, "node-0"), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			annotateMove(t, kube, name, "node-1")
			waitEvent(t, kube, "PersistentVolumeClaim", name, "VolumeMoveRefused", "pod "+name+"-running")
			if got := pvAffinity(t, kube, name); got != contract.TopologyKey+"=node-0" {
				t.Errorf("PV affinity %s while the move is refused, want node-0", got)
			}
			if err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, &v1.LocalVolume{}); !apierrors.IsNotFound(err) {
				t.Errorf("a move object while the move is refused: %v", err)
			}

			// The pod goes, another comes (not scheduled): the move runs.
			if _, err := kube.CoreV1().Pods("default").Create(ctx, podUsing(name+"-waiting", name, ""), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			deletePod(t, kube, name+"-running")
			waitEvent(t, kube, "PersistentVolumeClaim", name, "VolumeMoveStarted", "to node node-1")
			if got := pvAffinity(t, kube, name); got != lcluster.MovingToKey+"=node-1" {
				t.Errorf("PV affinity %s during the move, want %s=node-1 (no node)", got, lcluster.MovingToKey)
			}
			waitEvent(t, kube, "Pod", name+"-waiting", "WaitingForVolumeMove", "node-1")
			waitEvent(t, kube, "PersistentVolumeClaim", name, "VolumeMoved", "moved to node node-1")
			// One mover acted: each Event once.
			evs, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == name && strings.HasPrefix(e.Reason, "VolumeMove") && e.Count > 1 || e.Reason == "VolumeMoveStarted" && e.InvolvedObject.Name == name && e.Source.Host != "" {
					t.Errorf("Event %s %q given %d times (host %q)", e.Reason, e.Message, e.Count, e.Source.Host)
				}
			}
			started := 0
			for _, e := range evs.Items {
				if e.InvolvedObject.Name == name && e.Reason == "VolumeMoveStarted" {
					started++
				}
			}
			if started != 1 {
				t.Errorf("%d VolumeMoveStarted Events, want 1 (one mover leads)", started)
			}

			lv := &v1.LocalVolume{}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
				err := c.env.Client.Get(ctx, client.ObjectKey{Name: id}, lv)
				if err == nil && lv.Spec.Node == "node-1" && lv.Status.Phase == v1.PhaseReady {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("LocalVolume %s not Ready on node-1: %v, %+v %+v", id, err, lv.Spec, lv.Status)
				}
			}
			if got := pvAffinity(t, kube, name); got != contract.TopologyKey+"=node-1" {
				t.Errorf("PV affinity %s after the move, want node-1", got)
			}
			if got, err := os.ReadFile(kind.path(root("node-1"), id)); err != nil || !bytes.Equal(got, data) {
				t.Errorf("the data on node-1 differs (%d bytes, %v)", len(got), err)
			}
			if _, err := os.Stat(kind.path(root("node-0"), id)); !os.IsNotExist(err) {
				t.Errorf("the data is still on node-0 after the move (%v)", err)
			}
			if err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, &v1.LocalVolume{}); !apierrors.IsNotFound(err) {
				t.Errorf("the move object is still there: %v", err)
			}
			after, err := kube.CoreV1().PersistentVolumeClaims("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil || after.UID != pvc.UID || mustPV(t, kube, name).UID != pvUID || after.Spec.VolumeName != name {
				t.Errorf("the PVC or PV was replaced: %v", err)
			}
			// The volume is an ordinary volume of node-1 now.
			got, err := c.ctrl.Controller.ControllerGetVolume(ctx, &csi.ControllerGetVolumeRequest{VolumeId: id})
			if err != nil || nodeOfVol(got.GetVolume()) != "node-1" {
				t.Errorf("ControllerGetVolume after the move: %v, %v", got, err)
			}
			if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
				t.Fatal(err)
			}
			for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
				if _, err := os.Stat(kind.path(root("node-1"), id)); os.IsNotExist(err) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("DeleteVolume after the move left the data on node-1")
				}
			}
		})
	}
}

func mustPV(t *testing.T, kube kubernetes.Interface, name string) *corev1.PersistentVolume {
	t.Helper()
	pv, err := kube.CoreV1().PersistentVolumes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// TestVolumeMoveRefusedWithoutGate: on an API server without the
// MutablePVNodeAffinity gate, the annotation gets a VolumeMoveRefused Event
// that names the gate and the snapshot-and-restore steps; the PV, the
// volume and its data stay as they were.
func TestVolumeMoveRefusedWithoutGate(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c, kube := startMoveNodes(t, "", 300*mi, 300*mi)
	vol := boundClaim(t, c, kube, "nogate", mnt)
	annotateMove(t, kube, "nogate", "node-1")
	msg := waitEvent(t, kube, "PersistentVolumeClaim", "nogate", "VolumeMoveRefused", "MutablePVNodeAffinity")
	if !strings.Contains(msg, "snapshot") || !strings.Contains(msg, "docs/troubleshooting.md") {
		t.Errorf("refusal %q does not point at the snapshot-and-restore steps", msg)
	}
	time.Sleep(2 * time.Second)
	if got := pvAffinity(t, kube, "nogate"); got != contract.TopologyKey+"=node-0" {
		t.Errorf("PV affinity %s, want node-0", got)
	}
	lv := &v1.LocalVolume{}
	if err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: vol.GetVolumeId()}, lv); err != nil || lv.Spec.Node != "node-0" || lv.Status.Phase != v1.PhaseReady {
		t.Errorf("LocalVolume %v %+v, want Ready on node-0", err, lv.Spec)
	}
	lvs := &v1.LocalVolumeList{}
	if err := c.env.Client.List(context.Background(), lvs); err != nil || len(lvs.Items) != 1 {
		t.Errorf("LocalVolumes: %d (%v), want the volume's alone", len(lvs.Items), err)
	}
	if _, err := os.Stat(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "volumes", vol.GetVolumeId())); err != nil {
		t.Errorf("the volume's data on node-0: %v", err)
	}
}

// moveOf waits until the move of volume id to node-1 satisfies cond.
func moveOf(t *testing.T, c *fixture, id, what string, cond func(*v1.LocalVolume) bool) *v1.LocalVolume {
	t.Helper()
	mv := &v1.LocalVolume{}
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, mv)
		if err == nil && cond(mv) {
			return mv
		}
		if time.Now().After(deadline) {
			t.Fatalf("move of %s: %s did not happen (%v, status %+v)", id, what, err, mv.Status)
		}
	}
}

// blockClaim is boundClaim of a raw block volume with n random bytes at
// offset 0; it returns the volume id and the whole image it should hold.
func blockClaim(t *testing.T, c *fixture, kube kubernetes.Interface, name string, n int) (string, []byte) {
	t.Helper()
	id := boundClaim(t, c, kube, name, blk).GetVolumeId()
	data := treecmp.RandomBytes(uint64(len(name)), n)
	f, err := os.OpenFile(filepath.Join(c.nodes["node-0"].Opts.DataRoot, "block", id+".img"), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, 0); err != nil {
		t.Fatal(err)
	}
	return id, append(data, make([]byte, 64*mi-n)...)
}

func imageOf(p *clustertest.Plugin, id string) ([]byte, error) {
	return os.ReadFile(filepath.Join(p.Opts.DataRoot, "block", id+".img"))
}

// TestVolumeMoveFaults: a move survives either node plugin restarting in
// the middle of the copy; a move called off (the annotation removed) or
// failed (the source node lost for good) puts the PV back on the old node
// and leaves the data there untouched and nothing on the target; a target
// without room is refused before anything changes.
func TestVolumeMoveFaults(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c, kube := startMoveNodes(t, moveGate, 500*mi, 300*mi)
	ctx := context.Background()
	parent := t
	for _, side := range []string{"node-0", "node-1"} {
		t.Run("restart "+side, func(t *testing.T) {
			name := "restart-" + side
			id, want := blockClaim(t, c, kube, name, 8*mi)
			annotateMove(t, kube, name, "node-1")
			moveOf(t, c, id, "bytes arriving", moving)
			p := c.nodes[side]
			p.Stop(t)
			time.Sleep(time.Second)
			c.nodes[side] = c.env.StartNodeWith(parent, p.Dir, p.Opts)
			waitEvent(t, kube, "PersistentVolumeClaim", name, "VolumeMoved", "moved to node node-1")
			if got, err := imageOf(c.nodes["node-1"], id); err != nil || !bytes.Equal(got, want) {
				t.Errorf("the image on node-1 differs (%d bytes, %v)", len(got), err)
			}
			if _, err := imageOf(c.nodes["node-0"], id); !os.IsNotExist(err) {
				t.Errorf("the image is still on node-0 (%v)", err)
			}
			if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
				t.Errorf("left behind on node-1: %v", left)
			}
		})
	}

	t.Run("no room", func(t *testing.T) {
		// node-1 holds the two volumes moved above: 172 MiB are left.
		filler, err := c.create(ctx, "filler", 130*mi, &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-1")}})
		if err != nil {
			t.Fatal(err)
		}
		id, want := blockClaim(t, c, kube, "noroom", 2*mi)
		annotateMove(t, kube, "noroom", "node-1")
		waitEvent(t, kube, "PersistentVolumeClaim", "noroom", "VolumeMoveRefused", "node node-1 cannot take")
		if got := pvAffinity(t, kube, "noroom"); got != contract.TopologyKey+"=node-0" {
			t.Errorf("PV affinity %s, want node-0", got)
		}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, &v1.LocalVolume{}); !apierrors.IsNotFound(err) {
			t.Errorf("a move object without room: %v", err)
		}
		if got, err := imageOf(c.nodes["node-0"], id); err != nil || !bytes.Equal(got, want) {
			t.Errorf("the image on node-0 changed (%v)", err)
		}
		annotateMove(t, kube, "noroom", "")
		if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: filler.GetVolumeId()}); err != nil {
			t.Fatal(err)
		}
	})

	// stopped checks that a move of id that did not happen left the PV
	// and the data on node-0 and nothing on node-1.
	stopped := func(t *testing.T, name, id string, want []byte) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); pvAffinity(t, kube, name) != contract.TopologyKey+"=node-0"; time.Sleep(100 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("PV affinity %s, want node-0 again", pvAffinity(t, kube, name))
			}
		}
		lv := &v1.LocalVolume{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: id}, lv); err != nil || lv.Spec.Node != "node-0" || lv.Deleting() {
			t.Errorf("LocalVolume %v %+v, want it on node-0 as before", err, lv.Spec)
		}
		if got, err := imageOf(c.nodes["node-0"], id); err != nil || !bytes.Equal(got, want) {
			t.Errorf("the image on node-0 differs (%d bytes, %v)", len(got), err)
		}
	}

	t.Run("called off", func(t *testing.T) {
		id, want := blockClaim(t, c, kube, "calledoff", 8*mi)
		annotateMove(t, kube, "calledoff", "node-1")
		moveOf(t, c, id, "bytes arriving", moving)
		// Its size and parameters are the move's until it is done.
		if _, err := c.ctrl.Controller.ControllerExpandVolume(ctx, &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csi.CapacityRange{RequiredBytes: 96 * mi}}); status.Code(err) != codes.Aborted || !strings.Contains(err.Error(), "being moved") {
			t.Errorf("ControllerExpandVolume during a move: %v, want ABORTED saying it is being moved", err)
		}
		annotateMove(t, kube, "calledoff", "")
		waitEvent(t, kube, "PersistentVolumeClaim", "calledoff", "VolumeMoveCalledOff", "called off")
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
			err := c.env.Client.Get(ctx, client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, &v1.LocalVolume{})
			if apierrors.IsNotFound(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the move object of a called-off move stays: %v", err)
			}
		}
		stopped(t, "calledoff", id, want)
		if _, err := imageOf(c.nodes["node-1"], id); !os.IsNotExist(err) {
			t.Errorf("a called-off move left the image on node-1 (%v)", err)
		}
		if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
			t.Errorf("left behind on node-1: %v", left)
		}
	})

	t.Run("source lost", func(t *testing.T) {
		// 12 s at 2 MiB/s: the copy is still running when node-0 stops.
		id, want := blockClaim(t, c, kube, "lost", 24*mi)
		annotateMove(t, kube, "lost", "node-1")
		moveOf(t, c, id, "bytes arriving", moving)
		c.nodes["node-0"].Stop(t)
		ln := &v1.LocalNode{}
		if err := c.env.Client.Get(ctx, client.ObjectKey{Name: "node-0"}, ln); err != nil {
			t.Fatal(err)
		}
		old := ln.DeepCopy()
		ln.Status.Heartbeat.Time = time.Now().Add(-11 * time.Minute)
		if err := c.env.Client.Status().Patch(ctx, ln, client.MergeFrom(old)); err != nil {
			t.Fatal(err)
		}
		msg := waitEvent(t, kube, "PersistentVolumeClaim", "lost", "VolumeMoveFailed", "node-0")
		t.Logf("source lost: %s", msg)
		stopped(t, "lost", id, want)
		if _, err := imageOf(c.nodes["node-1"], id); !os.IsNotExist(err) {
			t.Errorf("a failed move left the image on node-1 (%v)", err)
		}
		if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
			t.Errorf("left behind on node-1: %v", left)
		}
	})
}

// TestVolumeMoveCalledOffWhileTargetDown: a move called off while its
// target's node plugin is down (its move object cannot go yet), asked for
// again and called off again: the PV points at the volume's node again,
// and once the target is back the move object goes.
func TestVolumeMoveCalledOffWhileTargetDown(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c, kube := startMoveNodes(t, moveGate, 300*mi, 300*mi)
	name := "stuck"
	id, _ := blockClaim(t, c, kube, name, 8*mi)
	annotateMove(t, kube, name, "node-1")
	moveOf(t, c, id, "bytes arriving", moving)
	p := c.nodes["node-1"]
	p.Stop(t)
	annotateMove(t, kube, name, "")
	waitEvent(t, kube, "PersistentVolumeClaim", name, "VolumeMoveCalledOff", "called off")
	time.Sleep(2 * time.Second)
	t.Logf("after call-off: %s", pvAffinity(t, kube, name))
	annotateMove(t, kube, name, "node-1")
	time.Sleep(3 * time.Second)
	t.Logf("after re-add: %s", pvAffinity(t, kube, name))
	annotateMove(t, kube, name, "")
	c.nodes["node-1"] = c.env.StartNodeWith(t, p.Dir, p.Opts)
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(time.Second) {
		if err := c.env.Client.Get(context.Background(), client.ObjectKey{Name: contract.VolumeMoveName(id, "node-1")}, &v1.LocalVolume{}); apierrors.IsNotFound(err) {
			break
		}
	}
	time.Sleep(5 * time.Second)
	if got := pvAffinity(t, kube, name); got != contract.TopologyKey+"=node-0" {
		t.Errorf("no move object, no annotation, and the PV's affinity is %s, want node-0", got)
	}
}

// TestDeleteVolumeDuringMove: DeleteVolume of a volume whose move's copy
// is complete while the target's node plugin is down: once the target is
// back its copy is removed too — never re-adopted as a volume of its own.
func TestDeleteVolumeDuringMove(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	c, _ := startMoveNodes(t, moveGate, 300*mi, 300*mi)
	ctx := context.Background()
	vol, err := c.create(ctx, "leak", 16*mi, &csi.TopologyRequirement{Requisite: []*csi.Topology{topologyOf("node-0")}})
	if err != nil {
		t.Fatal(err)
	}
	id := vol.GetVolumeId()
	lv := &v1.LocalVolume{}
	if err := c.env.Client.Get(ctx, client.ObjectKey{Name: id}, lv); err != nil {
		t.Fatal(err)
	}
	// The move object the mover would place.
	mv := &v1.LocalVolume{
		ObjectMeta: metav1.ObjectMeta{Name: contract.VolumeMoveName(id, "node-1"), Labels: map[string]string{v1.MoveOfLabel: id, v1.NodeLabel: "node-1"}},
		Spec:       *lv.Spec.DeepCopy(),
	}
	mv.Spec.Node, mv.Spec.MoveOf, mv.Spec.ContentSource = "node-1", id, &v1.ContentSource{Volume: id, Node: "node-0"}
	if err := c.env.Client.Create(ctx, mv); err != nil {
		t.Fatal(err)
	}
	moveOf(t, c, id, "Ready", func(m *v1.LocalVolume) bool { return m.Status.Phase == v1.PhaseReady })
	p := c.nodes["node-1"]
	p.Stop(t)
	if _, err := c.ctrl.Controller.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		got := &v1.LocalVolume{}
		err := c.env.Client.Get(ctx, client.ObjectKey{Name: id}, got)
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("volume not deleted: %v %+v", err, got.Spec)
		}
	}
	c.nodes["node-1"] = c.env.StartNodeWith(t, p.Dir, p.Opts)
	time.Sleep(20 * time.Second)
	got := &v1.LocalVolume{}
	err = c.env.Client.Get(ctx, client.ObjectKey{Name: id}, got)
	t.Logf("after DeleteVolume: LocalVolume %s: %v (node %q, labels %v)", id, err, got.Spec.Node, got.Labels)
	if err == nil {
		t.Errorf("a deleted volume's data lives on node-1 as LocalVolume %s", id)
	}
	if _, err := os.Stat(filepath.Join(c.nodes["node-1"].Opts.DataRoot, "volumes", id)); !os.IsNotExist(err) {
		t.Errorf("a deleted volume's data is still on node-1 (%v)", err)
	}
}

// TestVolumeMoveTargetOutOfRoom fills the target's filesystem in the middle
// of a move: the move fails with the reason (VolumeMoveFailed), the PV
// points at the old node again, the data there is untouched, and nothing
// of the volume stays on the target.
func TestVolumeMoveTargetOutOfRoom(t *testing.T) {
	t.Parallel() // mostly waits (slowed copies, rechecks): runs beside the others
	env := clustertest.StartWithFeatureGates(t, moveGate)
	c := &fixture{env: env, nodes: map[string]*clustertest.Plugin{}}
	small := testfs.New(t, testfs.XFSReflink, 320*mi)
	for i, mutate := range []func(*driver.Options){
		func(o *driver.Options) { o.TransferAddress = "127.0.0.1:0" },
		func(o *driver.Options) { o.TransferAddress = "127.0.0.1:0"; o.DataRoot = filepath.Join(small, "data") },
	} {
		name := fmt.Sprintf("node-%d", i)
		c.nodes[name] = env.StartNode(t, name, mutate)
		env.WaitLocalNode(t, name)
	}
	c.ctrl = env.StartController(t, nil)
	kube, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	id, want := blockClaim(t, c, kube, "full", 24*mi)
	annotateMove(t, kube, "full", "node-1")
	moveOf(t, c, id, "bytes arriving", moving)
	// Another tenant of the filesystem takes all but 1 MiB.
	var st unix.Statfs_t
	if err := unix.Statfs(small, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(small, "filler"))
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Fallocate(int(f.Fd()), 0, 0, int64(st.Bavail)*st.Bsize-mi); err != nil {
		t.Fatal(err)
	}
	f.Close()
	msg := waitEvent(t, kube, "PersistentVolumeClaim", "full", "VolumeMoveFailed", "node-0")
	t.Logf("target out of room: %s", msg)
	for deadline := time.Now().Add(time.Minute); pvAffinity(t, kube, "full") != contract.TopologyKey+"=node-0"; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("PV affinity %s, want node-0 again", pvAffinity(t, kube, "full"))
		}
	}
	if got, err := imageOf(c.nodes["node-0"], id); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the image on node-0 differs (%d bytes, %v)", len(got), err)
	}
	if _, err := imageOf(c.nodes["node-1"], id); !os.IsNotExist(err) {
		t.Errorf("a failed move left the image on node-1 (%v)", err)
	}
	if left := creating(t, c.nodes["node-1"]); len(left) != 0 {
		t.Errorf("left behind on node-1: %v", left)
	}
}
