package volume

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
)

// An encrypted directory volume and its snapshot are not sent to another
// node (their files need the key, which the receiver has not):
// contract.ErrPrecondition, nothing written to the stream; the same
// volume without encryption is sent.
func TestSendRefusesEncryptedDirectory(t *testing.T) {
	root := filepath.Join(t.TempDir(), "data")
	m := openTest(t, root)
	defer m.Close()
	v := create(t, m, "plain")
	enc := *v
	enc.ID, enc.Name = contract.NewVolumeID(), "encrypted"
	enc.Parameters = map[string]string{contract.ParamEncryption: contract.EncryptionFscrypt}
	enc.KeySalt = bytes.Repeat([]byte{7}, 32)
	snap := &contract.Snapshot{ID: contract.NewSnapshotID(), Name: "encrypted-snap", SourceVolumeID: enc.ID, SizeBytes: enc.CapacityBytes,
		AccessType: contract.AccessMount, Engine: enc.Engine, CreatedAt: time.Now(), KeySalt: enc.KeySalt}
	if err := os.Mkdir(m.volDir(enc.ID), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(m.snapPath(snap), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := m.st.Update(func(tx *state.Tx) error {
		if err := tx.PutVolume(&enc); err != nil {
			return err
		}
		return tx.PutSnapshot(snap)
	}); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []contract.CreateSpec{
		{ID: contract.NewVolumeID(), SizeBytes: enc.CapacityBytes, AccessType: contract.AccessMount, SourceVolumeID: enc.ID, Parameters: enc.Parameters},
		{ID: contract.NewVolumeID(), SizeBytes: enc.CapacityBytes, AccessType: contract.AccessMount, SourceSnapshotID: snap.ID, Parameters: enc.Parameters},
	} {
		var w bytes.Buffer
		if _, err := m.Send(spec, &w); !errors.Is(err, contract.ErrPrecondition) || w.Len() != 0 {
			t.Errorf("Send of %s%s: %v, %d bytes written; want ErrPrecondition and nothing", spec.SourceVolumeID, spec.SourceSnapshotID, err, w.Len())
		}
	}
	var w bytes.Buffer
	if _, err := m.Send(contract.CreateSpec{ID: contract.NewVolumeID(), SizeBytes: v.CapacityBytes, AccessType: contract.AccessMount, SourceVolumeID: v.ID}, &w); err != nil || w.Len() == 0 {
		t.Fatalf("Send of an unencrypted volume: %v, %d bytes", err, w.Len())
	}
}
