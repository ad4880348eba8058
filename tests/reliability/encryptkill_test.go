package reliability

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// TestKillDuringEncryptedStageAndUnstage: the driver is SIGKILLed at
// moments spread over NodeStageVolume and NodeUnstageVolume of an
// encrypted volume, an ext4 image volume (the key is added after the mount
// and removed before the unmount) and a directory volume on an ext4 data
// root with the encrypt feature (the key is added before the bind mount
// and removed after the unmount, on the data root's keyring). After each
// restart the kubelet's retry of the same call succeeds: a stage shows the
// data written before, with the key present; an unstage leaves no mount at
// the staging path, no loop device and the key absent. Nothing is left
// unlocked that is not staged: an image volume's keyring goes with its
// filesystem's unmount, and the restart removes the key of a directory
// volume that is not mounted.
func TestKillDuringEncryptedStageAndUnstage(t *testing.T) {
	testdriver.RequireRoot(t)
	for _, k := range []struct {
		name, dataRoot string
		c              *csi.VolumeCapability
		// data is the directory the volume's files are in, staged at
		// staging; keyring is a path on the filesystem whose keyring
		// holds its key, "" when there is none (an image volume not
		// mounted: its keyring went with its filesystem).
		data    func(staging string) string
		keyring func(staging, dataRoot string) string
	}{
		{"image", testfs.Ext4, csitest.MntCapFS("ext4"),
			func(staging string) string { return filepath.Join(staging, publish.EncryptedDataDir) },
			func(staging, _ string) string {
				if len(csitest.MountsAt(t, staging)) == 0 {
					return ""
				}
				return staging
			}},
		{"directory", testfs.Ext4Crypt, csitest.MntCap(),
			func(staging string) string { return staging },
			func(_, dataRoot string) string { return dataRoot }},
	} {
		t.Run(k.name, func(t *testing.T) {
			dir := testdriver.TempDir(t)
			dataRoot := filepath.Join(testfs.New(t, k.dataRoot, 1<<30), "data")
			p, ctl, node := procClients(t, dir, dataRoot)
			r, err := ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
				Name: "encrypted", CapacityRange: csitest.Range(64*csitest.Mi, 0), Parameters: map[string]string{"encryption": "fscrypt"},
				VolumeCapabilities: []*csi.VolumeCapability{k.c},
			})
			if err != nil {
				t.Fatal(err)
			}
			id := r.GetVolume().GetVolumeId()
			secrets := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(3, 32))}
			staging := csitest.Mkdir(t, filepath.Join(dir, "staging"))
			stage := func(n csi.NodeClient) error {
				_, err := n.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: k.c, Secrets: secrets})
				return err
			}
			unstage := func(n csi.NodeClient) error {
				_, err := n.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
				return err
			}
			data := csitest.RandomBytes(4, 256<<10)
			if err := stage(node); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(k.data(staging), "kept"), data, 0o600); err != nil {
				t.Fatal(err)
			}
			kid, _, err := fscrypt.Policy(k.data(staging))
			if err != nil {
				t.Fatal(err)
			}
			if err := unstage(node); err != nil {
				t.Fatal(err)
			}
			keyStatus := func() fscrypt.KeyStatus {
				t.Helper()
				at := k.keyring(staging, dataRoot)
				if at == "" {
					return fscrypt.KeyAbsent
				}
				st, err := fscrypt.Status(at, kid)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}

			rounds := 0
			for i := range 16 {
				for _, call := range []struct {
					name string
					do   func(csi.NodeClient) error
				}{{"NodeStageVolume", stage}, {"NodeUnstageVolume", unstage}} {
					delay := time.Duration(i*4) * time.Millisecond
					done := make(chan error, 1)
					go func() { done <- call.do(node) }()
					time.Sleep(delay)
					p.Kill()
					<-done
					p, _, node = procClients(t, dir, dataRoot)
					if len(csitest.MountsAt(t, staging)) == 0 {
						if st := keyStatus(); st != fscrypt.KeyAbsent {
							t.Fatalf("round %d: key %s after a restart %v into %s, not staged; want absent", i, st, delay, call.name)
						}
					}
					if err := call.do(node); err != nil {
						t.Fatalf("round %d: %s retried after a kill %v into it: %v", i, call.name, delay, err)
					}
					mounted := len(csitest.MountsAt(t, staging)) > 0
					switch call.name {
					case "NodeStageVolume":
						if !mounted {
							t.Fatalf("round %d: not mounted after the retried stage", i)
						}
						if st := keyStatus(); st != fscrypt.KeyPresent {
							t.Fatalf("round %d: key %s after the retried stage; want present", i, st)
						}
						b, err := os.ReadFile(filepath.Join(k.data(staging), "kept"))
						if err != nil || !bytes.Equal(b, data) {
							t.Fatalf("round %d: the data after the retried stage: %v (%d bytes)", i, err, len(b))
						}
					default:
						if mounted {
							t.Fatalf("round %d: still mounted after the retried unstage", i)
						}
						if loops := csitest.LoopsBelow(t, dataRoot); len(loops) != 0 {
							t.Fatalf("round %d: loop devices after the retried unstage: %v", i, loops)
						}
						if st := keyStatus(); st != fscrypt.KeyAbsent {
							t.Fatalf("round %d: key %s after the retried unstage; want absent", i, st)
						}
					}
					rounds++
				}
			}
			t.Logf("%d kills at 0–60 ms into NodeStageVolume and NodeUnstageVolume of an encrypted %s volume: every retry succeeded", rounds, k.name)
		})
	}
}

