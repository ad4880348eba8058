package reliability

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/publish/fscrypt"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// TestKillDuringEncryptedStageAndUnstage: the driver is SIGKILLed at
// moments spread over NodeStageVolume and NodeUnstageVolume of an
// encrypted ext4 image volume (the key is added after the mount and
// removed before the unmount). After each restart the kubelet's retry of
// the same call succeeds: a stage shows the data written before, with the
// key in the filesystem's keyring; an unstage leaves no mount at the
// staging path and no loop device. The key is never in the keyring of a
// filesystem that is not mounted at the staging path (the keyring belongs
// to the mounted filesystem: nothing can stay unlocked past the unmount).
func TestKillDuringEncryptedStageAndUnstage(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	dataRoot := filepath.Join(testfs.New(t, testfs.Ext4, 1<<30), "data")
	p, ctl, node := procClients(t, dir, dataRoot)
	r, err := ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: "encrypted", CapacityRange: csitest.Range(64*csitest.Mi, 0), Parameters: map[string]string{"encryption": "fscrypt"},
		VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCapFS("ext4")},
	})
	if err != nil {
		t.Fatal(err)
	}
	id := r.GetVolume().GetVolumeId()
	secrets := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(3, 32))}
	staging := csitest.Mkdir(t, filepath.Join(dir, "staging"))
	stage := func(n csi.NodeClient) error {
		_, err := n.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: csitest.MntCapFS("ext4"), Secrets: secrets})
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
	if err := os.WriteFile(filepath.Join(staging, publish.EncryptedDataDir, "kept"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	kid, _, err := fscrypt.Policy(filepath.Join(staging, publish.EncryptedDataDir))
	if err != nil {
		t.Fatal(err)
	}
	if err := unstage(node); err != nil {
		t.Fatal(err)
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
			if err := call.do(node); err != nil {
				t.Fatalf("round %d: %s retried after a kill %v into it: %v", i, call.name, delay, err)
			}
			mounted := len(csitest.MountsAt(t, staging)) > 0
			switch call.name {
			case "NodeStageVolume":
				if !mounted {
					t.Fatalf("round %d: not mounted after the retried stage", i)
				}
				if st, err := fscrypt.Status(staging, kid); err != nil || st != fscrypt.KeyPresent {
					t.Fatalf("round %d: key %s after the retried stage, %v; want present", i, st, err)
				}
				b, err := os.ReadFile(filepath.Join(staging, publish.EncryptedDataDir, "kept"))
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
			}
			rounds++
		}
	}
	t.Logf("%d kills at 0–60 ms into NodeStageVolume and NodeUnstageVolume of an encrypted volume: every retry succeeded", rounds)
}
