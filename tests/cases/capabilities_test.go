package cases

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C35: a repeated NodePublishVolume at the same target must ask for what is
// there. Publishing a raw block volume read-write at T1 and then read-only
// at T1 (or read-only at T2 and then read-write) is ALREADY_EXISTS, exactly
// as for a mount volume, and the first publication stays as it was (one
// mount, its mode, its device). One check serves both access types. Before
// this fix the block repeat answered OK and kept the first mode, so the CO
// believed a read-write publication was read-only (or the reverse); this
// test fails on that code.
func TestC35RepublishBlockOtherReadonly(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	dir := in.Dir
	b := createBlock(t, in, "c35-blk", 4*csitest.Mi)
	s := filepath.Join(dir, "S")
	stageBlock(t, in, b, s)
	rw := loopOfMode(t, in, b, false)

	t1, t2 := filepath.Join(dir, "T1"), filepath.Join(dir, "T2")
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t1, false))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T1 read-write")
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t1, false))
	csitest.CodeIs(t, err, codes.OK, "repeated NodePublishVolume T1 read-write")
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t1, true))
	csitest.CodeIs(t, err, codes.AlreadyExists, "NodePublishVolume T1 again, read-only")
	assertDeviceAt(t, t1, rw, false)
	// The refused call leaves no read-only device behind.
	assertLoops(t, in, b, 1, 0)

	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t2, true))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T2 read-only")
	ro := loopOfMode(t, in, b, true)
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t2, true))
	csitest.CodeIs(t, err, codes.OK, "repeated NodePublishVolume T2 read-only")
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t2, false))
	csitest.CodeIs(t, err, codes.AlreadyExists, "NodePublishVolume T2 again, read-write")
	assertDeviceAt(t, t2, ro, true)
	assertDeviceAt(t, t1, rw, false)
	assertLoops(t, in, b, 1, 1)

	// The same check, the same answers, for a mount volume.
	m := createVolume(t, in, "c35-mnt", 4*csitest.Mi).GetVolumeId()
	sm := filepath.Join(dir, "SM")
	stage(t, in, m, sm)
	tm1, tm2 := filepath.Join(dir, "TM1"), filepath.Join(dir, "TM2")
	for _, tc := range []struct {
		target        string
		first, second bool
	}{{tm1, false, true}, {tm2, true, false}} {
		req := publishReq(m, sm, tc.target)
		req.Readonly = tc.first
		_, err := in.Node.NodePublishVolume(csitest.Ctx(t), req)
		csitest.MustCode(t, err, codes.OK, fmt.Sprintf("NodePublishVolume %s readonly=%v", tc.target, tc.first))
		req.Readonly = tc.second
		_, err = in.Node.NodePublishVolume(csitest.Ctx(t), req)
		csitest.CodeIs(t, err, codes.AlreadyExists, fmt.Sprintf("NodePublishVolume %s again, readonly=%v", tc.target, tc.second))
		assertShowsVolume(t, in, tc.target, m)
		if got, want := mountOptions(t, tc.target)[0], map[bool]string{false: "rw", true: "ro"}[tc.first]; got != want {
			t.Errorf("%s: mounted %s after the refused repeat, want %s", tc.target, got, want)
		}
	}

	unpublish(t, in, b, t2)
	assertLoops(t, in, b, 1, 0)
	unpublish(t, in, b, t1)
	unstageBlock(t, in, b, s)
	unpublish(t, in, m, tm1)
	unpublish(t, in, m, tm2)
	unstage(t, in, m, sm)
}

