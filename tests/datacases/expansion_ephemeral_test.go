package datacases

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
)

// TestC22ExpansionEdgeCases: C22 on a btrfs volume (so "any quota is
// raised" can be checked by writing) with --max-volume-size 64Mi. For an
// 8Mi volume X: a smaller size is OK and keeps 8Mi and the data, no
// capacity_range is INVALID_ARGUMENT, an unknown id NOT_FOUND, above the
// maximum OUT_OF_RANGE, an empty capacity_range INVALID_ARGUMENT, only a
// limit_bytes it fits OK at 8Mi, one below 8Mi OUT_OF_RANGE. NodeExpandVolume of X at its publish directory
// with 16Mi is OK and raises the quota; an unknown volume is NOT_FOUND.
func TestC22ExpansionEdgeCases(t *testing.T) {
	e := startEngine(t, mountEngines[1], func(o *driver.Options) { o.MaxVolumeBytes = 64 * csitest.Mi })
	x := e.create("x", 8*csitest.Mi, false)
	id := x.GetVolumeId()
	s, tgt := e.attach(id, false)
	keep := csitest.RandomBytes(31, int(6*csitest.Mi))
	mustWrite(t, filepath.Join(tgt, "keep"), keep)
	avail := e.available()
	expand := func(id string, cr *csi.CapacityRange) (*csi.ControllerExpandVolumeResponse, error) {
		return e.ctl().ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: cr})
	}

	resp, err := expand(id, csitest.Range(4*csitest.Mi, 0))
	if csitest.CodeIs(t, err, codes.OK, "ControllerExpandVolume to 4Mi (below the size)") && resp.GetCapacityBytes() != 8*csitest.Mi {
		t.Errorf("ControllerExpandVolume to 4Mi: capacity %d, want 8Mi", resp.GetCapacityBytes())
	}
	_, err = expand(id, nil)
	csitest.CodeIs(t, err, codes.InvalidArgument, "ControllerExpandVolume without capacity_range")
	_, err = expand("nope", csitest.Range(16*csitest.Mi, 0))
	csitest.CodeIs(t, err, codes.NotFound, "ControllerExpandVolume of an unknown volume")
	_, err = expand(id, csitest.Range(128*csitest.Mi, 0))
	csitest.CodeIs(t, err, codes.OutOfRange, "ControllerExpandVolume above --max-volume-size")
	// An empty capacity_range must not fall back to the default size of
	// a new volume (it grew an 8Mi volume to 1Gi).
	_, err = expand(id, csitest.Range(0, 0))
	csitest.CodeIs(t, err, codes.InvalidArgument, "ControllerExpandVolume with neither required_bytes nor limit_bytes")
	// Only a limit the volume fits: nothing to grow, the current size.
	resp, err = expand(id, csitest.Range(0, 16*csitest.Mi))
	if csitest.CodeIs(t, err, codes.OK, "ControllerExpandVolume with only limit_bytes 16Mi") && resp.GetCapacityBytes() != 8*csitest.Mi {
		t.Errorf("ControllerExpandVolume with only limit_bytes: capacity %d, want 8Mi", resp.GetCapacityBytes())
	}
	// A limit below the size: volumes never shrink.
	_, err = expand(id, csitest.Range(0, 4*csitest.Mi))
	csitest.CodeIs(t, err, codes.OutOfRange, "ControllerExpandVolume with limit_bytes below the size")
	if got := e.capacityOf(id); got != 8*csitest.Mi {
		t.Errorf("capacity after the refused expansions: %d, want 8Mi", got)
	}
	if got := e.available(); got != avail {
		t.Errorf("GetCapacity after the refused expansions: %d, want %d", got, avail)
	}
	assertFile(t, filepath.Join(tgt, "keep"), keep)
	// Still 8Mi: 6Mi + 4Mi does not fit.
	syncfs(t, tgt)
	if err := csitest.WriteSynced(filepath.Join(tgt, "more"), csitest.RandomBytes(32, int(4*csitest.Mi))); !isQuotaErr(err) {
		t.Errorf("writing 10Mi into the 8Mi volume: err = %v, want EDQUOT or ENOSPC", err)
	}
	_ = unix.Unlink(filepath.Join(tgt, "more"))
	syncfs(t, tgt)

	nresp, err := e.node().NodeExpandVolume(csitest.Ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: id, VolumePath: tgt, CapacityRange: csitest.Range(16*csitest.Mi, 0)})
	if csitest.CodeIs(t, err, codes.OK, "NodeExpandVolume of mount volume X at its publish directory with 16Mi") {
		if nresp.GetCapacityBytes() != 16*csitest.Mi {
			t.Errorf("NodeExpandVolume: capacity %d, want 16Mi", nresp.GetCapacityBytes())
		}
		if err := csitest.WriteSynced(filepath.Join(tgt, "more"), csitest.RandomBytes(32, int(8*csitest.Mi))); err != nil {
			t.Errorf("writing 14Mi after the node expansion to 16Mi: %v (the quota was not raised)", err)
		}
		if got := e.capacityOf(id); got != 16*csitest.Mi {
			t.Errorf("recorded capacity after the node expansion: %d, want 16Mi", got)
		}
		if got := e.available(); got != avail-8*csitest.Mi {
			t.Errorf("GetCapacity after the node expansion: %d, want %d (8Mi more taken)", got, avail-8*csitest.Mi)
		}
	}
	_, err = e.node().NodeExpandVolume(csitest.Ctx(t), &csi.NodeExpandVolumeRequest{VolumeId: "nope", VolumePath: "some/path"})
	csitest.CodeIs(t, err, codes.NotFound, "NodeExpandVolume of an unknown volume")
	e.detach(id, s, tgt)
	e.deleteVolume(id)
}

