package cases

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C01: 16 parallel CreateVolume calls with one name make one volume. Every
// call answers OK with the same id or ABORTED, never INTERNAL; one volume is
// listed and one directory exists; a later identical call returns it; after
// DeleteVolume nothing is left. Several rounds, so the race is hit in more
// than one interleaving.
//
// Not covered here (mount volumes only): the CreateSnapshot half of the case
// (16 × CreateSnapshot{name:"snap-race"}) belongs to the snapshots feature
// (CREATE_DELETE_SNAPSHOT).
func TestC01ParallelCreateSameName(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	const callers = 16
	for round := range 5 {
		name := fmt.Sprintf("pvc-race-%d", round+1)
		req := &csi.CreateVolumeRequest{
			Name:               name,
			CapacityRange:      &csi.CapacityRange{RequiredBytes: csitest.Mi},
			VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
		}
		var (
			wg    sync.WaitGroup
			start = make(chan struct{})
			ids   = make([]string, callers)
			errs  = make([]error, callers)
		)
		for i := range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				resp, err := in.Controller.CreateVolume(csitest.Ctx(t), req)
				ids[i], errs[i] = resp.GetVolume().GetVolumeId(), err
			}()
		}
		close(start)
		wg.Wait()

		id, oks := "", 0
		for i, err := range errs {
			switch status.Code(err) {
			case codes.OK:
				oks++
				if id == "" {
					id = ids[i]
				} else if ids[i] != id {
					t.Errorf("%s: call %d returned volume %s, another returned %s", name, i, ids[i], id)
				}
			case codes.Aborted:
			default:
				t.Errorf("%s: call %d: got %s (%v), want OK or ABORTED", name, i, status.Code(err), err)
			}
		}
		if oks == 0 {
			t.Fatalf("%s: no call succeeded; the one holding the name lock must", name)
		}
		t.Logf("%s: %d OK, %d ABORTED", name, oks, callers-oks)
		assertListMatchesDisk(t, in, id)

		resp, err := in.Controller.CreateVolume(csitest.Ctx(t), req)
		csitest.MustCode(t, err, codes.OK, "repeated CreateVolume "+name)
		if got := resp.GetVolume().GetVolumeId(); got != id {
			t.Errorf("repeated CreateVolume %s returned %s, want %s", name, got, id)
		}
		if got := resp.GetVolume().GetCapacityBytes(); got < csitest.Mi {
			t.Errorf("repeated CreateVolume %s: capacity %d < 1Mi", name, got)
		}
		assertListMatchesDisk(t, in, id)

		deleteVolume(t, in, id)
		assertListMatchesDisk(t, in)
	}
}

// C02: a repeated CreateVolume with the same name is compared with the
// existing volume: a compatible one returns it, an incompatible one gets
// ALREADY_EXISTS and changes nothing.
func TestC02CreateSameNameDifferentArgs(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 256 * csitest.Mi })
	x := createVolume(t, in, "v2", csitest.Mi).GetVolumeId()
	before := available(t, in)

	for _, tc := range []struct {
		name string
		req  *csi.CreateVolumeRequest
		want codes.Code
	}{
		{"1 larger exact size", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(2*csitest.Mi, 2*csitest.Mi)}, codes.AlreadyExists},
		{"2 range containing 1Mi", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(512*csitest.Ki, 4*csitest.Mi)}, codes.OK},
		{"3 block instead of mount", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeCapabilities: []*csi.VolumeCapability{csitest.BlkCap()}}, codes.AlreadyExists},
		{"4 other parameters", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), Parameters: map[string]string{"kind": "other"}}, codes.AlreadyExists},
		{"5 snapshot content source", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Snapshot{Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: "snap-0123456789abcdef0123456789abcdef"}}}}, codes.AlreadyExists},
		{"volume content source", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi, csitest.Mi), VolumeContentSource: &csi.VolumeContentSource{
			Type: &csi.VolumeContentSource_Volume{Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: x}}}}, codes.AlreadyExists},
		{"limit below 1Mi", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(0, 512*csitest.Ki)}, codes.AlreadyExists},
		{"required above 1Mi, no limit", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi+1, 0)}, codes.AlreadyExists},
		{"same arguments", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(csitest.Mi, csitest.Mi)}, codes.OK},
		{"no capacity_range", &csi.CreateVolumeRequest{}, codes.OK},
		{"limit only, above 1Mi", &csi.CreateVolumeRequest{CapacityRange: csitest.Range(0, 4*csitest.Mi)}, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Name = "v2"
			if tc.req.VolumeCapabilities == nil {
				tc.req.VolumeCapabilities = []*csi.VolumeCapability{csitest.MntCap()}
			}
			resp, err := in.Controller.CreateVolume(csitest.Ctx(t), tc.req)
			csitest.MustCode(t, err, tc.want, "CreateVolume v2")
			if tc.want == codes.OK {
				if got := resp.GetVolume().GetVolumeId(); got != x {
					t.Errorf("returned volume %s, want the existing %s", got, x)
				}
				if got := resp.GetVolume().GetCapacityBytes(); got != csitest.Mi {
					t.Errorf("returned capacity %d, want the existing 1Mi", got)
				}
			}
			assertListMatchesDisk(t, in, x)
			if got := available(t, in); got != before {
				t.Errorf("GetCapacity available changed from %d to %d", before, got)
			}
		})
	}
}

