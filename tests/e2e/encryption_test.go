//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// encryptedClass creates a WaitForFirstConsumer ext4 StorageClass with
// encryption: fscrypt whose node-stage Secret is secret in the PVC's
// namespace; it is deleted with the test. fsType "" makes it a class of
// directory volumes.
func encryptedClass(t *testing.T, name, secret string, fsType ...string) string {
	t.Helper()
	ctx := context.Background()
	wffc, del := storagev1.VolumeBindingWaitForFirstConsumer, corev1.PersistentVolumeReclaimDelete
	sc := &storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Provisioner: harness.DriverName,
		VolumeBindingMode: &wffc, ReclaimPolicy: &del,
		Parameters: map[string]string{
			"csi.storage.k8s.io/fstype":                      "ext4",
			"encryption":                                     "fscrypt",
			"csi.storage.k8s.io/node-stage-secret-name":      secret,
			"csi.storage.k8s.io/node-stage-secret-namespace": "${pvc.namespace}",
		}}
	if len(fsType) > 0 && fsType[0] == "" {
		delete(sc.Parameters, "csi.storage.k8s.io/fstype")
	}
	if _, err := kc.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kc.StorageV1().StorageClasses().Delete(ctx, name, metav1.DeleteOptions{}) })
	return name
}

func keySecret(t *testing.T, ns, name string) {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, StringData: map[string]string{"key": hex.EncodeToString(k)}}
	if _, err := kc.CoreV1().Secrets(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// imageAttached reports whether a loop device is attached to the image
// file named name (<volume id>.img), by the backing files in sysfs (the
// kernel names them as seen from the node's mount namespace: a suffix).
func imageAttached(t *testing.T, name string) bool {
	t.Helper()
	for _, file := range csitest.Loops(t) {
		if strings.HasSuffix(strings.TrimSuffix(file, " (deleted)"), "/"+name) {
			return true
		}
	}
	return false
}

// An encrypted PVC (encryption: fscrypt, the key in a Secret of the PVC's
// namespace): the pod writes; the image file on the node's disk never
// holds the plaintext; once the pod is gone and the volume unstaged, the
// names under the volume's data directory are ciphertext; a new pod reads
// the data back; a restore of its snapshot in a class whose Secret holds
// another key leaves its pod ContainerCreating with an Event that says so.
func TestEncryptedVolume(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "encryption")
	keySecret(t, ns, "volume-key")
	keySecret(t, ns, "other-key")
	sc := encryptedClass(t, "e2e-encrypted", "volume-key")
	wrong := encryptedClass(t, "e2e-encrypted-other-key", "other-key")

	createPVC(t, ns, "data", sc, "64Mi")
	marker := "localdir-e2e-plaintext-marker"
	createPod(t, ns, "writer", pvcVolume("data", "/data"))
	waitPodRunning(t, ns, "writer", 2*time.Minute)
	podExec(t, ns, "writer", "for i in $(seq 2000); do echo "+marker+"; done > /data/notes && sync")
	if out := podExec(t, ns, "writer", "ls -A /data"); strings.TrimSpace(out) != "notes" {
		t.Fatalf("the pod sees %q in its volume; want only its file", out)
	}
	n := pvNode(t, ns, "data")
	_, id := volumeID(t, ns, "data")
	var img string
	for _, p := range onNodeDisk(t, n, id) {
		if strings.HasSuffix(p, ".img") {
			img = n.Path(harness.DataRoot + p)
		}
	}
	if img == "" {
		t.Fatalf("no image file of volume %s on node %s", id, n.Name)
	}
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte(marker)) || bytes.Contains(raw, []byte("notes")) {
		t.Fatal("the image file on the node's disk holds the pod's plaintext")
	}
	snapshotOf(t, ns, "snap", "data")

	deletePod(t, ns, "writer")
	waitFor(t, "the volume unstaged (its loop device detached)", 2*time.Minute, func() (bool, error) {
		return !imageAttached(t, filepath.Base(img)), nil
	})
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-o", "loop,ro", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount the image read-only: %v: %s", err, out)
	}
	ents, err := os.ReadDir(filepath.Join(mnt, "data"))
	if out, uerr := exec.Command("umount", mnt).CombinedOutput(); uerr != nil {
		t.Errorf("umount %s: %v: %s", mnt, uerr, out)
	}
	if err != nil || len(ents) != 1 || ents[0].Name() == "notes" {
		t.Fatalf("names under the unstaged volume's data directory: %v, %v; want one encrypted name", ents, err)
	}

	createPod(t, ns, "reader", pvcVolume("data", "/data"))
	waitPodRunning(t, ns, "reader", 2*time.Minute)
	if out := podExec(t, ns, "reader", "grep -c "+marker+" /data/notes"); strings.TrimSpace(out) != "2000" {
		t.Fatalf("the data read back: %q lines; want 2000", out)
	}

	createPVC(t, ns, "restored", wrong, "64Mi", withSource("VolumeSnapshot", "snap"))
	createPod(t, ns, "wrongkey", pvcVolume("restored", "/data"), onNode(n.Name))
	var why string
	waitFor(t, "a FailedMount Event saying the key does not unlock the volume", 3*time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "Pod", "wrongkey") {
			if strings.HasPrefix(e, "FailedMount") && strings.Contains(e, "does not unlock") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	p, err := kc.CoreV1().Pods(ns).Get(context.Background(), "wrongkey", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Fatalf("pod wrongkey is %s; want Pending (ContainerCreating)", p.Status.Phase)
	}
	t.Logf("encrypted volume %s on %s: image without plaintext, locked after unstage, read back; wrong key: %s", id, n.Name, why)
}

// An encrypted directory volume (a class without fstype) on nodes whose
// data roots cannot encrypt (btrfs, xfs): the PVC stays Pending with a
// ProvisioningFailed Event that says why and what to use instead.
func TestEncryptedDirectoryVolumeRefused(t *testing.T) {
	needCluster(t)
	ns := namespace(t, "encryption-dir")
	keySecret(t, ns, "volume-key")
	sc := encryptedClass(t, "e2e-encrypted-dir", "volume-key", "")
	createPVC(t, ns, "data", sc, "64Mi")
	createPod(t, ns, "writer", pvcVolume("data", "/data"))
	var why string
	waitFor(t, "a ProvisioningFailed Event saying the data root cannot encrypt", 3*time.Minute, func() (bool, error) {
		for _, e := range events(t, ns, "PersistentVolumeClaim", "data") {
			if strings.HasPrefix(e, "ProvisioningFailed") && strings.Contains(e, "cannot encrypt") && strings.Contains(e, "fstype: ext4") {
				why = e
				return true, nil
			}
		}
		return false, nil
	})
	pvc, err := kc.CoreV1().PersistentVolumeClaims(ns).Get(context.Background(), "data", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending {
		t.Fatalf("PVC data is %s; want Pending", pvc.Status.Phase)
	}
	t.Logf("encrypted directory volume on a data root that cannot encrypt: %s", why)
}
