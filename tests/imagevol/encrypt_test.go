package imagevol

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/volume/fscrypt"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
	"github.com/localdir-csi/localdir/tests/testfs"
)

var encrypted = map[string]string{"encryption": "fscrypt"}

func createWith(in *testdriver.Instance, t *testing.T, name string, params map[string]string, c *csi.VolumeCapability, src *csi.VolumeContentSource) (string, error) {
	t.Helper()
	r, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: name, CapacityRange: csitest.Range(64*mib, 0), Parameters: params,
		VolumeCapabilities: []*csi.VolumeCapability{c}, VolumeContentSource: src,
	})
	return r.GetVolume().GetVolumeId(), err
}

// stageWith stages ext4 image volume id at a new staging path with secrets.
func stageWith(t *testing.T, in *testdriver.Instance, id, name string, secrets map[string]string) (string, error) {
	t.Helper()
	return stageCap(t, in, id, name, csitest.MntCapFS("ext4"), secrets)
}

// stageCap stages volume id, of capability c, at a new staging path with
// secrets.
func stageCap(t *testing.T, in *testdriver.Instance, id, name string, c *csi.VolumeCapability, secrets map[string]string) (string, error) {
	t.Helper()
	staging := csitest.Mkdir(t, filepath.Join(in.Dir, "staging-"+name))
	_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: c, Secrets: secrets,
	})
	return staging, err
}

// assertUntouched fails unless a refused stage left nothing behind: no
// mount at staging, no loop device on the volume's image.
func assertUntouched(t *testing.T, in *testdriver.Instance, id, staging, what string) {
	t.Helper()
	if ms := csitest.MountsUnder(t, staging); len(ms) != 0 {
		t.Errorf("%s: still mounted at %s: %v", what, staging, ms[0].Mountpoint)
	}
	if devs := imageLoopDevs(t, in, id); len(devs) != 0 {
		t.Errorf("%s: loop devices left on the image: %v", what, devs)
	}
}

