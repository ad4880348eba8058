package imagevol

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/volume/engine"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testcgroup"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// keyStatus is the status of key kid in the keyring of the filesystem that
// holds p.
func keyStatus(t *testing.T, p string, kid fscrypt.Identifier) fscrypt.KeyStatus {
	t.Helper()
	st, err := fscrypt.Status(p, kid)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// An encrypted directory volume on an ext4 data root made with the encrypt
// feature: its directory gets its policy at the first stage, which needs
// the Secret; two volumes given one Secret have different keys; a second
// stage with another key is refused; a snapshot, its restore, a clone and
// the members of a group snapshot (taken while the keys are on the node)
// have their source's key, and open with the same Secret only; a key leaves the keyring at the unstage that
// leaves no staged volume encrypted with it, and the directories are then
// ciphertext; without the key a snapshot or clone is refused and makes
// nothing, and a restore is filled at its first stage (its snapshot kept
// until then); the data root's device never holds the plaintext; locked
// volumes are deleted.
func TestEncryptedDirectoryVolume(t *testing.T) {
	in := startImageRoot(t, testfs.Ext4Crypt)
	key := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(11, 32))}
	other := map[string]string{fscrypt.SecretPassphrase: "not the volume's passphrase"}
	dirCap := csitest.MntCap()
	volDir := func(id string) string { return filepath.Join(in.Opts.DataRoot, "volumes", id) }
	policy := func(id string) (fscrypt.Identifier, bool) {
		t.Helper()
		kid, ok, err := fscrypt.Policy(volDir(id))
		if err != nil {
			t.Fatal(err)
		}
		return kid, ok
	}
	status := func(kid fscrypt.Identifier) fscrypt.KeyStatus { return keyStatus(t, in.Opts.DataRoot, kid) }
	create := func(name string, params map[string]string, src *csi.VolumeContentSource) string {
		t.Helper()
		id, err := createWith(in, t, name, params, dirCap, src)
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", name, err)
		}
		return id
	}
	countSnapshots := func() int {
		t.Helper()
		l, err := in.Controller.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(l.GetEntries())
	}

	a := create("a", encrypted, nil)
	if _, ok := policy(a); ok {
		t.Fatal("a new encrypted directory volume has a policy before its first stage (which has the key)")
	}
	staging, err := stageCap(t, in, a, "a-nosecret", dirCap, nil)
	csitest.MustCode(t, err, codes.InvalidArgument, "NodeStageVolume without the Secret")
	if ms := csitest.MountsAt(t, staging); len(ms) != 0 {
		t.Fatalf("a stage without the Secret mounted %s", staging)
	}
	pod := testcgroup.NewPod(t, "6d0f2e1a-5b7c-4e8d-9f10-0000000000e1")
	va := stagePublishPod(t, in, a, "a", dirCap, key, pod.UID)
	marker := bytes.Repeat([]byte("localdir-dir-plaintext-marker "), 4096)
	if err := os.WriteFile(filepath.Join(va.target, "secret-notes"), marker, 0o600); err != nil {
		t.Fatal(err)
	}
	ka, ok := policy(a)
	if !ok || status(ka) != fscrypt.KeyPresent {
		t.Fatalf("staged: policy %v, key %s; want a policy whose key is present", ok, status(ka))
	}

	// Another volume given the same Secret: another key.
	b := create("b", encrypted, nil)
	vb := stagePublishPod(t, in, b, "b", dirCap, key, pod.UID)
	if err := os.WriteFile(filepath.Join(vb.target, "b-notes"), []byte("b"), 0o600); err != nil {
		t.Fatal(err)
	}
	if kb, _ := policy(b); kb == ka {
		t.Fatal("two volumes made apart with one Secret have the same key")
	}

	// A second stage of a with another key: refused, the first unharmed,
	// the other key not left in the keyring.
	staging, err = stageCap(t, in, a, "a-otherkey", dirCap, other)
	csitest.MustCode(t, err, codes.InvalidArgument, "NodeStageVolume with another key")
	if ms := csitest.MountsAt(t, staging); len(ms) != 0 {
		t.Fatalf("a stage with another key mounted %s", staging)
	}
	csitest.AssertFileBytes(t, filepath.Join(va.target, "secret-notes"), marker)
	var otherID fscrypt.Identifier
	_, named, _ := strings.Cut(err.Error(), "it gives key identifier ")
	if b, err := hex.DecodeString(named[:min(len(named), 2*len(otherID))]); err != nil || len(b) != len(otherID) {
		t.Fatalf("the refusal names no key identifier: %q", named)
	} else {
		otherID = fscrypt.Identifier(b)
	}
	if st := status(otherID); st != fscrypt.KeyAbsent {
		t.Fatalf("the refused key %s after the refusal: %s; want absent", otherID, st)
	}

	// Snapshot, restore, clone while the key is here: the source's key.
	snap, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "a-snap", SourceVolumeId: a})
	if err != nil {
		t.Fatal(err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	r := create("r", encrypted, csitest.FromSnapshot(sid))
	c := create("c", encrypted, csitest.FromVolume(a))
	var vr *vol
	for _, id := range []string{r, c} {
		if kid, ok := policy(id); !ok || kid != ka {
			t.Fatalf("copy %s: policy %v, same key as its source %v; want the source's", id, ok, kid == ka)
		}
		staging, err := stageCap(t, in, id, "otherkey-"+id, dirCap, other)
		csitest.MustCode(t, err, codes.InvalidArgument, "a copy staged with another key")
		if !strings.Contains(err.Error(), "does not unlock") {
			t.Errorf("a copy staged with another key: %v; want it to say the key does not unlock the volume", err)
		}
		if ms := csitest.MountsAt(t, staging); len(ms) != 0 {
			t.Fatalf("a copy staged with another key mounted %s", staging)
		}
	}
	vr = stagePublishCap(t, in, r, "r", dirCap, key)
	csitest.AssertFileBytes(t, filepath.Join(vr.target, "secret-notes"), marker)
	vc := stagePublishCap(t, in, c, "c", dirCap, key)
	csitest.AssertFileBytes(t, filepath.Join(vc.target, "secret-notes"), marker)
	unpublishUnstage(t, in, vc)

	// A group snapshot of a and b: each member has its source's key.
	gc := csi.NewGroupControllerClient(in.Conn)
	g, err := gc.CreateVolumeGroupSnapshot(csitest.Ctx(t), &csi.CreateVolumeGroupSnapshotRequest{Name: "ab", SourceVolumeIds: []string{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	var members []string
	for _, m := range g.GetGroupSnapshot().GetSnapshots() {
		dir := filepath.Join(in.Opts.DataRoot, "snapshots", m.GetSnapshotId())
		want, _ := policy(m.GetSourceVolumeId())
		if got, ok, err := fscrypt.Policy(dir); err != nil || !ok || got != want {
			t.Fatalf("group member %s: policy %v, its source's key %v, %v", m.GetSnapshotId(), ok, got == want, err)
		}
		file := map[string]string{a: "secret-notes", b: "b-notes"}[m.GetSourceVolumeId()]
		if names := csitest.DirNames(t, dir); !slices.Equal(names, []string{file}) {
			t.Fatalf("group member of %s holds %q; want %s", m.GetSourceVolumeId(), names, file)
		}
		members = append(members, m.GetSnapshotId())
	}
	if _, err := gc.DeleteVolumeGroupSnapshot(csitest.Ctx(t), &csi.DeleteVolumeGroupSnapshotRequest{
		GroupSnapshotId: g.GetGroupSnapshot().GetGroupSnapshotId(), SnapshotIds: members}); err != nil {
		t.Fatal(err)
	}

	// Between encrypted and unencrypted classes: refused.
	_, err = createWith(in, t, "plain-r", nil, dirCap, csitest.FromSnapshot(sid))
	csitest.MustCode(t, err, codes.InvalidArgument, "a restore into a class without encryption")
	p := create("p", nil, nil)
	vp := stagePublishCap(t, in, p, "p", dirCap, nil)
	if _, ok := policy(p); ok {
		t.Fatal("an unencrypted directory volume got a policy")
	}
	unpublishUnstage(t, in, vp)
	_, err = createWith(in, t, "p-into-enc", encrypted, dirCap, csitest.FromVolume(p))
	csitest.MustCode(t, err, codes.InvalidArgument, "a clone of an unencrypted volume into an encrypted class")

	// The key leaves with the last stage that uses it.
	kb, _ := policy(b)
	unpublishUnstage(t, in, vb)
	if st := status(kb); st != fscrypt.KeyAbsent {
		t.Fatalf("b's key after its unstage: %s; want absent", st)
	}
	if names := csitest.DirNames(t, volDir(b)); len(names) != 1 || names[0] == "b-notes" {
		t.Fatalf("names in locked b: %q; want one encrypted name", names)
	}
	if st := status(ka); st != fscrypt.KeyPresent {
		t.Fatalf("a's key after b's unstage: %s; want present", st)
	}
	unpublishUnstage(t, in, va)
	if st := status(ka); st != fscrypt.KeyPresent {
		t.Fatalf("a's key after a's unstage while its restore is staged: %s; want present (the restore uses it)", st)
	}
	csitest.AssertFileBytes(t, filepath.Join(vr.target, "secret-notes"), marker)
	unpublishUnstage(t, in, vr)
	if st := status(ka); st != fscrypt.KeyAbsent {
		t.Fatalf("a's key after the last unstage: %s; want absent", st)
	}
	names := csitest.DirNames(t, volDir(a))
	if len(names) != 1 || names[0] == "secret-notes" {
		t.Fatalf("names in locked a: %q; want one encrypted name", names)
	}
	if _, err := os.ReadFile(filepath.Join(volDir(a), names[0])); err == nil {
		t.Fatal("a locked volume's file reads")
	}

	// Without the key: a snapshot or clone is refused and makes nothing.
	_, err = in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "a-locked", SourceVolumeId: a})
	csitest.MustCode(t, err, codes.FailedPrecondition, "CreateSnapshot of a locked volume")
	if n := countSnapshots(); n != 1 {
		t.Fatalf("%d snapshots after the refused one; want 1", n)
	}
	_, err = createWith(in, t, "locked-clone", encrypted, dirCap, csitest.FromVolume(a))
	csitest.MustCode(t, err, codes.FailedPrecondition, "a clone of a locked volume")
	l, err := in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{})
	if err != nil || len(l.GetEntries()) != 5 {
		t.Fatalf("volumes after the refused copies: %d, %v; want a, b, r, c, p", len(l.GetEntries()), err)
	}
	if leftovers, _ := filepath.Glob(filepath.Join(in.Opts.DataRoot, "*", ".creating*")); len(leftovers) != 0 {
		t.Fatalf("the refused copies left %q", leftovers)
	}

	// A restore without the key is made empty and filled at its first
	// stage; its snapshot is kept until then.
	late := create("late", encrypted, csitest.FromSnapshot(sid))
	if names := csitest.DirNames(t, volDir(late)); len(names) != 0 {
		t.Fatalf("a restore made without the key holds %q", names)
	}
	_, err = in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: sid})
	csitest.MustCode(t, err, codes.FailedPrecondition, "DeleteSnapshot while a restore waits to be filled from it")
	staging, err = stageCap(t, in, late, "late-otherkey", dirCap, other)
	csitest.MustCode(t, err, codes.InvalidArgument, "the first stage of a waiting restore with another key")
	if ms := csitest.MountsAt(t, staging); len(ms) != 0 {
		t.Fatalf("the first stage of a waiting restore with another key mounted %s", staging)
	}
	if names := csitest.DirNames(t, volDir(late)); len(names) != 0 {
		t.Fatalf("a refused stage filled the waiting restore: %q", names)
	}
	// Key on the node (a staged), restore not yet filled: not copied.
	va = stagePublishCap(t, in, a, "a-again", dirCap, key)
	_, err = in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "late-snap", SourceVolumeId: late})
	csitest.MustCode(t, err, codes.FailedPrecondition, "CreateSnapshot of a restore not yet filled")
	_, err = createWith(in, t, "late-clone", encrypted, dirCap, csitest.FromVolume(late))
	csitest.MustCode(t, err, codes.FailedPrecondition, "a clone of a restore not yet filled")
	// What a crash during the fill leaves: the policy set, a partial copy.
	if err := fscrypt.SetPolicy(volDir(late), ka); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(volDir(late), "partial"), []byte("cut short"), 0o600); err != nil {
		t.Fatal(err)
	}
	unpublishUnstage(t, in, va)
	vl := stagePublishCap(t, in, late, "late", dirCap, key)
	csitest.AssertFileBytes(t, filepath.Join(vl.target, "secret-notes"), marker)
	if names := csitest.DirNames(t, vl.target); !slices.Equal(names, []string{"secret-notes"}) {
		t.Fatalf("the restore filled over a fill cut short holds %q; want the snapshot's files only", names)
	}
	if kid, _ := policy(late); kid != ka {
		t.Fatal("the restore filled at its first stage has another key than its snapshot")
	}
	if err := os.WriteFile(filepath.Join(vl.target, "late-notes"), []byte("late"), 0o600); err != nil {
		t.Fatal(err)
	}
	unpublishUnstage(t, in, vl)
	vl = stagePublishCap(t, in, late, "late-again", dirCap, key)
	if names := csitest.DirNames(t, vl.target); !slices.Equal(names, []string{"late-notes", "secret-notes"}) {
		t.Fatalf("the filled restore staged again holds %q; want its own writes kept (filled once)", names)
	}
	unpublishUnstage(t, in, vl)

	// Grown while locked, it opens again.
	if _, err := in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{
		VolumeId: a, CapacityRange: csitest.Range(128*mib, 0)}); err != nil {
		t.Fatalf("ControllerExpandVolume of a locked volume: %v", err)
	}
	va = stagePublishCap(t, in, a, "a-grown", dirCap, key)
	csitest.AssertFileBytes(t, filepath.Join(va.target, "secret-notes"), marker)
	unpublishUnstage(t, in, va)

	// No plaintext on the data root's device, read raw once synced.
	assertNotOnDataRoot(t, in, marker[:64])

	// Locked volumes and snapshots are deleted.
	if _, err := in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: sid}); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{a, b, r, c, late} {
		if _, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume of locked %s: %v", id, err)
		}
		csitest.AssertGone(t, volDir(id))
	}
	if left := csitest.DirNames(t, filepath.Join(in.Opts.DataRoot, "snapshots")); !slices.Equal(left, []string{}) && len(left) != 0 {
		t.Fatalf("snapshot data left: %q", left)
	}
}