// TestC23ExpansionRespectsCapacity: C23 with --capacity 100Mi. A 60Mi
// volume leaves 40Mi; expanding it to 150Mi, more than the node holds in
// all, is OUT_OF_RANGE naming the node's room (Kubernetes marks it
// infeasible, so the user may ask for less; more than is left now but
// within the node is RESOURCE_EXHAUSTED, in tests/reliability's
// exhaustion test) and it stays 60Mi, on record and (btrfs) in its quota;
// expanding to 90Mi succeeds and leaves 10Mi.
func TestC23ExpansionRespectsCapacity(t *testing.T) {
	for _, ec := range mountEngines {
		t.Run(ec.name, func(t *testing.T) {
			e := startEngine(t, ec, func(o *driver.Options) { o.CapacityBytes = 100 * csitest.Mi })
			v := e.create("v", 60*csitest.Mi, false)
			id := v.GetVolumeId()
			if got := e.available(); got != 40*csitest.Mi {
				t.Errorf("GetCapacity with 60Mi of 100Mi taken: %d, want 40Mi", got)
			}
			s, tgt := e.attach(id, false)
			_, err := e.ctl().ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(150*csitest.Mi, 0)})
			csitest.CodeIs(t, err, codes.OutOfRange, "ControllerExpandVolume to 150Mi of a 100Mi node")
			if msg := status.Convert(err).Message(); !strings.Contains(msg, "holds 104857600 bytes in all (41943040 more available now)") {
				t.Errorf("ControllerExpandVolume to 150Mi: message %q does not name the node's room", msg)
			}
			if got := e.capacityOf(id); got != 60*csitest.Mi {
				t.Errorf("capacity after the refused expansion: %d, want 60Mi", got)
			}
			if got := e.available(); got != 40*csitest.Mi {
				t.Errorf("GetCapacity after the refused expansion: %d, want 40Mi", got)
			}
			if ec.engine == "btrfs" {
				mustWrite(t, filepath.Join(tgt, "a"), csitest.RandomBytes(33, int(50*csitest.Mi)))
				syncfs(t, tgt)
				if err := csitest.WriteSynced(filepath.Join(tgt, "b"), csitest.RandomBytes(34, int(20*csitest.Mi))); !isQuotaErr(err) {
					t.Errorf("writing 70Mi after the refused expansion: err = %v, want EDQUOT or ENOSPC (quota still 60Mi)", err)
				}
				_ = unix.Unlink(filepath.Join(tgt, "b"))
				syncfs(t, tgt)
			}
			resp, err := e.ctl().ControllerExpandVolume(csitest.Ctx(t), &csi.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: csitest.Range(90*csitest.Mi, 0)})
			if csitest.CodeIs(t, err, codes.OK, "ControllerExpandVolume to 90Mi") && resp.GetCapacityBytes() != 90*csitest.Mi {
				t.Errorf("ControllerExpandVolume to 90Mi: capacity %d", resp.GetCapacityBytes())
			}
			if got := e.available(); got != 10*csitest.Mi {
				t.Errorf("GetCapacity after expanding to 90Mi: %d, want 10Mi", got)
			}
			if got := e.capacityOf(id); got != 90*csitest.Mi {
				t.Errorf("capacity after expanding to 90Mi: %d", got)
			}
			if ec.engine == "btrfs" {
				if err := csitest.WriteSynced(filepath.Join(tgt, "b"), csitest.RandomBytes(34, int(20*csitest.Mi))); err != nil {
					t.Errorf("writing 70Mi into the volume grown to 90Mi: %v", err)
				}
			}
			e.detach(id, s, tgt)
			e.deleteVolume(id)
			if got := e.available(); got != 100*csitest.Mi {
				t.Errorf("GetCapacity after deleting the volume: %d, want 100Mi", got)
			}
		})
	}
}

