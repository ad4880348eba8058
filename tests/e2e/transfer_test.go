//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/transfer"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// Restores and clones onto another node than their source's, through the
// node-to-node channel (pkg/transfer): btrfs → XFS and XFS → btrfs, for a
// directory, an ext4 image and a raw block volume. Each copy is checked
// byte for byte in a pod on its node, and its LocalVolume reports the
// transfer done.
func TestMultiNodeRestoreCloneAcrossNodes(t *testing.T) {
	needNodes(t, 2)
	ns := namespace(t, "across")
	for i, tc := range []struct {
		name, class string
		block, snap bool
		from, to    *harness.Node
	}{
		{"dir-restore", scWFFC, false, true, cl.Nodes[0], cl.Nodes[1]},
		{"dir-clone", scWFFC, false, false, cl.Nodes[1], cl.Nodes[0]},
		{"ext4-restore", scExt4, false, true, cl.Nodes[1], cl.Nodes[0]},
		{"block-restore", scWFFC, true, true, cl.Nodes[0], cl.Nodes[1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts []pvcOpt
			path, write, read := "/data", "head -c 3145728 /dev/urandom > /data/blob && sync && md5sum /data/blob", "md5sum /data/blob"
			if tc.block {
				opts = append(opts, block)
				path = "/dev/xvda"
				write = "head -c 3145728 /dev/urandom > /tmp/blob && dd if=/tmp/blob of=/dev/xvda bs=1M seek=5 conv=fsync 2>/dev/null && md5sum /tmp/blob"
				read = "dd if=/dev/xvda bs=1M skip=5 count=3 2>/dev/null | md5sum"
			}
			src, dst := fmt.Sprintf("src%d", i), fmt.Sprintf("dst%d", i)
			createPVC(t, ns, src, tc.class, "64Mi", opts...)
			createPod(t, ns, src, pvcVolume(src, path), onNode(tc.from.Name))
			waitPodRunning(t, ns, src, 2*time.Minute)
			sum := strings.Fields(podExec(t, ns, src, write))[0]
			source := withSource("PersistentVolumeClaim", src)
			if tc.snap {
				snapshotOf(t, ns, "snap"+src, src)
				source = withSource("VolumeSnapshot", "snap"+src)
			}
			createPVC(t, ns, dst, tc.class, "96Mi", append(opts, source)...)
			createPod(t, ns, dst, pvcVolume(dst, path), onNode(tc.to.Name))
			waitPodRunning(t, ns, dst, 3*time.Minute)
			if got := strings.Fields(podExec(t, ns, dst, read))[0]; got != sum {
				t.Fatalf("the copy on %s holds md5 %s, the source on %s %s", tc.to.Name, got, tc.from.Name, sum)
			}
			if on := pvNode(t, ns, dst); on != tc.to {
				t.Fatalf("the copy's PV is pinned to %s, want %s", on.Name, tc.to.Name)
			}
			_, id := volumeID(t, ns, dst)
			mustBeOnlyOn(t, id, tc.to)
			lv := localVolume(t, id)
			from, _, _ := unstructured.NestedString(lv.Object, "spec", "contentSource", "node")
			done, _, _ := unstructured.NestedString(lv.Object, "status", "transfer", "completionTime")
			moved, _, _ := unstructured.NestedString(lv.Object, "status", "transfer", "bytesDone")
			if from != tc.from.Name || done == "" {
				t.Fatalf("LocalVolume %s: contentSource.node %q, transfer completed %q; want %s and a time", id, from, done, tc.from.Name)
			}
			// Only data crosses: about 3 MiB of a 64 MiB volume (plus a
			// filesystem's metadata for the image).
			if tc.block && mustQuantity(moved) > 8<<20 {
				t.Errorf("%s crossed for 3 MiB of data in a 64 MiB raw block volume", moved)
			}
			// The PVC's Events say what happened.
			var said []string
			waitFor(t, "the PVC's TransferDone Event", time.Minute, func() (bool, error) {
				said = events(t, ns, "PersistentVolumeClaim", dst)
				return slices.ContainsFunc(said, func(e string) bool { return strings.Contains(e, "TransferDone") }), nil
			})
			t.Logf("%s: %s → %s, %s moved, md5 %s; events %q", tc.name, tc.from.Name, tc.to.Name, moved, sum, said)
		})
	}
}