// The key of an encrypted directory volume leaves the data root's keyring
// with its last use, whatever the order: files open at the unstage keep
// it until they are closed, and then the driver's retry removes it; an
// unstage before the unpublish (not the CSI order) leaves it to the
// unpublish.
func TestEncryptedDirectoryKeyLeavesWithLastUse(t *testing.T) {
	in := startImageRoot(t, testfs.Ext4Crypt)
	key := map[string]string{fscrypt.SecretPassphrase: "a passphrase of the test"}
	dirCap := csitest.MntCap()
	id, err := createWith(in, t, "v", encrypted, dirCap, nil)
	if err != nil {
		t.Fatal(err)
	}
	status := func(kid fscrypt.Identifier) fscrypt.KeyStatus { return keyStatus(t, in.Opts.DataRoot, kid) }

	v := stagePublishCap(t, in, id, "open", dirCap, key)
	kid, _, err := fscrypt.Policy(v.target)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(in.Opts.DataRoot, "volumes", id, "held-open"))
	if err != nil {
		t.Fatal(err)
	}
	unpublishUnstage(t, in, v)
	if st := status(kid); st != fscrypt.KeyIncompletelyRemoved {
		t.Fatalf("key %s after the unstage with a file open; want incompletely removed", st)
	}
	f.Close()
	deadline := time.Now().Add(15 * time.Second)
	for status(kid) != fscrypt.KeyAbsent {
		if time.Now().After(deadline) {
			t.Fatalf("key %s 15 s after the open file was closed; want absent", status(kid))
		}
		time.Sleep(100 * time.Millisecond)
	}

	v = stagePublishCap(t, in, id, "order", dirCap, key)
	if _, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: v.staging}); err != nil {
		t.Fatal(err)
	}
	if st := status(kid); st != fscrypt.KeyPresent {
		t.Fatalf("key %s after the unstage while still published; want present (the publication shows the files)", st)
	}
	csitest.AssertFileBytes(t, filepath.Join(v.target, "held-open"), nil)
	if _, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: v.target}); err != nil {
		t.Fatal(err)
	}
	v.done = true
	if st := status(kid); st != fscrypt.KeyAbsent {
		t.Fatalf("key %s after the unpublish that ended the last use; want absent", st)
	}
}