func ephemeralReq(id, target, size string) *csi.NodePublishVolumeRequest {
	vc := map[string]string{"csi.storage.k8s.io/ephemeral": "true"}
	if size != "" {
		vc["size"] = size
	}
	return &csi.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: csitest.MntCap(), VolumeContext: vc}
}

// TestC29EphemeralLifecycle: C29. An ephemeral inline volume of 10Mi is
// created and bind-mounted by NodePublishVolume (its capacity taken); a
// repeated publish is OK with the file written still there and one mount;
// two concurrent unpublishes and a third are all OK, and afterwards the
// target, the data directory and the capacity are all given back.
func TestC29EphemeralLifecycle(t *testing.T) {
	e := diskEnv(t)
	before := e.available()
	volsBefore := csitest.DirNames(t, filepath.Join(e.root, "volumes"))
	_, target := e.paths()
	_, err := e.node().NodePublishVolume(csitest.Ctx(t), ephemeralReq("csi-e2", target, "10Mi"))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume ephemeral csi-e2")
	var dataDir string
	for _, n := range csitest.DirNames(t, filepath.Join(e.root, "volumes")) {
		if !slices.Contains(volsBefore, n) {
			if dataDir != "" {
				t.Fatalf("more than one new volume directory for one ephemeral publish")
			}
			dataDir = filepath.Join(e.root, "volumes", n)
		}
	}
	if dataDir == "" {
		t.Fatal("no data directory for the ephemeral volume under the data root")
	}
	if n := len(csitest.MountsAt(t, target)); n != 1 || !csitest.SameInode(t, target, dataDir) {
		t.Fatalf("%s: %d mounts, want one bind mount of %s", target, n, dataDir)
	}
	if got := e.available(); got != before-10*csitest.Mi {
		t.Errorf("GetCapacity with the ephemeral volume: %d, want %d (10Mi taken)", got, before-10*csitest.Mi)
	}
	f := csitest.RandomBytes(35, 4096)
	mustWrite(t, filepath.Join(target, "f"), f)

	_, err = e.node().NodePublishVolume(csitest.Ctx(t), ephemeralReq("csi-e2", target, "10Mi"))
	csitest.CodeIs(t, err, codes.OK, "repeated NodePublishVolume of csi-e2")
	assertFile(t, filepath.Join(target, "f"), f)
	if n := len(csitest.MountsAt(t, target)); n != 1 {
		t.Errorf("%s: %d mounts after the repeated publish, want 1", target, n)
	}
	if got := e.available(); got != before-10*csitest.Mi {
		t.Errorf("GetCapacity after the repeated publish: %d, want %d", got, before-10*csitest.Mi)
	}
	st, err := e.node().NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: "csi-e2", VolumePath: target})
	if csitest.CodeIs(t, err, codes.OK, "NodeGetVolumeStats of the ephemeral volume") && st.GetUsage()[0].GetTotal() != 10*csitest.Mi {
		t.Errorf("NodeGetVolumeStats: total %d, want 10Mi", st.GetUsage()[0].GetTotal())
	}

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = e.node().NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-e2", TargetPath: target})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		csitest.CodeIs(t, err, codes.OK, "concurrent NodeUnpublishVolume #"+string(rune('1'+i)))
	}
	_, err = e.node().NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: "csi-e2", TargetPath: target})
	csitest.CodeIs(t, err, codes.OK, "third NodeUnpublishVolume")
	if n := len(csitest.MountsAt(t, target)); n != 0 {
		t.Errorf("%s: %d mounts after unpublish", target, n)
	}
	csitest.AssertGone(t, target)
	csitest.AssertGone(t, dataDir)
	if got := e.available(); got != before {
		t.Errorf("GetCapacity after unpublish: %d, want %d (capacity returned)", got, before)
	}
	if _, err := os.Stat(filepath.Dir(target)); err != nil {
		t.Errorf("the pod directory above the target was removed: %v", err)
	}
}