// C36: a read-only publication of a raw block volume refuses writes at the
// device, not only in the mount table (a bind mount's ro flag does not stop
// writes to a device node). The read-only target holds a second loop device
// attached read-only to the same image: BLKROGET reports 1, a write through
// it fails with EPERM (or EROFS), and the bytes seen through the read-write
// publication stay as they were, while the read-only one still reads the
// volume's data. The read-only device is detached when its last read-only
// publication is unpublished, and at unstage. Before this fix the
// read-only target was the read-write device (BLKROGET 0) and the write
// went through to the volume; this test fails on that code.
func TestC36ReadOnlyBlockPublishRefusesWrites(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	dir := in.Dir
	b := createBlock(t, in, "c36", 4*csitest.Mi)
	s := filepath.Join(dir, "S")
	stageBlock(t, in, b, s)
	t1, t2, t3 := filepath.Join(dir, "T1"), filepath.Join(dir, "T2"), filepath.Join(dir, "T3")
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t1, false))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T1 read-write")
	p := csitest.RandomBytes(36, int(64*csitest.Ki))
	if err := writeDevice(t1, 0, p); err != nil {
		t.Fatalf("write through the read-write publication T1: %v", err)
	}

	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t2, true))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T2 read-only")
	if got := blkROGet(t, t2); got != 1 {
		t.Errorf("BLKROGET on the read-only publication %s = %d, want 1", t2, got)
	}
	if got := blkROGet(t, t1); got != 0 {
		t.Errorf("BLKROGET on the read-write publication %s = %d, want 0", t1, got)
	}
	if got := readDevice(t, t2, 0, len(p)); !bytes.Equal(got, p) {
		t.Error("the read-only publication does not read the data written through the read-write one")
	}

	// A 4 KiB write at offset 0 through the read-only publication fails at
	// the device.
	q := csitest.RandomBytes(37, int(4*csitest.Ki))
	err = writeDevice(t2, 0, q)
	if !errors.Is(err, unix.EPERM) && !errors.Is(err, unix.EROFS) {
		t.Errorf("write through the read-only publication %s: %v, want EPERM or EROFS", t2, err)
	} else {
		t.Logf("write through the read-only publication refused: %v", err)
	}
	if got := readDevice(t, t1, 0, len(p)); !bytes.Equal(got, p) {
		t.Error("the bytes read through the read-write publication changed after a write to the read-only one")
	}
	if got := readDevice(t, t2, 0, len(p)); !bytes.Equal(got, p) {
		t.Error("the read-only publication no longer reads the volume's data")
	}
	// T2 holds the image's read-only loop device, T1 its read-write one.
	rw, ro := loopOfMode(t, in, b, false), loopOfMode(t, in, b, true)
	assertDeviceAt(t, t2, ro, true)
	assertDeviceAt(t, t1, rw, false)
	// What the read-write publication writes later is read through the
	// read-only one on its next open (both devices read the same image).
	p2 := csitest.RandomBytes(38, int(4*csitest.Ki))
	if err := writeDevice(t1, csitest.Mi, p2); err != nil {
		t.Fatalf("second write through T1: %v", err)
	}
	if got := readDevice(t, t2, csitest.Mi, len(p2)); !bytes.Equal(got, p2) {
		t.Error("the read-only publication does not see data written and synced through the read-write one")
	}

	// Two read-only publications share one read-only device; it goes with
	// the last of them.
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t3, true))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T3 read-only")
	assertDeviceAt(t, t3, ro, true)
	assertLoops(t, in, b, 1, 1)
	unpublish(t, in, b, t2)
	assertLoops(t, in, b, 1, 1)
	if got := readDevice(t, t3, 0, len(p)); !bytes.Equal(got, p) {
		t.Error("T3 does not read the data after T2 was unpublished")
	}
	unpublish(t, in, b, t3)
	assertLoops(t, in, b, 1, 0)

	// Unstage detaches a read-only device too, even one whose publication
	// disappeared without NodeUnpublishVolume (unmounted by hand).
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, s, t2, true))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume T2 read-only again")
	assertLoops(t, in, b, 1, 1)
	if err := unix.Unmount(t2, 0); err != nil {
		t.Fatalf("unmount %s by hand: %v", t2, err)
	}
	unpublish(t, in, b, t1)
	unstageBlock(t, in, b, s)
	_, err = in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: b, TargetPath: t2})
	csitest.CodeIs(t, err, codes.OK, "late NodeUnpublishVolume of T2")
	assertLoops(t, in, b, 0, 0)
	deleteBlock(t, in, b)
}

func deleteBlock(t testing.TB, in *testdriver.Instance, id string) {
	t.Helper()
	_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume "+id)
	csitest.AssertGone(t, blockImage(in, id))
}