// C03: capacity ranges are validated before anything is created; the size
// given is within the range; a size above the maximum is OUT_OF_RANGE
// (permanent), not RESOURCE_EXHAUSTED. Failed calls leave nothing behind.
func TestC03CapacityRange(t *testing.T) {
	const (
		defSize = 8 * csitest.Mi
		maxSize = 64 * csitest.Mi
	)
	in := testdriver.Start(t, func(o *driver.Options) {
		o.CapacityBytes = 512 * csitest.Mi
		o.DefaultVolumeBytes = defSize
		o.MaxVolumeBytes = maxSize
	})
	var created []string
	for i, tc := range []struct {
		name     string
		cr       *csi.CapacityRange
		want     codes.Code
		min, max int64 // accepted capacity, when OK
	}{
		{name: "a required -1", cr: csitest.Range(-1, 0), want: codes.InvalidArgument},
		{name: "a limit -1", cr: csitest.Range(0, -1), want: codes.InvalidArgument},
		{name: "b required above limit", cr: csitest.Range(2*csitest.Mi, csitest.Mi), want: codes.InvalidArgument},
		{name: "c limit only", cr: csitest.Range(0, csitest.Mi), want: codes.OK, min: 1, max: csitest.Mi},
		{name: "d omitted", cr: nil, want: codes.OK, min: defSize, max: defSize},
		{name: "d empty range", cr: csitest.Range(0, 0), want: codes.OK, min: defSize, max: defSize},
		{name: "e one byte", cr: csitest.Range(1, 0), want: codes.OK, min: 1, max: maxSize},
		// Rounding up to the 4 KiB unit would break these limits: the
		// answer is a size within the limit or OUT_OF_RANGE; the driver
		// gives the limit itself.
		{name: "e one byte, limit one byte", cr: csitest.Range(1, 1), want: codes.OK, min: 1, max: 1},
		{name: "e unaligned, limit below the next unit", cr: csitest.Range(4097, 5000), want: codes.OK, min: 4097, max: 5000},
		{name: "f required above maximum", cr: csitest.Range(maxSize+1, 0), want: codes.OutOfRange},
		{name: "f required far above maximum with limit", cr: csitest.Range(1<<40, 1<<41), want: codes.OutOfRange},
		{name: "maximum exactly", cr: csitest.Range(maxSize, maxSize), want: codes.OK, min: maxSize, max: maxSize},
		{name: "limit only, below default", cr: csitest.Range(0, 3*csitest.Mi), want: codes.OK, min: 1, max: 3 * csitest.Mi},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := available(t, in)
			resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
				Name:               fmt.Sprintf("c03-%d", i),
				CapacityRange:      tc.cr,
				VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
			})
			csitest.MustCode(t, err, tc.want, "CreateVolume")
			if tc.want != codes.OK {
				assertListMatchesDisk(t, in, created...)
				if got := available(t, in); got != before {
					t.Errorf("failed CreateVolume changed available capacity %d -> %d", before, got)
				}
				return
			}
			v := resp.GetVolume()
			created = append(created, v.GetVolumeId())
			if c := v.GetCapacityBytes(); c < tc.min || c > tc.max {
				t.Errorf("capacity %d, want within [%d, %d]", c, tc.min, tc.max)
			}
			assertListMatchesDisk(t, in, created...)
			if got := available(t, in); got != before-v.GetCapacityBytes() {
				t.Errorf("available capacity %d -> %d, want a decrease of exactly %d", before, got, v.GetCapacityBytes())
			}
		})
	}
	for _, id := range created {
		deleteVolume(t, in, id)
	}
	assertListMatchesDisk(t, in)
}

