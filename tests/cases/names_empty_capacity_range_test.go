package cases

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C49: the CSI spec bans exactly U+0000–U+0008, U+000B, U+000C,
// U+000E–U+001F and U+007F–U+009F in volume and snapshot names; tab, LF and
// CR are allowed. A CreateVolume or CreateSnapshot with such a name works
// and is idempotent (the same volume_id / snapshot_id again, also after a
// restart, when the name index is rebuilt from the state file), and names
// that differ only there are different volumes; a name with a banned
// character (U+0001, U+000B, U+007F, U+0085, …) is INVALID_ARGUMENT and
// creates nothing. Before this fix every control character was refused,
// tab, LF and CR included; this test fails on that code.
func TestC49NamesWithTabLineFeedCarriageReturn(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	names := []string{"a\tb", "a\nb", "a\rb", "a b", "\tleading", "trailing\n", "c\r\nd"}
	ids := map[string]string{}
	create := func(in *testdriver.Instance, name string) string {
		t.Helper()
		resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name: name, CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
		})
		csitest.MustCode(t, err, codes.OK, fmt.Sprintf("CreateVolume %q", name))
		return resp.GetVolume().GetVolumeId()
	}
	snapshot := func(in *testdriver.Instance, name, src string) string {
		t.Helper()
		resp, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
		csitest.MustCode(t, err, codes.OK, fmt.Sprintf("CreateSnapshot %q", name))
		return resp.GetSnapshot().GetSnapshotId()
	}
	for _, n := range names {
		ids[n] = create(in, n)
		if again := create(in, n); again != ids[n] {
			t.Errorf("repeated CreateVolume %q: %s, want %s", n, again, ids[n])
		}
	}
	all := slices.Collect(func(yield func(string) bool) {
		for _, id := range ids {
			if !yield(id) {
				return
			}
		}
	})
	if got := len(slices.Compact(slices.Sorted(slices.Values(all)))); got != len(names) {
		t.Errorf("%d names gave %d distinct volumes", len(names), got)
	}
	assertListMatchesDisk(t, in, all...)

	src := ids["a\tb"]
	snaps := map[string]string{}
	for _, n := range []string{"s\tx", "s\nx", "s\rx"} {
		snaps[n] = snapshot(in, n, src)
		if again := snapshot(in, n, src); again != snaps[n] {
			t.Errorf("repeated CreateSnapshot %q: %s, want %s", n, again, snaps[n])
		}
	}
	if snaps["s\tx"] == snaps["s\nx"] || snaps["s\nx"] == snaps["s\rx"] {
		t.Errorf("different snapshot names gave the same snapshot: %v", snaps)
	}
	_, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: "s\tx", SourceVolumeId: ids["a\nb"]})
	csitest.CodeIs(t, err, codes.AlreadyExists, "CreateSnapshot \"s\\tx\" of another volume")
	snapsBefore := listSnapshotIDs(t, in)

	for _, r := range []rune{0x00, 0x01, 0x08, 0x0b, 0x0c, 0x0e, 0x1b, 0x1f, 0x7f, 0x80, 0x85, 0x9f} {
		bad := "a" + string(r) + "b"
		_, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name: bad, CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
		})
		csitest.CodeIs(t, err, codes.InvalidArgument, fmt.Sprintf("CreateVolume with %U in the name", r))
		_, err = in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: bad, SourceVolumeId: src})
		csitest.CodeIs(t, err, codes.InvalidArgument, fmt.Sprintf("CreateSnapshot with %U in the name", r))
	}
	assertListMatchesDisk(t, in, all...)
	if got := listSnapshotIDs(t, in); !slices.Equal(got, snapsBefore) {
		t.Errorf("ListSnapshots = %v after the refused calls, want %v", got, snapsBefore)
	}

	// The names survive a restart: the name index is rebuilt from the
	// state file.
	in.Stop(t)
	dir := in.Dir
	in = testdriver.StartWith(t, in.Opts)
	in.Dir = dir
	for _, n := range names {
		if got := create(in, n); got != ids[n] {
			t.Errorf("CreateVolume %q after a restart: %s, want %s", n, got, ids[n])
		}
	}
	for n, id := range snaps {
		if got := snapshot(in, n, src); got != id {
			t.Errorf("CreateSnapshot %q after a restart: %s, want %s", n, got, id)
		}
		_, err := in.Controller.DeleteSnapshot(csitest.Ctx(t), &csi.DeleteSnapshotRequest{SnapshotId: id})
		csitest.MustCode(t, err, codes.OK, "DeleteSnapshot "+id)
	}
	for _, id := range all {
		deleteVolume(t, in, id)
	}
}

