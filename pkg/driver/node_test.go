package driver

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"

	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/mount"
	"github.com/localdir-csi/localdir/pkg/publish"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// Unit tests of the Node service on a mount.Fake: they need no root (the
// data root, staging and target paths are temporary directories; only the
// mounts are pretended), so they run in `make unit` as any user.

// fakeNode is an all-mode driver on a temporary data root whose Node
// service mounts with m.
type fakeNode struct {
	d       *Driver
	ctrl    *controller
	node    *node
	m       mount.Interface
	kubelet string
}

func newFakeNode(t *testing.T, m mount.Interface) *fakeNode {
	t.Helper()
	dir := t.TempDir()
	opts := Options{Mode: ModeAll, Endpoint: "unix://" + filepath.Join(dir, "csi.sock"), DriverName: DefaultDriverName,
		NodeID: "node-1", DataRoot: filepath.Join(dir, "data"), Engine: "dir", DefaultVolumeBytes: 1 << 20,
		KubeletRoot: filepath.Join(dir, "kubelet")}
	if err := os.MkdirAll(filepath.Join(opts.KubeletRoot, "pods"), 0o750); err != nil {
		t.Fatal(err)
	}
	st, err := volume.Open(volume.Config{DataRoot: opts.DataRoot, Engine: opts.Engine})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := publish.New(st.NodeAccess(), publish.Config{Mounter: m})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Recover(pub); err != nil {
		t.Fatal(err)
	}
	d, err := New(opts, Node{Volumes: st, Snapshots: st.Snapshots(), Publisher: pub})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return &fakeNode{d: d, ctrl: &controller{d: d}, node: &node{d: d}, m: m, kubelet: opts.KubeletRoot}
}

var swCap = &csi.VolumeCapability{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}

func capWithFlags(flags ...string) *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: swCap.AccessMode,
	}
}

// volume creates a mount volume and a staging directory for it.
func (f *fakeNode) volume(t *testing.T, name string) (id, staging string) {
	t.Helper()
	resp, err := f.ctrl.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: name, VolumeCapabilities: []*csi.VolumeCapability{swCap}})
	wantCode(t, err, codes.OK)
	staging = filepath.Join(f.kubelet, "stage-"+name)
	if err := os.Mkdir(staging, 0o750); err != nil {
		t.Fatal(err)
	}
	return resp.GetVolume().GetVolumeId(), staging
}

func (f *fakeNode) stage(id, staging string, c *csi.VolumeCapability) error {
	_, err := f.node.NodeStageVolume(context.Background(), &csi.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: c})
	return err
}

func (f *fakeNode) publish(id, staging, target string, readonly bool) error {
	_, err := f.node.NodePublishVolume(context.Background(), &csi.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: swCap, Readonly: readonly})
	return err
}

func (f *fakeNode) unpublish(ctx context.Context, id, target string) error {
	_, err := f.node.NodeUnpublishVolume(ctx, &csi.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target})
	return err
}

func (f *fakeNode) unstage(id, staging string) error {
	return f.unstageCtx(context.Background(), id, staging)
}

func (f *fakeNode) unstageCtx(ctx context.Context, id, staging string) error {
	_, err := f.node.NodeUnstageVolume(ctx, &csi.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	return err
}

// TestNodeLifecycleWithFakeMounter: stage, publish, unpublish and unstage
// are idempotent, and a repeated call that asks for something else than
// what is there gets the spec's code.
func TestNodeLifecycleWithFakeMounter(t *testing.T) {
	fake := mount.NewFake()
	f := newFakeNode(t, fake)
	id, staging := f.volume(t, "pvc-1")
	target := filepath.Join(f.kubelet, "pods", "target")
	ctx := context.Background()

	wantCode(t, f.publish(id, staging, target, false), codes.FailedPrecondition) // not staged
	wantCode(t, f.stage("vol-0123456789abcdef0123456789abcdef", staging, swCap), codes.NotFound)
	wantCode(t, f.stage(id, staging, capWithFlags("sync")), codes.InvalidArgument)

	wantCode(t, f.stage(id, staging, swCap), codes.OK)
	wantCode(t, f.stage(id, staging, swCap), codes.OK) // idempotent
	wantCode(t, f.stage(id, staging, capWithFlags("noexec")), codes.AlreadyExists)
	calls := fake.Calls
	wantCode(t, f.stage(id, staging, swCap), codes.OK)
	if fake.Calls != calls {
		t.Fatalf("a repeated stage mounted again (%d calls, was %d)", fake.Calls, calls)
	}

	wantCode(t, f.publish(id, staging, target, false), codes.OK)
	wantCode(t, f.publish(id, staging, target, false), codes.OK) // idempotent
	wantCode(t, f.publish(id, staging, target, true), codes.AlreadyExists)
	if m, ok := fake.Mounts()[target]; !ok || m.ReadOnly {
		t.Fatalf("target mount = %+v, %v; want a read-write mount", m, ok)
	}
	if _, err := os.Stat(target); err != nil {
		t.Fatalf("publish did not create the target: %v", err)
	}

	// The storage side sees the fake mounts too: a mounted volume is not
	// deleted.
	_, err := f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.FailedPrecondition)

	// Stats find the volume where it is published, not elsewhere.
	_, err = f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	wantCode(t, err, codes.OK)
	_, err = f.node.NodeGetVolumeStats(ctx, &csi.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: f.kubelet})
	wantCode(t, err, codes.NotFound)

	wantCode(t, f.unpublish(ctx, id, target), codes.OK)
	wantCode(t, f.unpublish(ctx, id, target), codes.OK) // idempotent
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unpublish left the target: %v", err)
	}
	wantCode(t, f.unstage(id, staging), codes.OK)
	wantCode(t, f.unstage(id, staging), codes.OK) // idempotent
	if _, err := os.Stat(staging); err != nil {
		t.Fatalf("unstage removed the CO's staging directory: %v", err)
	}
	if n := len(fake.Mounts()); n != 0 {
		t.Fatalf("%d mounts left: %v", n, fake.Mounts())
	}
	_, err = f.ctrl.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id})
	wantCode(t, err, codes.OK)
	// Unknown volumes and paths that were never published: success.
	wantCode(t, f.unpublish(ctx, id, target), codes.OK)
	wantCode(t, f.unstage(id, staging), codes.OK)
}