// An encrypted ext4 image volume (StorageClass encryption: fscrypt, the key
// from the node-stage Secret): refused where it cannot be, before anything
// is made; a pod writes through it and the image never holds the
// plaintext; a stage without the Secret or with another key is refused
// and leaves nothing mounted or attached; a restore of its snapshot and a
// clone open with the same Secret only, and not in a class without
// encryption, and grow; after the last unstage its files are ciphertext.
func TestEncryptedImageVolume(t *testing.T) {
	in := startImageRoot(t, testfs.Ext4)
	key := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(7, 32))}
	other := map[string]string{fscrypt.SecretPassphrase: "not the volume's passphrase"}

	// Refusals that make nothing.
	for _, tc := range []struct {
		name string
		c    *csi.VolumeCapability
	}{{"xfs", csitest.MntCapFS("xfs")}, {"block", csitest.BlkCap()}, {"dir", csitest.MntCap()}} {
		_, err := createWith(in, t, "enc-"+tc.name, encrypted, tc.c, nil)
		csitest.MustCode(t, err, codes.InvalidArgument, "CreateVolume encrypted "+tc.name)
	}
	_, err := createWith(in, t, "enc-bad", map[string]string{"encryption": "luks"}, csitest.MntCapFS("ext4"), nil)
	csitest.MustCode(t, err, codes.InvalidArgument, "CreateVolume encryption=luks")
	if l, err := in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{}); err != nil || len(l.GetEntries()) != 0 {
		t.Fatalf("volumes after the refused creates: %d, %v", len(l.GetEntries()), err)
	}

	id, err := createWith(in, t, "enc", encrypted, csitest.MntCapFS("ext4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	staging, err := stageWith(t, in, id, "nosecret", nil)
	csitest.MustCode(t, err, codes.InvalidArgument, "NodeStageVolume without the Secret")
	assertUntouched(t, in, id, staging, "a stage without the Secret")

	v := &vol{id: id, target: filepath.Join(in.Dir, "target-enc")}
	if v.staging, err = stageWith(t, in, id, "enc", key); err != nil {
		t.Fatalf("NodeStageVolume: %v", err)
	}
	if _, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: csitest.MntCapFS("ext4")}); err != nil {
		t.Fatalf("NodePublishVolume: %v", err)
	}
	t.Cleanup(func() { unpublishUnstage(t, in, v) })
	marker := bytes.Repeat([]byte("localdir-plaintext-marker "), 4096)
	if err := os.WriteFile(filepath.Join(v.target, "secret-notes"), marker, 0o600); err != nil {
		t.Fatal(err)
	}
	if names := csitest.DirNames(t, v.target); !slices.Equal(names, []string{"secret-notes"}) {
		t.Fatalf("the pod sees %q; want its own file only (not the filesystem's root)", names)
	}
	dataDir := filepath.Join(v.staging, publish.EncryptedDataDir)
	kid, ok, err := fscrypt.Policy(dataDir)
	if err != nil || !ok {
		t.Fatalf("the published directory has no encryption policy: %v", err)
	}
	if st, err := fscrypt.Status(v.staging, kid); err != nil || st != fscrypt.KeyPresent {
		t.Fatalf("key status while staged: %s, %v", st, err)
	}

	// Another key on a second stage: refused, the first stage unharmed.
	staging, err = stageWith(t, in, id, "otherkey", other)
	csitest.MustCode(t, err, codes.InvalidArgument, "NodeStageVolume with another key")
	if ms := csitest.MountsUnder(t, staging); len(ms) != 0 {
		t.Errorf("a stage with another key left a mount at %s", staging)
	}
	csitest.AssertFileBytes(t, filepath.Join(v.target, "secret-notes"), marker)

	// A snapshot, restored and cloned: the same Secret opens them.
	if err := syncFS(v.target); err != nil {
		t.Fatal(err)
	}
	snap, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "enc-snap", SourceVolumeId: id})
	if err != nil {
		t.Fatal(err)
	}
	sid := snap.GetSnapshot().GetSnapshotId()
	for _, src := range []struct {
		name string
		src  *csi.VolumeContentSource
	}{{"restore", csitest.FromSnapshot(sid)}, {"clone", csitest.FromVolume(id)}} {
		rid, err := createWith(in, t, "enc-"+src.name, encrypted, csitest.MntCapFS("ext4"), src.src)
		if err != nil {
			t.Fatalf("%s: %v", src.name, err)
		}
		staging, err := stageWith(t, in, rid, src.name+"-otherkey", other)
		csitest.MustCode(t, err, codes.InvalidArgument, src.name+" staged with another key")
		assertUntouched(t, in, rid, staging, src.name+" staged with another key")
		if !strings.Contains(err.Error(), "does not unlock") {
			t.Errorf("%s with another key: %v; want it to say the key does not unlock the volume", src.name, err)
		}
		// Grown while not staged (offline: an online ext4 resize needs
		// CAP_SYS_RESOURCE, which a test process may lack), at the stage.
		expand(t, in, rid, "ext4", 128*mib)
		r := stagePublishWith(t, in, rid, src.name, key)
		csitest.AssertFileBytes(t, filepath.Join(r.target, "secret-notes"), marker)
		if total := statfsTotal(t, r.target); total < 100*mib {
			t.Errorf("%s grown to 128 MiB: the filesystem holds %d bytes", src.name, total)
		}
		unpublishUnstage(t, in, r)

		_, err = createWith(in, t, "plain-"+src.name, nil, csitest.MntCapFS("ext4"), src.src)
		csitest.MustCode(t, err, codes.InvalidArgument, src.name+" into a class without encryption")
	}
	if l, err := in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{}); err != nil || len(l.GetEntries()) != 3 {
		t.Fatalf("volumes after the refused restore and clone: %d, %v; want the source, its restore and its clone", len(l.GetEntries()), err)
	}

	// Locked after the last unstage: the image holds neither the file's
	// name nor its contents, and mounted again its names are ciphertext.
	unpublishUnstage(t, in, v)
	img := imagePath(in, id)
	raw, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, marker[:64]) || bytes.Contains(raw, []byte("secret-notes")) {
		t.Fatal("the image file holds the plaintext")
	}
	mnt := csitest.Mkdir(t, filepath.Join(in.Dir, "inspect"))
	if out, err := exec.Command("mount", "-o", "loop,ro", img, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount the image: %v: %s", err, out)
	}
	defer func() { mustRun(t, "umount", mnt) }()
	if st, err := fscrypt.Status(mnt, kid); err != nil || st != fscrypt.KeyAbsent {
		t.Errorf("key status after unstage: %s, %v; want absent", st, err)
	}
	names := csitest.DirNames(t, filepath.Join(mnt, publish.EncryptedDataDir))
	if len(names) != 1 || names[0] == "secret-notes" {
		t.Errorf("names in the locked volume: %q; want one encrypted name", names)
	}

	// Nor does the data root's device, read raw once its filesystem is
	// synced: no plaintext in a snapshot, restore, clone or freed block.
	assertNotOnDataRoot(t, in, marker[:64])
}

