package cases

import (
	"encoding/base64"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// C13: volume ids (and names) never become paths. Ids built to reach victim
// directories above the data root, if the driver joined them onto
// <root>/volumes or <root>/snapshots, are unknown ids: deletes are OK and
// remove nothing, lookups are NOT_FOUND, the ephemeral publish is
// INVALID_ARGUMENT and creates nothing, no call is INTERNAL, and nothing
// outside the data root changes.
//
// The data root is nested four levels below this test's temp dir, so that
// every id tried here, even through a driver with the bug, resolves inside
// that temp dir and never in /tmp itself.
//
// Not covered here (mount volumes only): DeleteSnapshot{"../../victim-data"}
// (victim-data.snap/config.bak is laid out for it) belongs to the snapshots
// feature; the snapshot ids are exercised here as a restore source, and the
// ephemeral publish only as a request that must be refused.
func TestC13PathTraversalThroughIDs(t *testing.T) {
	in := testdriver.Start(t, func(o *driver.Options) {
		o.DataRoot = filepath.Join(filepath.Dir(o.DataRoot), "k1", "k2", "data")
		if err := os.MkdirAll(filepath.Dir(o.DataRoot), 0o750); err != nil {
			t.Fatal(err)
		}
	})
	dir := in.Dir
	root := in.Opts.DataRoot
	// levels[k] is where k "../" lead from <root>/volumes (or snapshots).
	levels := map[int]string{1: root, 2: filepath.Dir(root), 3: filepath.Dir(filepath.Dir(root)), 4: dir}
	if levels[4] != filepath.Dir(levels[3]) {
		t.Fatalf("layout: %v", levels)
	}

	// The victims, at every level a traversal could reach but the root.
	for k := 2; k <= 4; k++ {
		csitest.Mkdir(t, filepath.Join(levels[k], "victim-data.snap"))
		writeFileSynced(t, filepath.Join(levels[k], "victim-data.snap", "config.bak"), []byte("config"))
		csitest.Mkdir(t, filepath.Join(levels[k], "victim-vol"))
		writeFileSynced(t, filepath.Join(levels[k], "victim-vol", "keep"), []byte("keep"))
	}

	// A real published volume, so that T exists and is a mount.
	x := createVolume(t, in, "c13", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(dir, "S"))
	target := filepath.Join(dir, "T")
	stage(t, in, x, staging)
	publish(t, in, x, staging, target)

	relRoot, _ := filepath.Rel(dir, root)
	outsideRoot := func() map[string]string {
		tree := treeOf(t, dir)
		for k := range tree {
			if k == relRoot || strings.HasPrefix(k, relRoot+"/") || k == "csi.sock" {
				delete(tree, k)
			}
		}
		return tree
	}
	outside := outsideRoot()
	volTree := treeOf(t, volumesDir(in))

	var volIDs, snapIDs, evilIDs []string
	for k := 1; k <= 4; k++ {
		up := strings.Repeat("../", k)
		volIDs = append(volIDs, up+"victim-vol")
		snapIDs = append(snapIDs, up+"victim-data")
		evilIDs = append(evilIDs, up+"evil")
	}
	volIDs = append(volIDs, filepath.Join(dir, "victim-vol"), "a\x00b", x+"/../../../victim-vol", "..", ".", "../..")

	victimsIntact := func(after string) {
		t.Helper()
		for k := 2; k <= 4; k++ {
			for _, f := range []string{"victim-vol/keep", "victim-data.snap/config.bak"} {
				if _, err := os.Lstat(filepath.Join(levels[k], f)); err != nil {
					t.Fatalf("after %s: victim %s: %v", after, filepath.Join(levels[k], f), err)
				}
			}
		}
	}
	for _, id := range volIDs {
		_, err := in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.OK, "DeleteVolume "+strconvQuote(id))
		victimsIntact("DeleteVolume " + strconvQuote(id))

		_, err = in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name:               "x",
			VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Volume{
				Volume: &csi.VolumeContentSource_VolumeSource{VolumeId: id}}},
		})
		csitest.CodeIs(t, err, codes.NotFound, "CreateVolume cloned from "+strconvQuote(id))

		_, err = in.Node.NodeGetVolumeStats(csitest.Ctx(t), &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
		csitest.CodeIs(t, err, codes.NotFound, "NodeGetVolumeStats "+strconvQuote(id))

		_, err = in.Controller.ValidateVolumeCapabilities(csitest.Ctx(t), &csi.ValidateVolumeCapabilitiesRequest{
			VolumeId: id, VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
		csitest.CodeIs(t, err, codes.NotFound, "ValidateVolumeCapabilities "+strconvQuote(id))

		_, err = in.Controller.ControllerGetVolume(csitest.Ctx(t), &csi.ControllerGetVolumeRequest{VolumeId: id})
		csitest.CodeIs(t, err, codes.NotFound, "ControllerGetVolume "+strconvQuote(id))

		// Stage with a traversal id must not bind the victim anywhere.
		s2 := csitest.Mkdir(t, filepath.Join(dir, "S2"))
		_, err = in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: s2, VolumeCapability: csitest.MntCap()})
		csitest.CodeIs(t, err, codes.NotFound, "NodeStageVolume "+strconvQuote(id))
		assertMountCount(t, s2, 0)
		t2 := filepath.Join(dir, "T2")
		_, err = in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(id, staging, t2))
		csitest.CodeIs(t, err, codes.NotFound, "NodePublishVolume "+strconvQuote(id))
		csitest.AssertGone(t, t2)
		if err := os.Remove(s2); err != nil {
			t.Fatal(err)
		}

		// A page token carrying the id is not one the driver issued.
		tok := base64.RawURLEncoding.EncodeToString([]byte("v1:" + id))
		_, err = in.Controller.ListVolumes(csitest.Ctx(t), &csi.ListVolumesRequest{StartingToken: tok})
		csitest.CodeIs(t, err, codes.Aborted, "ListVolumes with a token for "+strconvQuote(id))
	}
	for _, id := range snapIDs {
		_, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
			Name:               "x",
			VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
			VolumeContentSource: &csi.VolumeContentSource{Type: &csi.VolumeContentSource_Snapshot{
				Snapshot: &csi.VolumeContentSource_SnapshotSource{SnapshotId: id}}},
		})
		csitest.CodeIs(t, err, codes.NotFound, "CreateVolume restored from "+strconvQuote(id))
	}
	for _, id := range evilIDs {
		te := filepath.Join(dir, "TE")
		_, err := in.Node.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{
			VolumeId: id, TargetPath: te, VolumeCapability: csitest.MntCap(),
			VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true"},
		})
		csitest.CodeIs(t, err, codes.InvalidArgument, "ephemeral NodePublishVolume "+strconvQuote(id))
		csitest.AssertGone(t, te)
	}
	// Every place a join of "evil" could have landed.
	for k := 1; k <= 4; k++ {
		csitest.AssertGone(t, filepath.Join(levels[k], "evil"))
	}
	csitest.AssertGone(t, filepath.Join(volumesDir(in), "evil"))

	// A name is never a path either.
	resp, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{
		Name: "../../victim-vol", CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()},
	})
	csitest.MustCode(t, err, codes.OK, "CreateVolume named ../../victim-vol")
	named := resp.GetVolume().GetVolumeId()
	assertListMatchesDisk(t, in, x, named)
	deleteVolume(t, in, named)

	// Nothing outside the data root changed (the test's own S and T
	// included), and the volumes dir holds what it held.
	after := outsideRoot()
	for k, v := range outside {
		if after[k] != v {
			t.Errorf("outside the data root, %q changed: %q -> %q", k, v, after[k])
		}
	}
	for k, v := range after {
		if _, ok := outside[k]; !ok {
			t.Errorf("outside the data root, %q (%s) appeared", k, v)
		}
	}
	assertTreeUnchanged(t, volumesDir(in), volTree)
	for k := 2; k <= 4; k++ {
		csitest.AssertFileBytes(t, filepath.Join(levels[k], "victim-vol", "keep"), []byte("keep"))
		csitest.AssertFileBytes(t, filepath.Join(levels[k], "victim-data.snap", "config.bak"), []byte("config"))
	}

	unpublish(t, in, x, target)
	unstage(t, in, x, staging)
	deleteVolume(t, in, x)
}

