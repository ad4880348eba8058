package cases

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// Node teardown calls that name a path the volume is not staged or
// published at must change nothing of what is staged or published
// elsewhere (found by trying the driver as a CO that makes mistakes).

// A NodeUnstageVolume of a raw block volume at a staging path where it
// was never staged answers OK and leaves the loop device attached: before,
// it detached it under a live publication, whose target then held the
// number of a free loop device that anything could attach next. An unstage
// at the real staging path while the volume is published is
// FAILED_PRECONDITION; after the unpublish it detaches.
func TestUnstageBlockAtAnotherPathKeepsItsDevice(t *testing.T) {
	in := testdriver.Start(t, nil)
	id := createBlock(t, in, "unstage-elsewhere", 8*csitest.Mi)
	staging := filepath.Join(in.Dir, "S1")
	stageBlock(t, in, id, staging)
	rw := loopOfMode(t, in, id, false)
	target := filepath.Join(in.Dir, "T")
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishBlockReq(id, staging, target, false))
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume")
	data := csitest.RandomBytes(38, 4096)
	if err := writeDevice(target, 0, data); err != nil {
		t.Fatal(err)
	}

	other := csitest.Mkdir(t, filepath.Join(in.Dir, "S2"))
	_, err = in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: other})
	csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume at a path it is not staged at")
	assertLoops(t, in, id, 1, 0)
	assertDeviceAt(t, target, rw, false)
	if rdevOf(t, filepath.Join(staging, id)) != rdevOf(t, rw) {
		t.Errorf("the device node at the real staging path changed")
	}
	if string(readDevice(t, target, 0, len(data))) != string(data) {
		t.Errorf("the published device no longer reads what was written")
	}

	_, err = in.Node.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	csitest.MustCode(t, err, codes.FailedPrecondition, "NodeUnstageVolume while published")
	assertLoops(t, in, id, 1, 0)
	assertDeviceAt(t, target, rw, false)

	_, err = in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	csitest.MustCode(t, err, codes.OK, "NodeUnpublishVolume")
	unstageBlock(t, in, id, staging)
	// A retry, and one at the other path, find nothing to do.
	unstageBlock(t, in, id, staging)
	unstageBlock(t, in, id, other)
}

// C15: NodeUnpublishVolume deletes what a publish creates at target_path —
// a directory, or the empty file a block volume is bound onto — and
// nothing else: a file with data, a FIFO or a device node at target_path
// is FAILED_PRECONDITION and stays as it was.
func TestUnpublishRemovesOnlyWhatAPublishMakes(t *testing.T) {
	in := testdriver.Start(t, nil)
	x := createVolume(t, in, "unpublish-kinds", 4*csitest.Mi).GetVolumeId()
	data := []byte("db password, not a mount point\n")
	cases := []struct {
		name string
		make func(p string) error
		keep bool
	}{
		{"file with data", func(p string) error { return os.WriteFile(p, data, 0o600) }, true},
		{"FIFO", func(p string) error { return unix.Mkfifo(p, 0o600) }, true},
		{"character device", func(p string) error { return unix.Mknod(p, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))) }, true},
		{"empty file", func(p string) error { return os.WriteFile(p, nil, 0o600) }, false},
		{"empty directory", func(p string) error { return os.Mkdir(p, 0o750) }, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(in.Dir, "target-"+filepath.Base(t.Name()))
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			before, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			_, err = in.Node.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: p})
			if !c.keep {
				csitest.MustCode(t, err, codes.OK, "NodeUnpublishVolume of "+c.name)
				csitest.AssertGone(t, p)
				return
			}
			csitest.MustCode(t, err, codes.FailedPrecondition, "NodeUnpublishVolume of a "+c.name)
			after, err := os.Lstat(p)
			if err != nil {
				t.Fatalf("%s is gone: %v", c.name, err)
			}
			if after.Mode() != before.Mode() || after.Size() != before.Size() {
				t.Errorf("%s changed: %v %d bytes, was %v %d", c.name, after.Mode(), after.Size(), before.Mode(), before.Size())
			}
			if c.name == "file with data" {
				csitest.AssertFileBytes(t, p, data)
			}
		})
	}
}

// A publish whose target_path is its staging_target_path (or inside
// it) is INVALID_ARGUMENT and mounts nothing; a SINGLE_NODE_READER_ONLY
// publication is read-only even when the request's readonly is false.
func TestPublishTargetApartAndReaderOnly(t *testing.T) {
	in := testdriver.Start(t, nil)
	x := createVolume(t, in, "publish-apart", 4*csitest.Mi).GetVolumeId()
	staging := csitest.Mkdir(t, filepath.Join(in.Dir, "staging"))
	stage(t, in, x, staging)
	for _, target := range []string{staging, filepath.Join(staging, "inside")} {
		_, err := in.Node.NodePublishVolume(csitest.Ctx(t), publishReq(x, staging, target))
		csitest.MustCode(t, err, codes.InvalidArgument, "NodePublishVolume at "+target)
	}
	assertMountCount(t, staging, 1)
	csitest.AssertGone(t, filepath.Join(staging, "inside"))

	target := filepath.Join(in.Dir, "reader")
	req := publishReq(x, staging, target)
	req.VolumeCapability.AccessMode.Mode = csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY
	_, err := in.Node.NodePublishVolume(csitest.Ctx(t), req)
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume SINGLE_NODE_READER_ONLY")
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o600); !errors.Is(err, unix.EROFS) {
		t.Errorf("write into a SINGLE_NODE_READER_ONLY publication: %v, want EROFS", err)
	}
	_, err = in.Node.NodePublishVolume(csitest.Ctx(t), req)
	csitest.MustCode(t, err, codes.OK, "repeated NodePublishVolume SINGLE_NODE_READER_ONLY")
	unpublish(t, in, x, target)
	unstage(t, in, x, staging)
}