// assertNotOnDataRoot fails when a raw read of the device under in's data
// root (a loop device), once its filesystem is synced, finds pat.
func assertNotOnDataRoot(t *testing.T, in *testdriver.Instance, pat []byte) {
	t.Helper()
	root := csitest.MountsAt(t, filepath.Dir(in.Opts.DataRoot))
	if len(root) != 1 || !strings.HasPrefix(root[0].Source, "/dev/loop") {
		t.Fatalf("the data root's filesystem: %v; want one loop device", root)
	}
	testfs.Sync(t, in.Opts.DataRoot)
	if at := findIn(t, root[0].Source, pat); at >= 0 {
		t.Fatalf("the data root's device %s holds the plaintext at byte %d", root[0].Source, at)
	}
}

// findIn returns the offset of the first occurrence of pat in the file or
// device p, or -1.
func findIn(t *testing.T, p string, pat []byte) int64 {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20+len(pat))
	var off int64
	for {
		n, err := f.ReadAt(buf, off)
		if i := bytes.Index(buf[:n], pat); i >= 0 {
			return off + int64(i)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return -1
			}
			t.Fatal(err)
		}
		off += int64(n - len(pat))
	}
}

func stagePublishWith(t *testing.T, in *testdriver.Instance, id, name string, secrets map[string]string) *vol {
	t.Helper()
	return stagePublishCap(t, in, id, name, csitest.MntCapFS("ext4"), secrets)
}

func stagePublishCap(t *testing.T, in *testdriver.Instance, id, name string, c *csi.VolumeCapability, secrets map[string]string) *vol {
	t.Helper()
	return stagePublishPod(t, in, id, name, c, secrets, "")
}

// stagePublishPod stages volume id with secrets and publishes it, as the
// kubelet does with podInfoOnMount for the pod with uid ("": none).
func stagePublishPod(t *testing.T, in *testdriver.Instance, id, name string, c *csi.VolumeCapability, secrets map[string]string, uid string) *vol {
	t.Helper()
	v := &vol{id: id, target: filepath.Join(in.Dir, "target-"+name)}
	var err error
	if v.staging, err = stageCap(t, in, id, name, c, secrets); err != nil {
		t.Fatalf("NodeStageVolume %s: %v", name, err)
	}
	var vc map[string]string
	if uid != "" {
		vc = map[string]string{"csi.storage.k8s.io/pod.uid": uid}
	}
	if _, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: v.staging, TargetPath: v.target, VolumeCapability: c, VolumeContext: vc}); err != nil {
		t.Fatalf("NodePublishVolume %s: %v", name, err)
	}
	t.Cleanup(func() { unpublishUnstage(t, in, v) })
	return v
}