// TestRestartLocksEncryptedDirectory: a directory volume on an ext4 data
// root with the encrypt feature whose key is in the data root's keyring
// while nothing mounts it — what a driver killed between unmounting and
// removing the key leaves (made here by unmounting behind its back) — is
// locked by the next start: the key is absent, the names are ciphertext,
// and the next stage opens it again. So is a key that only a snapshot
// holds data of (its volume deleted while the key was left): the snapshot
// is ciphertext after the restart, and its restore, made without the key,
// is filled and opens at its first stage.
func TestRestartLocksEncryptedDirectory(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	dataRoot := filepath.Join(testfs.New(t, testfs.Ext4Crypt, 1<<30), "data")
	p, ctl, node := procClients(t, dir, dataRoot)
	create := func(name string, src *csi.VolumeContentSource) string {
		t.Helper()
		r, err := ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: csitest.Range(64*csitest.Mi, 0), Parameters: map[string]string{"encryption": "fscrypt"},
			VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, VolumeContentSource: src,
		})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetVolume().GetVolumeId()
	}
	secrets := map[string]string{fscrypt.SecretPassphrase: "correct horse battery staple"}
	staging := csitest.Mkdir(t, filepath.Join(dir, "staging"))
	stage := func(id string) {
		t.Helper()
		if _, err := node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
			VolumeCapability: csitest.MntCap(), Secrets: secrets}); err != nil {
			t.Fatal(err)
		}
	}
	unstage := func(id string) {
		t.Helper()
		if _, err := node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatal(err)
		}
	}
	umountBehindBack := func() {
		t.Helper()
		if out, err := exec.Command("umount", staging).CombinedOutput(); err != nil {
			t.Fatalf("umount %s: %v: %s", staging, err, out)
		}
	}
	keyStatus := func(kid fscrypt.Identifier) fscrypt.KeyStatus {
		t.Helper()
		st, err := fscrypt.Status(dataRoot, kid)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	restart := func() {
		t.Helper()
		p.Kill()
		p, ctl, node = procClients(t, dir, dataRoot)
	}
	lockedNames := func(what, d string) {
		t.Helper()
		if names := csitest.DirNames(t, d); len(names) != 1 || names[0] == "kept" {
			t.Fatalf("names in %s after the restart: %q; want one encrypted name", what, names)
		}
	}

	id := create("encrypted", nil)
	stage(id)
	if err := os.WriteFile(filepath.Join(staging, "kept"), []byte("kept"), 0o600); err != nil {
		t.Fatal(err)
	}
	kid, _, err := fscrypt.Policy(staging)
	if err != nil {
		t.Fatal(err)
	}
	umountBehindBack()
	if st := keyStatus(kid); st != fscrypt.KeyPresent {
		t.Fatalf("key %s after the unmount behind the driver's back; want still present", st)
	}
	restart()
	if st := keyStatus(kid); st != fscrypt.KeyAbsent {
		t.Fatalf("key %s after the restart; want absent", st)
	}
	lockedNames("the volume", filepath.Join(dataRoot, "volumes", id))
	stage(id)
	csitest.AssertFileBytes(t, filepath.Join(staging, "kept"), []byte("kept"))

	// Only a snapshot left with data of the key.
	snap, err := ctl.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	umountBehindBack()
	if _, err := ctl.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Fatal(err)
	}
	restart()
	if st := keyStatus(kid); st != fscrypt.KeyAbsent {
		t.Fatalf("key %s after the restart, only a snapshot encrypted with it; want absent", st)
	}
	lockedNames("the snapshot", filepath.Join(dataRoot, "snapshots", sid))
	r := create("restored", &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: sid}}})
	stage(r)
	csitest.AssertFileBytes(t, filepath.Join(staging, "kept"), []byte("kept"))
	unstage(r)
	if st := keyStatus(kid); st != fscrypt.KeyAbsent {
		t.Fatalf("key %s after the restore's unstage; want absent", st)
	}
}