// C37: CreateVolume must return a volume that satisfies every capability
// listed; a mount and a block capability together are satisfied by none,
// so the request is INVALID_ARGUMENT and nothing is created (ListVolumes,
// the data directories and the available capacity are unchanged; the name
// stays free). ValidateVolumeCapabilities leaves such a list unconfirmed and
// GetCapacity reports 0 for it. Before this fix CreateVolume answered OK
// with a block volume that NodeStageVolume then refused as mount; this
// test fails on that code.
func TestC37CreateMountAndBlock(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	existing := createVolume(t, in, "c37-existing", 4*csitest.Mi).GetVolumeId()
	before := available(t, in)
	blockDir := filepath.Join(in.Opts.DataRoot, "block")
	blocksBefore := csitest.DirNames(t, blockDir)

	for _, caps := range [][]*csi.VolumeCapability{{csitest.MntCap(), csitest.BlkCap()}, {csitest.BlkCap(), csitest.MntCap()}} {
		for _, cr := range []*csi.CapacityRange{nil, csitest.Range(4*csitest.Mi, 4*csitest.Mi)} {
			_, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "c37", CapacityRange: cr, VolumeCapabilities: caps})
			csitest.CodeIs(t, err, codes.InvalidArgument, "CreateVolume with a mount and a block capability")
			assertListMatchesDisk(t, in, existing)
			if got := csitest.DirNames(t, blockDir); !slices.Equal(got, blocksBefore) {
				t.Errorf("%s holds %v after the refused create, had %v", blockDir, got, blocksBefore)
			}
			if got := available(t, in); got != before {
				t.Errorf("available capacity %d after the refused create, was %d", got, before)
			}
		}
		resp, err := in.Controller.ValidateVolumeCapabilities(csitest.Ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: existing, VolumeCapabilities: caps})
		csitest.MustCode(t, err, codes.OK, "ValidateVolumeCapabilities with a mount and a block capability")
		if resp.GetConfirmed() != nil || resp.GetMessage() == "" {
			t.Errorf("ValidateVolumeCapabilities of mount+block: confirmed %v, message %q; want unconfirmed with a reason", resp.GetConfirmed(), resp.GetMessage())
		}
		gc, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{VolumeCapabilities: caps})
		csitest.MustCode(t, err, codes.OK, "GetCapacity with a mount and a block capability")
		if gc.GetAvailableCapacity() != 0 {
			t.Errorf("GetCapacity of mount+block: %d available, want 0", gc.GetAvailableCapacity())
		}
	}

	// The name was not taken: a plain create with it works.
	v := createVolume(t, in, "c37", 4*csitest.Mi).GetVolumeId()
	assertListMatchesDisk(t, in, existing, v)
	deleteVolume(t, in, v)
	deleteVolume(t, in, existing)
}