func listSnapshotIDs(t testing.TB, in *testdriver.Instance) []string {
	t.Helper()
	resp, err := in.Controller.ListSnapshots(csitest.Ctx(t), &csi.ListSnapshotsRequest{})
	csitest.MustCode(t, err, codes.OK, "ListSnapshots")
	var ids []string
	for _, e := range resp.GetEntries() {
		ids = append(ids, e.GetSnapshot().GetSnapshotId())
	}
	slices.Sort(ids)
	return ids
}

// C49, logs: a name holding LF, CR or escape sequences never reaches the
// log raw, so it cannot forge a log line or drive a terminal. The driver
// binary runs with -v=4 (every request logged) and gets names crafted to
// look like a klog line after the LF; its whole output must hold no line
// starting with the forged header and no raw CR or ESC byte, while the
// requests were logged (escaped). Before this fix a name with a LF was
// refused, so this test fails on that code at its first CreateVolume.
func TestC49NamesAreLoggedEscaped(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	p := testdriver.Launch(t, driverBinary(t), testdriver.ProcArgs(dir, "-v=4"))
	p.WaitReady(t, "unix://"+filepath.Join(dir, "csi.sock"), testdriver.ReadyWait{Total: 20 * time.Second, Probe: 500 * time.Millisecond, Poll: 10 * time.Millisecond})
	ctl := csi.NewControllerClient(p.Conn)
	const forged = "E0101 00:00:00.000000       1 forged.go:1] forged-line"
	name := "c49\n" + forged + "\r\x1b[2K"
	resp, err := ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "c49\n" + forged, CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.MustCode(t, err, codes.OK, "CreateVolume with a LF in the name")
	// An incompatible repeat fails, and failures are logged at any -v.
	_, err = ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "c49\n" + forged, CapacityRange: csitest.Range(2*csitest.Mi, 2*csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.CodeIs(t, err, codes.AlreadyExists, "incompatible repeat")
	_, err = ctl.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: name, CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.CodeIs(t, err, codes.InvalidArgument, "CreateVolume with ESC in the name")
	_, err = ctl.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume")
	p.Stop(t, 20*time.Second)

	out := p.Output.String()
	if !strings.Contains(out, "forged-line") {
		t.Fatalf("the requests were not logged at -v=4; output:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "E0101") {
			t.Errorf("a name forged a log line: %q", line)
		}
	}
	if strings.ContainsAny(out, "\r\x1b") {
		t.Errorf("the log holds a raw CR or ESC byte:\n%q", out)
	}
}

// C50: a restore or clone sent with capacity_range{} (both fields 0) gets
// its source's size, as without a capacity_range: 0 means unspecified (CSI
// CapacityRange), not "the default size". A limit_bytes alone gives the
// source's size when it fits and OUT_OF_RANGE when the source is larger
// (nothing created then); a required_bytes below the source's size gets the
// source's size, one above it that size. This holds for mount and block
// volumes, snapshots and clones, with a default size below the source's
// (refused with OUT_OF_RANGE before this fix) and above it (given the
// default size before this fix); this test fails on that code.
func TestC50RestoreAndCloneWithEmptyCapacityRange(t *testing.T) {
	for _, def := range []int64{4 * csitest.Mi, 64 * csitest.Mi} {
		t.Run(fmt.Sprintf("default size %dMi", def/csitest.Mi), func(t *testing.T) {
			in := testdriver.Start(t, func(o *driver.Options) {
				o.CapacityBytes = 512 * csitest.Mi
				o.DefaultVolumeBytes = def
			})
			m := createVolume(t, in, "m", 8*csitest.Mi).GetVolumeId()
			data := csitest.RandomBytes(50, int(csitest.Mi))
			writeFileSynced(t, filepath.Join(volDir(in, m), "data"), data)
			b := createBlock(t, in, "b", 8*csitest.Mi)
			snap := func(name, src string) string {
				resp, err := in.Controller.CreateSnapshot(csitest.Ctx(t), &csi.CreateSnapshotRequest{Name: name, SourceVolumeId: src})
				csitest.MustCode(t, err, codes.OK, "CreateSnapshot "+name)
				return resp.GetSnapshot().GetSnapshotId()
			}
			sources := []struct {
				name  string
				src   *csi.VolumeContentSource
				block bool
			}{
				{"restore mount", csitest.FromSnapshot(snap("ms", m)), false},
				{"clone mount", csitest.FromVolume(m), false},
				{"restore block", csitest.FromSnapshot(snap("bs", b)), true},
				{"clone block", csitest.FromVolume(b), true},
			}
			for si, s := range sources {
				for ci, tc := range []struct {
					name string
					cr   *csi.CapacityRange
					want codes.Code
					size int64
				}{
					{"capacity_range{}", csitest.Range(0, 0), codes.OK, 8 * csitest.Mi},
					{"no capacity_range", nil, codes.OK, 8 * csitest.Mi},
					{"limit_bytes above the source", csitest.Range(0, 16*csitest.Mi), codes.OK, 8 * csitest.Mi},
					{"limit_bytes equal to the source", csitest.Range(0, 8*csitest.Mi), codes.OK, 8 * csitest.Mi},
					{"limit_bytes below the source", csitest.Range(0, 4*csitest.Mi), codes.OutOfRange, 0},
					{"required_bytes below the source", csitest.Range(csitest.Mi, 0), codes.OK, 8 * csitest.Mi},
					{"required_bytes above the source", csitest.Range(12*csitest.Mi, 0), codes.OK, 12 * csitest.Mi},
					{"range below the source", csitest.Range(2*csitest.Mi, 4*csitest.Mi), codes.OutOfRange, 0},
				} {
					t.Run(s.name+", "+tc.name, func(t *testing.T) {
						before := listIDs(t, in.Controller)
						avail := available(t, in)
						req := &csi.CreateVolumeRequest{
							Name: fmt.Sprintf("c50-%d-%d", si, ci), CapacityRange: tc.cr,
							VolumeCapabilities: []*csi.VolumeCapability{csitest.CapOf(s.block)}, VolumeContentSource: s.src,
						}
						resp, err := in.Controller.CreateVolume(csitest.Ctx(t), req)
						csitest.MustCode(t, err, tc.want, "CreateVolume")
						if tc.want != codes.OK {
							if got := listIDs(t, in.Controller); !slices.Equal(got, before) {
								t.Errorf("ListVolumes = %v after the refused create, want %v", got, before)
							}
							if got := available(t, in); got != avail {
								t.Errorf("available capacity %d after the refused create, was %d", got, avail)
							}
							return
						}
						v := resp.GetVolume()
						if v.GetCapacityBytes() != tc.size {
							t.Errorf("capacity %d, want %d", v.GetCapacityBytes(), tc.size)
						}
						if got := available(t, in); got != avail-tc.size {
							t.Errorf("available capacity %d after the create, want %d (%d taken)", got, avail-tc.size, tc.size)
						}
						again, err := in.Controller.CreateVolume(csitest.Ctx(t), req)
						csitest.MustCode(t, err, codes.OK, "repeated CreateVolume")
						if again.GetVolume().GetVolumeId() != v.GetVolumeId() {
							t.Errorf("repeated CreateVolume: %s, want %s", again.GetVolume().GetVolumeId(), v.GetVolumeId())
						}
						id := v.GetVolumeId()
						if s.block {
							if fi, err := os.Stat(blockImage(in, id)); err != nil || fi.Size() != tc.size {
								t.Errorf("image of %s: %v, want %d bytes", id, err, tc.size)
							}
							deleteBlock(t, in, id)
						} else {
							csitest.AssertFileBytes(t, filepath.Join(volDir(in, id), "data"), data)
							deleteVolume(t, in, id)
						}
					})
				}
			}
		})
	}
}