// C03 for image and raw block volumes: their loop devices have 4096-byte
// sectors, so their sizes are whole blocks. Where a bound (limit_bytes,
// --max-volume-size) is unaligned the size is the block below it, and
// OUT_OF_RANGE, changing nothing, where no whole block fits the range;
// the image file holds exactly the capacity answered, creation and
// expansion alike.
func TestC03ImageAndBlockSizesAreWholeBlocks(t *testing.T) {
	const maxSize = 64*csitest.Mi + 100
	in := testdriver.Start(t, func(o *driver.Options) {
		o.CapacityBytes = 512 * csitest.Mi
		o.DefaultVolumeBytes = 8 * csitest.Mi
		o.MaxVolumeBytes = maxSize
	})
	kinds := []struct {
		name string
		cap  *csi.VolumeCapability
	}{{"block", csitest.BlkCap()}, {"ext4", csitest.MntCapFS("ext4")}}
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) {
			var created []string
			for i, tc := range []struct {
				name string
				cr   *csi.CapacityRange
				want int64 // 0: OUT_OF_RANGE
			}{
				{"one byte, limit one byte", csitest.Range(1, 1), 0},
				{"unaligned, limit below the next block", csitest.Range(4097, 5000), 0},
				{"required = limit, unaligned", csitest.Range(2*csitest.Mi+1, 2*csitest.Mi+1), 0},
				{"required above the maximum's last block", csitest.Range(64*csitest.Mi+1, 0), 0},
				{"unaligned limit", csitest.Range(csitest.Mi, csitest.Mi+100), csitest.Mi},
				{"limit only, unaligned", csitest.Range(0, 3*csitest.Mi+100), 3 * csitest.Mi},
				{"unaligned required", csitest.Range(csitest.Mi+1, 0), csitest.Mi + 4096},
				{"at the unaligned maximum", csitest.Range(64*csitest.Mi, 0), 64 * csitest.Mi},
			} {
				t.Run(tc.name, func(t *testing.T) {
					before := available(t, in)
					resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
						Name:               fmt.Sprintf("c03-%s-%d", k.name, i),
						CapacityRange:      tc.cr,
						VolumeCapabilities: []*csi.VolumeCapability{k.cap},
					})
					if tc.want == 0 {
						csitest.MustCode(t, err, codes.OutOfRange, "CreateVolume")
						if got := available(t, in); got != before {
							t.Errorf("failed CreateVolume changed available capacity %d -> %d", before, got)
						}
						if ids := listIDs(t, in.Controller); len(ids) != len(created) {
							t.Errorf("%d volumes listed after a refused CreateVolume, want %d", len(ids), len(created))
						}
						return
					}
					csitest.MustCode(t, err, codes.OK, "CreateVolume")
					v := resp.GetVolume()
					created = append(created, v.GetVolumeId())
					if v.GetCapacityBytes() != tc.want {
						t.Errorf("capacity %d, want %d", v.GetCapacityBytes(), tc.want)
					}
					assertImageSize(t, in, v.GetVolumeId(), tc.want)
				})
			}
			// Expansion to an unaligned limit grows to the block below it;
			// a range holding no whole block is refused, the image unchanged.
			id := created[0]
			resp, err := in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{
				VolumeId: id, CapacityRange: csitest.Range(16*csitest.Mi, 16*csitest.Mi+100), VolumeCapability: k.cap,
			})
			csitest.MustCode(t, err, codes.OK, "ControllerExpandVolume to an unaligned limit")
			if resp.GetCapacityBytes() != 16*csitest.Mi {
				t.Errorf("expanded to %d bytes, want %d", resp.GetCapacityBytes(), 16*csitest.Mi)
			}
			assertImageSize(t, in, id, 16*csitest.Mi)
			_, err = in.Controller.ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{
				VolumeId: id, CapacityRange: csitest.Range(20*csitest.Mi+1, 20*csitest.Mi+2), VolumeCapability: k.cap,
			})
			csitest.MustCode(t, err, codes.OutOfRange, "ControllerExpandVolume to a range without a whole block")
			assertImageSize(t, in, id, 16*csitest.Mi)
			for _, id := range created {
				deleteVolume(t, in, id)
			}
		})
	}
}