// A copy of an encrypted directory volume holds its key (Node.HoldKey):
// the unstage of the last volume using the key during the copy leaves it,
// and the end of the copy removes it; a key not in the keyring is not
// held.
func TestEncryptedDirectoryKeyHeldForACopy(t *testing.T) {
	testdriver.RequireRoot(t)
	root := filepath.Join(testfs.New(t, testfs.Ext4Crypt, 512<<20), "data")
	n, err := app.OpenNode(driver.Options{DataRoot: root, Engine: engine.Dir}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Store.Close()
	v, err := n.Store.Create(contract.CreateSpec{Name: "v", SizeBytes: 64 * mib, AccessType: contract.AccessMount, DirMode: 0o777,
		Parameters: map[string]string{contract.ParamEncryption: contract.EncryptionFscrypt}})
	if err != nil {
		t.Fatal(err)
	}
	staging := csitest.Mkdir(t, filepath.Join(t.TempDir(), "staging"))
	secrets := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(21, 32))}
	if err := n.Publisher.Stage(v.ID, staging, contract.AccessMount, nil, secrets); err != nil {
		t.Fatal(err)
	}
	kid, _, err := fscrypt.Policy(staging)
	if err != nil {
		t.Fatal(err)
	}
	status := func() fscrypt.KeyStatus { return keyStatus(t, root, kid) }
	release, present, err := n.Publisher.HoldKey(kid)
	if err != nil || !present {
		t.Fatalf("HoldKey of the staged volume's key: present %v, %v", present, err)
	}
	if err := n.Publisher.Unstage(csitest.Ctx(t), v.ID, staging); err != nil {
		t.Fatal(err)
	}
	if st := status(); st != fscrypt.KeyPresent {
		t.Fatalf("key %s after the unstage during a copy; want present (held)", st)
	}
	release()
	if st := status(); st != fscrypt.KeyAbsent {
		t.Fatalf("key %s after the copy's release; want absent", st)
	}
	if release, present, err := n.Publisher.HoldKey(kid); err != nil || present || release != nil {
		t.Fatalf("HoldKey of an absent key: present %v, %v", present, err)
	}
}