// C38: ValidateVolumeCapabilities, CreateVolume, NodeStageVolume,
// NodePublishVolume and GetCapacity decide every capability the same way
// (one function in pkg/driver): Validate leaves `confirmed` unset, with the
// reason in `message`, exactly where the others refuse — INVALID_ARGUMENT
// for a value the driver does not accept (a mount flag such as `sync`
// that a bind mount cannot apply, conflicting flags), FAILED_PRECONDITION
// at the node for one the volume cannot serve (a multi-node access mode,
// the other access type) — and GetCapacity reports 0 where CreateVolume
// refuses. Before this fix Validate confirmed `sync`, which CreateVolume
// and NodeStageVolume refuse; this test fails on that code.
func TestC38CapabilityDecisionsAgree(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 512 * csitest.Mi })
	dir := in.Dir
	// m and b are staged (with a plain capability) for the publish rows;
	// m2 and b2 are not, for the stage rows.
	m := createVolume(t, in, "c38-m", 4*csitest.Mi).GetVolumeId()
	m2 := createVolume(t, in, "c38-m2", 4*csitest.Mi).GetVolumeId()
	b := createBlock(t, in, "c38-b", 4*csitest.Mi)
	b2 := createBlock(t, in, "c38-b2", 4*csitest.Mi)
	sm, sb := filepath.Join(dir, "SM"), filepath.Join(dir, "SB")
	stage(t, in, m, sm)
	stageBlock(t, in, b, sb)
	vols := []string{m, m2, b, b2}

	mode := func(c *csi.VolumeCapability, md csi.VolumeCapability_AccessMode_Mode) *csi.VolumeCapability {
		c.AccessMode.Mode = md
		return c
	}
	fsType := func(c *csi.VolumeCapability, fs string) *csi.VolumeCapability {
		c.GetMount().FsType = fs
		return c
	}
	for i, tc := range []struct {
		name   string
		c      *csi.VolumeCapability
		block  bool       // the node calls and Validate use the block volume
		create codes.Code // CreateVolume of a new volume with [c]
		node   codes.Code // NodeStageVolume and NodePublishVolume
	}{
		{"mount", csitest.MntCap(), false, codes.OK, codes.OK},
		{"mount ro,nosuid", csitest.MntCap("ro", "nosuid"), false, codes.OK, codes.OK},
		{"mount flags accepted without effect", csitest.MntCap("rw", "defaults"), false, codes.OK, codes.OK},
		{"mount fs_type ext4", fsType(csitest.MntCap(), "ext4"), false, codes.OK, codes.OK},
		{"mount SINGLE_NODE_READER_ONLY", mode(csitest.MntCap(), csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), false, codes.OK, codes.OK},
		{"mount SINGLE_NODE_SINGLE_WRITER", mode(csitest.MntCap(), csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), false, codes.OK, codes.OK},
		{"mount sync", csitest.MntCap("sync"), false, codes.InvalidArgument, codes.InvalidArgument},
		{"mount nosuid,sync", csitest.MntCap("nosuid,sync"), false, codes.InvalidArgument, codes.InvalidArgument},
		{"mount unknown flag", csitest.MntCap("no-such-flag"), false, codes.InvalidArgument, codes.InvalidArgument},
		{"mount conflicting atime flags", csitest.MntCap("noatime", "strictatime"), false, codes.InvalidArgument, codes.InvalidArgument},
		{"mount sync with fs_type", fsType(csitest.MntCap("sync"), "xfs"), false, codes.InvalidArgument, codes.InvalidArgument},
		{"mount MULTI_NODE_MULTI_WRITER", mode(csitest.MntCap(), csi.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER), false, codes.InvalidArgument, codes.FailedPrecondition},
		{"mount MULTI_NODE_READER_ONLY", mode(csitest.MntCap(), csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY), false, codes.InvalidArgument, codes.FailedPrecondition},
		{"block", csitest.BlkCap(), true, codes.OK, codes.OK},
		{"block MULTI_NODE_READER_ONLY", mode(csitest.BlkCap(), csi.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY), true, codes.InvalidArgument, codes.FailedPrecondition},
		// The other access type: a new volume of that type is fine, the
		// existing volume cannot serve it.
		{"block on a mount volume", csitest.BlkCap(), false, codes.OK, codes.FailedPrecondition},
		{"mount on a block volume", csitest.MntCap(), true, codes.OK, codes.FailedPrecondition},
		{"mount sync on a block volume", csitest.MntCap("sync"), true, codes.InvalidArgument, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vol, unstaged, staging := m, m2, sm
			if tc.block {
				vol, unstaged, staging = b, b2, sb
			}
			caps := []*csi.VolumeCapability{tc.c}

			// CreateVolume, and GetCapacity for the same capability.
			resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: fmt.Sprintf("c38-new-%d", i), CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: caps})
			csitest.CodeIs(t, err, tc.create, "CreateVolume")
			if err == nil {
				id := resp.GetVolume().GetVolumeId()
				_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
				csitest.MustCode(t, err, codes.OK, "DeleteVolume of the new volume")
			}
			if got := listIDs(t, in.Controller); !slices.Equal(got, slices.Sorted(slices.Values(vols))) {
				t.Errorf("ListVolumes = %v after the row, want %v", got, vols)
			}
			gc, err := in.Controller.GetCapacity(csitest.Ctx(t), &csi.GetCapacityRequest{VolumeCapabilities: caps})
			csitest.MustCode(t, err, codes.OK, "GetCapacity")
			if (gc.GetAvailableCapacity() > 0) != (tc.create == codes.OK) {
				t.Errorf("GetCapacity: %d available, CreateVolume answered %s", gc.GetAvailableCapacity(), tc.create)
			}

			// ValidateVolumeCapabilities on the existing volume.
			vr, err := in.Controller.ValidateVolumeCapabilities(csitest.Ctx(t), &csi.ValidateVolumeCapabilitiesRequest{VolumeId: vol, VolumeCapabilities: caps})
			csitest.MustCode(t, err, codes.OK, "ValidateVolumeCapabilities")
			confirmed := vr.GetConfirmed() != nil
			if confirmed != (tc.node == codes.OK) {
				t.Errorf("ValidateVolumeCapabilities: confirmed=%v (message %q), but the node calls answer %s", confirmed, vr.GetMessage(), tc.node)
			}
			if !confirmed && vr.GetMessage() == "" {
				t.Error("ValidateVolumeCapabilities: unconfirmed without a message")
			}

			// NodeStageVolume of the unstaged volume.
			s2 := csitest.Mkdir(t, filepath.Join(dir, fmt.Sprintf("S-%d", i)))
			_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: unstaged, StagingTargetPath: s2, VolumeCapability: tc.c})
			csitest.CodeIs(t, err, tc.node, "NodeStageVolume")
			if err == nil {
				_, err := in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: unstaged, StagingTargetPath: s2})
				csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume")
			}
			if ms := csitest.MountsUnder(t, s2); len(ms) != 0 || len(csitest.DirNames(t, s2)) != 0 {
				t.Errorf("%s: %d mounts and entries %v left", s2, len(ms), csitest.DirNames(t, s2))
			}
			if tc.block {
				assertLoops(t, in, unstaged, 0, 0)
			}

			// NodePublishVolume of the staged volume.
			tg := filepath.Join(dir, fmt.Sprintf("T-%d", i))
			_, err = in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{VolumeId: vol, StagingTargetPath: staging, TargetPath: tg, VolumeCapability: tc.c})
			csitest.CodeIs(t, err, tc.node, "NodePublishVolume")
			if err == nil {
				_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: vol, TargetPath: tg})
				csitest.MustCode(t, err, codes.OK, "NodeUnpublishVolume")
			}
			assertMountCount(t, tg, 0)
			csitest.AssertGone(t, tg)

			// They agree: where the capability's access type is the
			// volume's, CreateVolume refuses exactly where Validate does not
			// confirm, and a value the driver does not accept is
			// INVALID_ARGUMENT for every call.
			if (tc.c.GetBlock() != nil) == tc.block && (tc.create == codes.OK) != confirmed {
				t.Errorf("CreateVolume answered %s but Validate confirmed=%v", tc.create, confirmed)
			}
		})
	}
	unstage(t, in, m, sm)
	unstageBlock(t, in, b, sb)
}