func syncFS(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// A volume group snapshot of two encrypted ext4 image volumes in use, each
// unlocked by its own Secret, taken while a writer writes the same number
// to the first, then to the second (each write synced): the members freeze
// together as unencrypted ones do, so in every group the second holds the
// first's number or the one before; each member's restore opens with its
// volume's Secret only; no file under the data root holds the plaintext.
func TestEncryptedGroupSnapshot(t *testing.T) {
	in := startImageRoot(t, testfs.Ext4)
	gc := csi.NewGroupControllerClient(in.Conn)
	marker := bytes.Repeat([]byte("localdir-group-plaintext "), 2048)
	var ids []string
	var vols []*vol
	var keys []map[string]string
	for i, name := range []string{"first", "second"} {
		id, err := createWith(in, t, "enc-"+name, encrypted, csitest.MntCapFS("ext4"), nil)
		if err != nil {
			t.Fatal(err)
		}
		key := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(uint64(20+i), 32))}
		v := stagePublishWith(t, in, id, name, key)
		if err := os.WriteFile(filepath.Join(v.target, "notes"), marker, 0o600); err != nil {
			t.Fatal(err)
		}
		ids, vols, keys = append(ids, id), append(vols, v), append(keys, key)
	}

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		for i := 1; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			for _, v := range vols {
				if err := csitest.WriteSeq(filepath.Join(v.target, "seq"), i); err != nil {
					done <- err
					return
				}
			}
		}
	}()
	var groups []*csi.VolumeGroupSnapshot
	for i := range 4 {
		time.Sleep(30 * time.Millisecond)
		r, err := gc.CreateVolumeGroupSnapshot(csitest.Ctx(t), &csi.CreateVolumeGroupSnapshotRequest{
			Name: fmt.Sprintf("enc-g%d", i), SourceVolumeIds: []string{ids[1], ids[0]}})
		if err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
		groups = append(groups, r.GetGroupSnapshot())
	}
	close(stop)
	if err := <-done; err != nil {
		t.Fatalf("the writer, after the group snapshots: %v", err)
	}

	for gi, g := range groups {
		seq := make([]int, len(ids))
		for _, s := range g.GetSnapshots() {
			m := slices.Index(ids, s.GetSourceVolumeId())
			name := fmt.Sprintf("g%d-%d", gi, m)
			rid, err := createWith(in, t, "enc-"+name, encrypted, csitest.MntCapFS("ext4"), csitest.FromSnapshot(s.GetSnapshotId()))
			if err != nil {
				t.Fatalf("restore %s: %v", name, err)
			}
			staging, err := stageWith(t, in, rid, name+"-otherkey", keys[1-m])
			csitest.MustCode(t, err, codes.InvalidArgument, name+" staged with the other member's key")
			assertUntouched(t, in, rid, staging, name+" staged with the other member's key")
			r := stagePublishWith(t, in, rid, name, keys[m])
			csitest.AssertFileBytes(t, filepath.Join(r.target, "notes"), marker)
			b, err := os.ReadFile(filepath.Join(r.target, "seq"))
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if seq[m], err = strconv.Atoi(string(b)); err != nil {
				t.Fatalf("%s: seq %q", name, b)
			}
			unpublishUnstage(t, in, r)
		}
		if seq[1] != seq[0] && seq[1] != seq[0]-1 {
			t.Errorf("group %d: the first volume holds %d, the second %d; want the second to hold the first's number or the one before", gi, seq[0], seq[1])
		}
	}

	for _, v := range vols {
		unpublishUnstage(t, in, v)
	}
	err := filepath.WalkDir(in.Opts.DataRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if at := findIn(t, p, marker[:64]); at >= 0 {
			t.Errorf("%s holds the plaintext at byte %d", p, at)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// What a create and a stage refuse, leave behind and trust:
//   - a pod of an unencrypted volume may create files named like the salt
//     and the data directory: the volume still stages (only a data
//     directory with a policy marks encrypted data);
//   - a restore of an unencrypted snapshot into an encrypted class is
//     INVALID_ARGUMENT at CreateVolume; a clone of an encrypted volume
//     never staged (no filesystem yet) fits any class;
//   - an encrypted volume whose filesystem cannot encrypt is refused at the
//     stage and its image is left as it was (no salt written);
//   - an encrypted volume whose data directory a crash left empty without
//     its policy (made, not yet encrypted) gets the policy at the next stage.
func TestEncryptedStageLeavesNothingBehind(t *testing.T) {
	in := startImageRoot(t, testfs.Ext4)
	key := map[string]string{fscrypt.SecretKey: hex.EncodeToString(csitest.RandomBytes(31, 32))}
	mnt := csitest.Mkdir(t, filepath.Join(in.Dir, "inspect"))
	namesIn := func(img string) []string {
		t.Helper()
		mustRun(t, "mount", "-o", "loop,ro", img, mnt)
		defer mustRun(t, "umount", mnt)
		return csitest.DirNames(t, mnt)
	}

	plain, err := createWith(in, t, "plain", nil, csitest.MntCapFS("ext4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	p := stagePublishWith(t, in, plain, "plain", nil)
	if err := os.WriteFile(filepath.Join(p.target, "notes"), []byte("plain"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syncFS(p.target); err != nil {
		t.Fatal(err)
	}
	snap, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "plain-snap", SourceVolumeId: plain})
	if err != nil {
		t.Fatal(err)
	}
	src := csitest.FromSnapshot(snap.GetSnapshot().GetSnapshotId())
	if err := os.WriteFile(filepath.Join(p.target, fscrypt.SaltFile), []byte("a pod's file"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(p.target, publish.EncryptedDataDir), 0o755); err != nil {
		t.Fatal(err)
	}
	unpublishUnstage(t, in, p)
	stagePublishWith(t, in, plain, "plain-again", nil)

	_, err = createWith(in, t, "plain-into-enc", encrypted, csitest.MntCapFS("ext4"), src)
	csitest.MustCode(t, err, codes.InvalidArgument, "an unencrypted snapshot restored into an encrypted class")
	fresh, err := createWith(in, t, "fresh-enc", encrypted, csitest.MntCapFS("ext4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := createWith(in, t, "fresh-enc-into-plain", nil, csitest.MntCapFS("ext4"), csitest.FromVolume(fresh)); err != nil {
		t.Fatalf("a clone of an encrypted volume never staged into a class without encryption: %v", err)
	}

	// A filesystem that cannot encrypt under an encrypted volume (made
	// here by hand: CreateVolume lets no such restore through).
	mustRun(t, "mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^encrypt", imagePath(in, fresh))
	before := namesIn(imagePath(in, fresh))
	staging, err := stageWith(t, in, fresh, "cannot-encrypt", key)
	csitest.MustCode(t, err, codes.FailedPrecondition, "an encrypted volume whose filesystem cannot encrypt")
	assertUntouched(t, in, fresh, staging, "an encrypted volume whose filesystem cannot encrypt")
	if after := namesIn(imagePath(in, fresh)); !slices.Equal(after, before) {
		t.Fatalf("the refused stage changed the filesystem's root: %q, before %q", after, before)
	}

	// Made, not yet encrypted: the state a crash between the two leaves.
	v, err := createWith(in, t, "enc", encrypted, csitest.MntCapFS("ext4"), nil)
	if err != nil {
		t.Fatal(err)
	}
	e := stagePublishWith(t, in, v, "enc", key)
	unpublishUnstage(t, in, e)
	mustRun(t, "mount", "-o", "loop", imagePath(in, v), mnt)
	data := filepath.Join(mnt, publish.EncryptedDataDir)
	if err := os.Remove(data); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(data, 0o777); err != nil {
		t.Fatal(err)
	}
	mustRun(t, "umount", mnt)
	e = stagePublishWith(t, in, v, "enc-again", key)
	if _, ok, err := fscrypt.Policy(filepath.Join(e.staging, publish.EncryptedDataDir)); err != nil || !ok {
		t.Fatalf("the data directory left without a policy has none after the stage: %v", err)
	}
	if err := os.WriteFile(filepath.Join(e.target, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
}