// TestNodePathsWithFakeMounter: a symlink target is refused, and paths in
// the data root or outside the kubelet root never reach the mounter.
func TestNodePathsWithFakeMounter(t *testing.T) {
	fake := mount.NewFake()
	f := newFakeNode(t, fake)
	id, staging := f.volume(t, "pvc-1")
	wantCode(t, f.stage(id, staging, swCap), codes.OK)
	link := filepath.Join(f.kubelet, "pods", "link")
	if err := os.Symlink(t.TempDir(), link); err != nil {
		t.Fatal(err)
	}
	wantCode(t, f.publish(id, staging, link, false), codes.InvalidArgument)
	wantCode(t, f.publish(id, staging, filepath.Join(f.d.store.Root(), "volumes", "x"), false), codes.InvalidArgument)
	wantCode(t, f.publish(id, staging, filepath.Join(t.TempDir(), "elsewhere"), false), codes.InvalidArgument)
	if n := len(fake.Mounts()); n != 1 {
		t.Fatalf("mounts = %v, want only the staging mount", fake.Mounts())
	}
}

// blockingMounter is a Fake whose Bind waits until release is closed.
type blockingMounter struct {
	*mount.Fake
	entered chan struct{}
	release chan struct{}
}

func (b *blockingMounter) Bind(x mount.Bind) error {
	b.entered <- struct{}{}
	<-b.release
	return b.Fake.Bind(x)
}

// TestNodePerVolumeLock: while a call on a volume is in flight, another
// call on it answers ABORTED — from the CSI services and from a direct
// caller of the volume manager (the cluster node agent) alike — while
// NodeUnpublishVolume and NodeUnstageVolume wait (bounded by their
// context) and other volumes go on.
func TestNodePerVolumeLock(t *testing.T) {
	bm := &blockingMounter{Fake: mount.NewFake(), entered: make(chan struct{}, 4), release: make(chan struct{})}
	f := newFakeNode(t, bm)
	id, staging := f.volume(t, "pvc-1")
	other, otherStaging := f.volume(t, "pvc-2")
	ctx := context.Background()

	done := make(chan error, 1)
	go func() { done <- f.stage(id, staging, swCap) }()
	<-bm.entered

	wantCode(t, f.stage(id, staging, swCap), codes.Aborted)
	if err := f.d.store.Delete(id); !errors.Is(err, contract.ErrBusy) {
		t.Fatalf("Manager.Delete during a stage = %v, want contract.ErrBusy", err)
	}
	for what, call := range map[string]func(context.Context) error{
		"unpublish": func(c context.Context) error { return f.unpublish(c, id, filepath.Join(f.kubelet, "pods", "t")) },
		"unstage":   func(c context.Context) error { return f.unstageCtx(c, id, staging) },
	} {
		start := time.Now() // before the deadline is set, so it cannot look early
		tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		wantCode(t, call(tctx), codes.Aborted)
		cancel()
		if time.Since(start) < 50*time.Millisecond {
			t.Fatalf("%s did not wait for the call in flight", what)
		}
	}

	// Another volume does not wait.
	otherDone := make(chan error, 1)
	go func() { otherDone <- f.stage(other, otherStaging, swCap) }()
	<-bm.entered

	// An unpublish waiting for the lock goes on when the stage ends.
	unpub := make(chan error, 1)
	go func() { unpub <- f.unpublish(ctx, id, filepath.Join(f.kubelet, "pods", "t")) }()
	close(bm.release)
	for _, c := range []chan error{done, otherDone, unpub} {
		select {
		case err := <-c:
			wantCode(t, err, codes.OK)
		case <-time.After(10 * time.Second):
			t.Fatal("a call did not finish")
		}
	}
}