// C39: NodeGetVolumeStats answers for a volume only at a path where it is
// staged or published, as NodeStageVolume and NodePublishVolume made it;
// anywhere else — an empty directory, the loop device node itself, another
// volume's staging path, the volume's own data directory — is NOT_FOUND
// (CSI: the volume does not exist at volume_path), for block and mount
// volumes alike, and the paths are NOT_FOUND again once unpublished and
// unstaged. Before this fix a block volume's stats were returned for any
// directory while its loop device was attached; this test fails on that
// code.
func TestC39VolumeStatsOnlyWhereTheVolumeIs(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	dir := in.Dir
	b := createBlock(t, in, "c39-blk", 4*csitest.Mi)
	other := createBlock(t, in, "c39-other", 4*csitest.Mi)
	m := createVolume(t, in, "c39-mnt", 4*csitest.Mi).GetVolumeId()
	sb, so, sm := filepath.Join(dir, "SB"), filepath.Join(dir, "SO"), filepath.Join(dir, "SM")
	tb, tbro, tm := filepath.Join(dir, "TB"), filepath.Join(dir, "TBRO"), filepath.Join(dir, "TM")
	empty := csitest.Mkdir(t, filepath.Join(dir, "U"))
	stageBlock(t, in, b, sb)
	stageBlock(t, in, other, so)
	stage(t, in, m, sm)
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, sb, tb, false))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume block")
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(b, sb, tbro, true))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume block read-only")
	publish(t, in, m, sm, tm)

	stats := func(id, p string, want codes.Code) {
		t.Helper()
		resp, err := in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
		if !csitest.CodeIs(t, err, want, "NodeGetVolumeStats of "+id+" at "+p) || want != codes.OK {
			return
		}
		var total int64
		for _, u := range resp.GetUsage() {
			if u.GetUnit() == csi.VolumeUsage_BYTES {
				total = u.GetTotal()
			}
		}
		if total != 4*csitest.Mi {
			t.Errorf("NodeGetVolumeStats of %s at %s: BYTES total %d, want %d", id, p, total, 4*csitest.Mi)
		}
	}
	for _, tc := range []struct {
		id, path string
		want     codes.Code
	}{
		{b, empty, codes.NotFound},
		{b, sb, codes.OK},
		{b, tb, codes.OK},
		{b, tbro, codes.OK},
		{b, loopOfMode(t, in, b, false), codes.NotFound},
		{b, so, codes.NotFound},
		{b, filepath.Join(sb, b), codes.NotFound}, // the device node in the staging path is not itself a staging or publish path
		{other, sb, codes.NotFound},
		{other, tb, codes.NotFound},
		{m, empty, codes.NotFound},
		{m, sm, codes.OK},
		{m, tm, codes.OK},
		{m, volDir(in, m), codes.NotFound},
		{m, sb, codes.NotFound},
		{b, sm, codes.NotFound},
	} {
		stats(tc.id, tc.path, tc.want)
	}

	// The staging path's device node is the driver's: a stale node of
	// another device number (a reboot renumbers loop devices) is replaced
	// by a repeated stage; anything else there is ALREADY_EXISTS, and a
	// stage that fails leaves no loop device attached.
	node := filepath.Join(sb, b)
	if err := os.Remove(node); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 1023))); err != nil {
		t.Fatal(err)
	}
	stats(b, sb, codes.NotFound)
	stageBlock(t, in, b, sb)
	stats(b, sb, codes.OK)
	s2 := csitest.Mkdir(t, filepath.Join(dir, "S2"))
	writeFileSynced(t, filepath.Join(s2, other), []byte("not a device"))
	unstageBlock(t, in, other, so)
	_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: other, StagingTargetPath: s2, VolumeCapability: csitest.BlkCap()})
	csitest.CodeIs(t, err, codes.AlreadyExists, "NodeStageVolume onto a staging path holding a file of the volume's name")
	assertLoops(t, in, other, 0, 0)
	csitest.AssertFileBytes(t, filepath.Join(s2, other), []byte("not a device"))

	unpublish(t, in, b, tb)
	unpublish(t, in, b, tbro)
	stats(b, sb, codes.OK)
	unstageBlock(t, in, b, sb)
	stats(b, sb, codes.NotFound)
	unpublish(t, in, m, tm)
	unstage(t, in, m, sm)
	stats(m, sm, codes.NotFound)
}