// assertImageSize checks the size of the image file of image or block
// volume id (the only file named after it under the data root).
func assertImageSize(t testing.TB, in *testdriver.Instance, id string, want int64) {
	t.Helper()
	imgs, _ := filepath.Glob(filepath.Join(in.Opts.DataRoot, "*", id+".img"))
	if len(imgs) != 1 {
		t.Fatalf("volume %s: image files %v, want one", id, imgs)
	}
	if fi, err := os.Stat(imgs[0]); err != nil || fi.Size() != want {
		t.Errorf("image %s: %v, want %d bytes", imgs[0], err, want)
	}
}

// C04: DeleteVolume succeeds for unknown ids and for a volume whose data
// vanished (twice), returns its capacity, and refuses with
// FAILED_PRECONDITION while the volume is staged or published, keeping its
// data.
func TestC04DeleteVolumeIdempotentAndInUse(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) { o.CapacityBytes = 64 * csitest.Mi })

	t.Run("unknown and empty ids", func(t *testing.T) {
		for _, tc := range []struct {
			id   string
			want codes.Code
		}{
			{"no-such-id", codes.OK},
			{unknownID, codes.OK},
			{"", codes.InvalidArgument},
		} {
			_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: tc.id})
			csitest.CodeIs(t, err, tc.want, fmt.Sprintf("DeleteVolume{%q}", tc.id))
		}
		assertListMatchesDisk(t, in)
	})

	t.Run("backing directory removed out of band", func(t *testing.T) {
		empty := available(t, in)
		x := createVolume(t, in, "c04-x", 4*csitest.Mi).GetVolumeId()
		if got := available(t, in); got != empty-4*csitest.Mi {
			t.Fatalf("available after create = %d, want %d", got, empty-4*csitest.Mi)
		}
		if err := os.RemoveAll(volDir(in, x)); err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: x})
			csitest.CodeIs(t, err, codes.OK, fmt.Sprintf("DeleteVolume #%d of a volume without data", i+1))
		}
		assertListMatchesDisk(t, in)
		if got := available(t, in); got != empty {
			t.Errorf("available after delete = %d, want %d (capacity returned)", got, empty)
		}
	})

	t.Run("staged and published", func(t *testing.T) {
		y := createVolume(t, in, "c04-y", 4*csitest.Mi).GetVolumeId()
		staging := csitest.Mkdir(t, in.Dir+"/c04/staging")
		target := in.Dir + "/c04/target"
		data := csitest.RandomBytes(4, int(64*csitest.Ki))

		stage(t, in, y, staging)
		_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: y})
		csitest.CodeIs(t, err, codes.FailedPrecondition, "DeleteVolume of a staged volume")

		publish(t, in, y, staging, target)
		writeFileSynced(t, target+"/f", data)
		for i := range 2 {
			_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: y})
			csitest.CodeIs(t, err, codes.FailedPrecondition, fmt.Sprintf("DeleteVolume #%d of a published volume", i+1))
		}
		csitest.AssertFileBytes(t, target+"/f", data)
		csitest.AssertFileBytes(t, volDir(in, y)+"/f", data)
		assertShowsVolume(t, in, target, y)
		assertShowsVolume(t, in, staging, y)
		assertListMatchesDisk(t, in, y)

		unpublish(t, in, y, target)
		_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: y})
		csitest.CodeIs(t, err, codes.FailedPrecondition, "DeleteVolume of a volume still staged")
		csitest.AssertFileBytes(t, volDir(in, y)+"/f", data)

		unstage(t, in, y, staging)
		deleteVolume(t, in, y)
		assertListMatchesDisk(t, in)
	})
}