func strconvQuote(s string) string { return `"` + strings.ReplaceAll(s, "\x00", `\x00`) + `"` }

// C15: a symlink as the last component of a target or staging path is
// refused with INVALID_ARGUMENT and nothing is mounted through it; a
// symlink higher up (a symlinked /var/lib/kubelet) works; unpublishing a
// symlink removes only the link, never what it points to.
//
// The stand-ins for /etc and /srv/keep are directories this test creates.
func TestC15SymlinkTargetAndStagingPaths(t *testing.T) {
	in := testdriver.Start(t, nil)
	dir := in.Dir
	x := createVolume(t, in, "c15", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(dir, "staging"))
	stage(t, in, x, staging)

	etc := csitest.Mkdir(t, filepath.Join(dir, "etc"))
	writeFileSynced(t, filepath.Join(etc, "passwd"), []byte("root:x:0:0::/root:/bin/sh\n"))
	keep := csitest.Mkdir(t, filepath.Join(dir, "srv", "keep"))
	writeFileSynced(t, filepath.Join(keep, "file"), []byte("keep me"))
	csitest.Mkdir(t, filepath.Join(keep, "sub"))
	writeFileSynced(t, filepath.Join(keep, "sub", "file"), []byte("keep me too"))
	etcTree, keepTree := treeOf(t, etc), treeOf(t, keep)

	t.Run("publish onto a symlink", func(t *testing.T) {
		link := filepath.Join(csitest.Mkdir(t, filepath.Join(dir, "pods", "p1", "vol")), "mount")
		if err := os.Symlink(etc, link); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(x, staging, link))
			csitest.CodeIs(t, err, codes.InvalidArgument, "NodePublishVolume onto a symlink")
		}
		assertMountCount(t, etc, 0)
		assertMountCount(t, link, 0)
		if got, err := os.Readlink(link); err != nil || got != etc {
			t.Errorf("the symlink was changed: %q, %v", got, err)
		}
		assertTreeUnchanged(t, etc, etcTree)
	})

	t.Run("stage onto a symlink", func(t *testing.T) {
		link := filepath.Join(dir, "staging-link")
		if err := os.Symlink(etc, link); err != nil {
			t.Fatal(err)
		}
		_, err := in.Node.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: link, VolumeCapability: csitest.MntCap()})
		csitest.CodeIs(t, err, codes.InvalidArgument, "NodeStageVolume onto a symlink")
		assertMountCount(t, etc, 0)
		assertTreeUnchanged(t, etc, etcTree)
	})

	t.Run("symlinked kubelet directory", func(t *testing.T) {
		real := csitest.Mkdir(t, filepath.Join(dir, "var-lib-kubelet"))
		kubelet := filepath.Join(dir, "kubelet")
		if err := os.Symlink(real, kubelet); err != nil {
			t.Fatal(err)
		}
		csitest.Mkdir(t, filepath.Join(kubelet, "pods", "p2", "vol"))
		s2 := csitest.Mkdir(t, filepath.Join(kubelet, "plugins", "staging"))
		target := filepath.Join(kubelet, "pods", "p2", "vol", "mount")
		y := createVolume(t, in, "c15-y", 4*csitest.Mi).GetVolumeId()

		stage(t, in, y, s2)
		publish(t, in, y, s2, target)
		writeFileSynced(t, filepath.Join(target, "f"), []byte("through the symlinked parent"))
		csitest.AssertFileBytes(t, filepath.Join(volDir(in, y), "f"), []byte("through the symlinked parent"))
		assertShowsVolume(t, in, filepath.Join(real, "pods", "p2", "vol", "mount"), y)

		unpublish(t, in, y, target)
		csitest.AssertGone(t, filepath.Join(real, "pods", "p2", "vol", "mount"))
		unstage(t, in, y, s2)
		deleteVolume(t, in, y)
		if fi, err := os.Lstat(kubelet); err != nil || fi.Mode()&os.ModeSymlink == 0 {
			t.Errorf("the symlinked parent was changed: %v, %v", fi, err)
		}
	})

	t.Run("unpublish a symlink", func(t *testing.T) {
		t2 := filepath.Join(dir, "T2")
		if err := os.Symlink(keep, t2); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: t2})
			csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume of a symlink")
		}
		csitest.AssertGone(t, t2)
		assertTreeUnchanged(t, keep, keepTree)
	})

	t.Run("unpublish a symlink to a live mount", func(t *testing.T) {
		// The link must be removed without unmounting what it points to.
		target := filepath.Join(dir, "T")
		publish(t, in, x, staging, target)
		writeFileSynced(t, filepath.Join(target, "f"), []byte("live"))
		t3 := filepath.Join(dir, "T3")
		if err := os.Symlink(target, t3); err != nil {
			t.Fatal(err)
		}
		_, err := in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: t3})
		csitest.CodeIs(t, err, codes.OK, "NodeUnpublishVolume of a symlink to a mount")
		csitest.AssertGone(t, t3)
		assertShowsVolume(t, in, target, x)
		csitest.AssertFileBytes(t, filepath.Join(target, "f"), []byte("live"))
		unpublish(t, in, x, target)
	})

	assertTreeUnchanged(t, etc, etcTree)
	assertTreeUnchanged(t, keep, keepTree)
	unstage(t, in, x, staging)
	deleteVolume(t, in, x)
}