// C38: ValidateVolumeCapabilities confirms parameters and a volume_context
// only when they are the volume's own: parameters a CreateVolume of the
// same name would refuse as ALREADY_EXISTS, or a volume_context the volume
// does not have, leave `confirmed` unset with the reason in `message`.
func TestC38ValidateConfirmsOnlyTheVolumesParameters(t *testing.T) {
	in := testdriver.Start(t, nil)
	created := &csi.CreateVolumeRequest{Name: "c38-params", CapacityRange: csitest.Range(4*csitest.Mi, 0),
		VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, Parameters: map[string]string{"dirMode": "0750"}}
	r, err := in.Controller.CreateVolume(csitest.Ctx(t), created)
	csitest.MustCode(t, err, codes.OK, "CreateVolume")
	vol := r.GetVolume()
	validate := func(params, vc map[string]string) *csi.ValidateVolumeCapabilitiesResponse {
		t.Helper()
		vr, err := in.Controller.ValidateVolumeCapabilities(csitest.Ctx(t), &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: vol.GetVolumeId(), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}, Parameters: params, VolumeContext: vc})
		csitest.MustCode(t, err, codes.OK, "ValidateVolumeCapabilities")
		return vr
	}
	for _, params := range []map[string]string{nil, {"dirMode": "0750"}, {"dirMode": "0750", "csi.storage.k8s.io/pvc/name": "p"}} {
		if vr := validate(params, vol.GetVolumeContext()); vr.GetConfirmed() == nil {
			t.Errorf("parameters %v: not confirmed (%q)", params, vr.GetMessage())
		}
	}
	for _, params := range []map[string]string{{"dirMode": "0700"}, {"dirMode": "0755", "csi.storage.k8s.io/pvc/name": "p"}} {
		vr := validate(params, nil)
		if vr.GetConfirmed() != nil || !strings.Contains(vr.GetMessage(), "other parameters") {
			t.Errorf("parameters %v: confirmed %v, message %q; want unconfirmed, created with other parameters", params, vr.GetConfirmed(), vr.GetMessage())
		}
		again := proto.Clone(created).(*csi.CreateVolumeRequest)
		again.Parameters = params
		_, err := in.Controller.CreateVolume(csitest.Ctx(t), again)
		csitest.MustCode(t, err, codes.AlreadyExists, "CreateVolume of the same name with those parameters")
	}
	if vr := validate(nil, map[string]string{"foo": "bar"}); vr.GetConfirmed() != nil || vr.GetMessage() == "" {
		t.Errorf("a volume_context the volume does not have: confirmed %v, message %q", vr.GetConfirmed(), vr.GetMessage())
	}
}