// transferEndpoint is what node n's plugin published for its peers.
func transferEndpoint(t *testing.T, n *harness.Node) (address, cert string) {
	t.Helper()
	u, err := dyn.Resource(gvrLocalNode).Get(context.Background(), n.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	address, _, _ = unstructured.NestedString(u.Object, "status", "transfer", "address")
	cert, _, _ = unstructured.NestedString(u.Object, "status", "transfer", "certificate")
	if address == "" || cert == "" {
		t.Fatalf("LocalNode %s publishes no transfer endpoint: %v", n.Name, u.Object["status"])
	}
	return address, cert
}

// An attacker on the pod network — here the host, which sits on every pod
// bridge — tries to pull a volume from a node plugin: without a client
// certificate, with a self-signed one under the other node's name, for a
// volume nobody is moving and for one that exists. Every attempt is
// refused before a byte of data is sent.
func TestMultiNodeTransferRefusesStrangers(t *testing.T) {
	needNodes(t, 2)
	ns := namespace(t, "stranger")
	victim := cl.Nodes[0]
	createPVC(t, ns, "secret", scWFFC, "32Mi")
	createPod(t, ns, "secret", pvcVolume("secret", "/data"), onNode(victim.Name))
	waitPodRunning(t, ns, "secret", 2*time.Minute)
	podExec(t, ns, "secret", "echo confidential > /data/secret && sync")
	_, id := volumeID(t, ns, "secret")
	address, cert := transferEndpoint(t, victim)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// No client certificate: the TLS handshake fails.
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", address, &tls.Config{InsecureSkipVerify: true})
	if err == nil {
		_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Write([]byte("GET /v1/volumes/" + id + " HTTP/1.1\r\nHost: x\r\n\r\n"))
		if err == nil {
			buf := make([]byte, 64)
			var n int
			n, err = conn.Read(buf)
			if err == nil {
				t.Fatalf("a client without a certificate was answered %q", buf[:n])
			}
		}
		conn.Close()
	}
	t.Logf("no certificate: %v", err)

	// A self-signed key claiming to be the other node, for the volume and
	// for an id nobody uses.
	forged, err := transfer.NewIdentity(cl.Nodes[1].Name, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c := &transfer.Client{Identity: forged}
	for _, vid := range []string{id, "vol-00000000000000000000000000000000"} {
		body, err := c.Pull(ctx, victim.Name, address, cert, vid, "")
		if err == nil {
			body.Close()
			t.Fatalf("a forged key pulled volume %s", vid)
		}
		if !errors.Is(err, contract.ErrRefused) && !errors.Is(err, contract.ErrNotFound) {
			t.Fatalf("a forged key pulling %s: %v, want refused or not found", vid, err)
		}
		t.Logf("forged key, volume %s: %v", vid, err)
	}
	// A server that is not the published one is refused by the client:
	// the other node's address with the victim's certificate pinned.
	otherAddr, _ := transferEndpoint(t, cl.Nodes[1])
	if body, err := c.Pull(ctx, victim.Name, otherAddr, cert, id, ""); err == nil || !strings.Contains(err.Error(), "not the one its node published") {
		if body != nil {
			body.Close()
		}
		t.Fatalf("a server with another key: %v, want the client to refuse it", err)
	}
	// The volume is untouched and no copy of it exists anywhere else.
	if got := strings.TrimSpace(podExec(t, ns, "secret", "cat /data/secret")); got != "confidential" {
		t.Fatalf("the volume holds %q", got)
	}
	mustBeOnlyOn(t, id, victim)
}

// slowRestore starts restoring a snapshot of a volume on from holding
// 48 MiB of random data onto to, at 2 MiB/s (the transferBandwidth
// parameter: far more than the sockets' buffers hold stays to be sent
// for 20 s), and waits until bytes arrive. It returns the restored
// LocalVolume's name, the data's md5 and a reader of its transfer status.
func slowRestore(t *testing.T, ns string, from, to *harness.Node) (id, sum string, field func(string) string) {
	t.Helper()
	class := "e2e-slow-transfer"
	wffc, del := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete
	if _, err := kc.StorageV1().StorageClasses().Create(context.Background(), &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{Name: class}, Provisioner: harness.DriverName, VolumeBindingMode: &wffc, ReclaimPolicy: &del,
		Parameters: map[string]string{contract.ParamTransferBandwidth: "2Mi"},
	}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	createPVC(t, ns, "src", class, "96Mi")
	createPod(t, ns, "src", pvcVolume("src", "/data"), onNode(from.Name))
	waitPodRunning(t, ns, "src", 2*time.Minute)
	sum = writeBlob(t, ns, "src", "/data/blob", "48Mi")
	snapshotOf(t, ns, "snap", "src")
	claim := createPVC(t, ns, "dst", class, "96Mi", withSource("VolumeSnapshot", "snap"))
	createPod(t, ns, "dst", pvcVolume("dst", "/data"), onNode(to.Name))
	id = lcluster.VolumeIDFor("pvc-" + string(claim.UID))
	field = func(f string) string {
		lv := localVolume(t, id)
		if lv == nil {
			return ""
		}
		v, _, _ := unstructured.NestedFieldNoCopy(lv.Object, "status", "transfer", f)
		return fmt.Sprint(v)
	}
	waitFor(t, "bytes arriving on "+to.Name, 2*time.Minute, func() (bool, error) {
		d := field("bytesDone")
		return d != "" && d != "<nil>" && d != "0", nil
	})
	return id, sum, field
}

// restoredIntact waits for the slowRestore's pod and checks its bytes and
// that the transfer needed more than one attempt.
func restoredIntact(t *testing.T, ns, sum string, field func(string) string) {
	t.Helper()
	waitPodRunning(t, ns, "dst", 4*time.Minute)
	if got := md5In(t, ns, "dst", "/data/blob"); got != sum {
		t.Fatalf("restored: md5 %s, the source %s", got, sum)
	}
	if a := field("attempts"); a == "1" {
		t.Errorf("one attempt: the fault went unnoticed")
	}
	t.Logf("restored after %s attempts", field("attempts"))
}

// The network between the two nodes' pods is cut in the middle of a
// transfer (nftables on the host, between the harness's pod subnets): the
// LocalVolume says it is retrying and why, and once the path is back the
// restore finishes with the right bytes.
func TestMultiNodeTransferNetworkCut(t *testing.T) {
	needNodes(t, 2)
	ns := namespace(t, "netcut")
	from, to := cl.Nodes[0], cl.Nodes[1]
	id, sum, field := slowRestore(t, ns, from, to)
	heal, err := cl.CutPodNetwork(context.Background(), from, to)
	if err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = heal()
		}
	}()
	var why string
	waitFor(t, "the LocalVolume to report the transfer retrying", 2*time.Minute, func() (bool, error) {
		lv := localVolume(t, id)
		conds, _, _ := unstructured.NestedSlice(lv.Object, "status", "conditions")
		for _, c := range conds {
			m := c.(map[string]any)
			if m["type"] == "Ready" && m["reason"] == "TransferRetrying" {
				why = fmt.Sprint(m["message"])
				return true, nil
			}
		}
		return false, nil
	})
	t.Logf("while cut: %s", why)
	if err := heal(); err != nil {
		t.Fatal(err)
	}
	healed = true
	restoredIntact(t, ns, sum, field)
}

// The node plugin of the source, then of the target, is killed (SIGKILL)
// in the middle of a transfer: the kubelet restarts it, the transfer starts
// over, and the restore holds the right bytes; nothing half-made is left on
// the target's disk.
func TestMultiNodeTransferPluginKilled(t *testing.T) {
	needNodes(t, 2)
	for _, side := range []string{"source", "target"} {
		t.Run(side, func(t *testing.T) {
			ns := namespace(t, "killed-"+side)
			from, to := cl.Nodes[1], cl.Nodes[0]
			_, sum, field := slowRestore(t, ns, from, to)
			victim := from
			if side == "target" {
				victim = to
			}
			ctx := context.Background()
			if err := victim.KillPlugin(ctx); err != nil {
				t.Fatal(err)
			}
			if err := victim.WaitPluginRestarted(ctx); err != nil {
				t.Fatal(err)
			}
			restoredIntact(t, ns, sum, field)
			if left := onNodeDisk(t, to, ".creating-"); len(left) != 0 {
				t.Errorf("left on %s: %v", to.Name, left)
			}
		})
	}
}
