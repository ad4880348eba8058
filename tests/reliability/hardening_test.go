package reliability

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/csitest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// TestSocketPermissions: the CSI socket is a socket of mode 0660 or
// tighter, from the first moment it exists, even when the driver runs
// under umask 0 (bind(2) would make it 0777): a watcher polls the path
// while the binary starts and records every mode it sees. It replaces a
// stale socket of a killed predecessor, and refuses to replace anything
// else: a live driver's socket (a second driver on the same endpoint does
// not start) or a file.
//
// A watcher that never looks at the right moment would pass whatever the
// driver did, so the test also proves the window is observable: it must
// see the new socket appear while the binary starts, and, with
// driver.Listen called in this process under umask 0 until it happens,
// catch the socket in its private bind directory between bind(2) and the
// chmod (mode 0777, the mode the endpoint itself would show for that
// moment if the socket were bound in place) at least a few times.
func TestSocketPermissions(t *testing.T) {
	dir := tempDir(t)
	sock := filepath.Join(dir, "csi.sock")
	driverBinary(t) // built before the umask changes
	for round := range 3 {
		p := startWatched(t, dir, sock, round)
		if p == nil {
			t.Fatalf("round %d: in %d starts the watcher never saw the socket the starting driver made: it did not watch when the socket appeared", round, watchedStarts)
		}
		var st unix.Stat_t
		if err := unix.Lstat(sock, &st); err != nil {
			t.Fatal(err)
		}
		if st.Mode&unix.S_IFMT != unix.S_IFSOCK || st.Mode&0o777&^0o660 != 0 {
			t.Errorf("round %d: %s has mode %o, want a socket of 0660 or tighter", round, sock, st.Mode)
		}
		if leftovers, _ := filepath.Glob(filepath.Join(dir, ".sock*")); len(leftovers) != 0 {
			t.Errorf("round %d: bind directories left: %v", round, leftovers)
		}
		// Killed: the next round starts over its stale socket.
		p.kill()
	}
	assertBindWindowSeen(t, tempDir(t))
	// A socket a live driver serves on is not taken over: a second driver
	// on the same endpoint (another data root) refuses to start, and the
	// first keeps its socket and answers.
	p := startProc(t, dir)
	var before unix.Stat_t
	if err := unix.Lstat(sock, &before); err != nil {
		t.Fatal(err)
	}
	// Bounded: a driver that takes the socket over keeps running.
	second, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	out, err := exec.CommandContext(second, driverBinary(t), procArgs(dir, "--data-root="+filepath.Join(tempDir(t), "other"))...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || !strings.Contains(string(out), "in use") {
		t.Errorf("a second driver on a live endpoint: err %v, want a refusal naming the socket in use:\n%s", err, out)
	}
	var after unix.Stat_t
	if err := unix.Lstat(sock, &after); err != nil || after.Ino != before.Ino {
		t.Errorf("the live driver's socket was replaced or removed (inode %d → %d, %v)", before.Ino, after.Ino, err)
	}
	if _, err := p.identity.Probe(csitest.Ctx(t), &csi.ProbeRequest{}); err != nil {
		t.Errorf("the first driver stopped answering after a second one tried its endpoint: %v", err)
	}
	p.kill()
	// Anything but a socket at the endpoint is refused, never removed.
	if err := os.Remove(sock); err != nil {
		t.Fatal(err)
	}
	writeSyncedWithDir(t, sock, []byte("not a socket"))
	out, err = exec.Command(driverBinary(t), procArgs(dir)...).CombinedOutput()
	if !errors.As(err, &ee) {
		t.Errorf("the driver started with a regular file at its endpoint: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "not a socket") {
		t.Errorf("no clear message for a file at the endpoint:\n%s", out)
	}
	csitest.AssertFileBytes(t, sock, []byte("not a socket"))
}

// watchedStarts bounds the starts of one startWatched round.
const watchedStarts = 5

// startWatched starts the driver binary on dir under umask 0 while a
// watcher records every mode the endpoint sock shows, and fails the test
// when a mode wider than 0660 was seen. A start whose watcher never saw the
// socket that driver made (a new inode, not the stale one) proved nothing:
// the watcher did not look while the socket appeared (on a busy machine
// its thread may not run for that moment). That driver is killed and the
// round starts over its stale socket, at most watchedStarts times; nil
// means no start was watched.
func startWatched(t *testing.T, dir, sock string, round int) *proc {
	t.Helper()
	for attempt := range watchedStarts {
		p, fresh := startWatchedOnce(t, dir, sock, round)
		if fresh {
			return p
		}
		t.Logf("round %d, start %d: the watcher did not see the new socket appear; starting again", round, attempt)
		p.kill()
	}
	return nil
}

func startWatchedOnce(t *testing.T, dir, sock string, round int) (*proc, bool) {
	t.Helper()
	var stale unix.Stat_t
	if unix.Lstat(sock, &stale) != nil {
		stale.Ino = 0
	}
	var seen sync.Map // mode → true
	var fresh atomic.Bool
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			var st unix.Stat_t
			if unix.Lstat(sock, &st) == nil {
				seen.Store(st.Mode, true)
				if st.Ino != stale.Ino {
					fresh.Store(true)
				}
			}
		}
	}()
	old := syscall.Umask(0)
	p := startProc(t, dir)
	syscall.Umask(old)
	stop.Store(true)
	wg.Wait()
	n := 0
	seen.Range(func(k, _ any) bool {
		mode := k.(uint32)
		n++
		if mode&unix.S_IFMT == unix.S_IFSOCK && mode&0o777&^0o660 != 0 {
			t.Errorf("round %d: the socket was visible with mode %o (more than 0660)", round, mode&0o7777)
		}
		return true
	})
	t.Logf("round %d: %d distinct modes seen while starting", round, n)
	return p, fresh.Load()
}

// assertBindWindowSeen calls driver.Listen in this process under umask 0,
// over and over, while a watcher polls dir: the endpoint must never show a
// mode wider than 0660, and the watcher must catch the socket in Listen's
// private bind directory before its chmod (mode 0777) in at least
// minCaught calls within the budget; otherwise the watching in this test
// could not have seen a socket exposed for the same short moment at the
// endpoint. (The binary rounds' watcher polls one path, faster than this
// one, which lists dir first.)
func assertBindWindowSeen(t *testing.T, dir string) {
	t.Helper()
	const (
		minCaught = 3
		maxCalls  = 200000
		budget    = 30 * time.Second
	)
	sock := filepath.Join(dir, "w.sock")
	var wide, polls atomic.Int64
	var caught atomic.Int64 // Listen calls (private directories) caught
	caughtIn := map[string]bool{}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			polls.Add(1)
			var st unix.Stat_t
			if unix.Lstat(sock, &st) == nil && st.Mode&0o777&^0o660 != 0 {
				wide.Add(1)
			}
			ents, _ := os.ReadDir(dir)
			for _, e := range ents {
				if !strings.HasPrefix(e.Name(), ".sock") {
					continue
				}
				if unix.Lstat(filepath.Join(dir, e.Name(), "s"), &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFSOCK && st.Mode&0o777 == 0o777 && !caughtIn[e.Name()] {
					caughtIn[e.Name()] = true
					caught.Add(1)
				}
			}
		}
	}()
	old := syscall.Umask(0)
	start, calls := time.Now(), 0
	for ; calls < maxCalls && caught.Load() < minCaught && time.Since(start) < budget; calls++ {
		lis, err := driver.Listen(sock)
		if err != nil {
			syscall.Umask(old)
			t.Fatalf("Listen: %v", err)
		}
		lis.Close()
		if err := os.Remove(sock); err != nil {
			syscall.Umask(old)
			t.Fatal(err)
		}
	}
	syscall.Umask(old)
	stop.Store(true)
	wg.Wait()
	t.Logf("driver.Listen under umask 0: %d calls in %v, %d polls; socket caught before its chmod in %d calls", calls, time.Since(start).Round(time.Millisecond), polls.Load(), caught.Load())
	if wide.Load() != 0 {
		t.Errorf("the endpoint showed a mode wider than 0660 %d times", wide.Load())
	}
	if caught.Load() < minCaught {
		t.Fatalf("the watcher caught the socket between bind and chmod in %d of %d calls, want at least %d: the window this test watches for was never observed", caught.Load(), calls, minCaught)
	}
}

// TestKubeletRootFlag: --kubelet-root is /var/lib/kubelet in node mode
// when not given, off in all mode, can be turned off with an empty value,
// and must be absolute.
func TestKubeletRootFlag(t *testing.T) {
	bin := driverBinary(t)
	out, _ := exec.Command(bin, "--help").CombinedOutput()
	if !strings.Contains(string(out), "-kubelet-root") || !strings.Contains(string(out), driver.DefaultKubeletRoot) {
		t.Errorf("--help does not document --kubelet-root:\n%s", out)
	}
	dir := tempDir(t)
	out, err := exec.Command(bin, procArgs(dir, "--kubelet-root=var/lib/kubelet")...).CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "--kubelet-root") {
		t.Errorf("a relative --kubelet-root: %v (want exit status 2 naming the flag)\n%s", err, out)
	}
}

// TestKubeletRoot: with --kubelet-root set (here a stand-in reached through
// a symlink, as a symlinked /var/lib/kubelet is), the node service works on
// paths below it, reached through the symlink or not, and refuses every
// staging and target path that is not below it once symlinks are resolved
// (a symlink inside the kubelet root pointing out included) with
// INVALID_ARGUMENT naming the path and the root, before any lookup, and
// without creating, mounting, unmounting or removing anything outside.
func TestKubeletRoot(t *testing.T) {
	dir := csitest.RealPath(tempDir(t))
	real := csitest.Mkdir(t, filepath.Join(dir, "var-lib-kubelet"))
	kubelet := filepath.Join(dir, "kubelet")
	if err := os.Symlink(real, kubelet); err != nil {
		t.Fatal(err)
	}
	outside := csitest.Mkdir(t, filepath.Join(dir, "outside"))
	writeSyncedWithDir(t, filepath.Join(outside, "keep"), []byte("keep"))
	csitest.Mkdir(t, filepath.Join(outside, "empty"))
	in := testdriver.StartWith(t, func() driver.Options {
		o := testdriver.DefaultOptions(dir)
		o.Engine = "dir"
		o.KubeletRoot = kubelet
		return o
	}())
	n := in.Node
	r, err := in.Controller.CreateVolume(csitest.Ctx(t), &csi.CreateVolumeRequest{Name: "k", CapacityRange: csitest.Range(csitest.Mi, 0), VolumeCapabilities: []*csi.VolumeCapability{csitest.MntCap()}})
	csitest.MustCode(t, err, codes.OK, "CreateVolume")
	x := r.GetVolume().GetVolumeId()

	// Inside, through the symlink and through the real path.
	staging := csitest.Mkdir(t, filepath.Join(kubelet, "plugins", "kubernetes.io", "csi", "pv", "x", "globalmount"))
	pod := csitest.Mkdir(t, filepath.Join(kubelet, "pods", "p1", "volumes"))
	target := filepath.Join(pod, "mount")
	_, err = n.NodeStageVolume(csitest.Ctx(t), &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: staging, VolumeCapability: csitest.MntCap()})
	csitest.MustCode(t, err, codes.OK, "NodeStageVolume below the kubelet root (through its symlink)")
	_, err = n.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{VolumeId: x, StagingTargetPath: staging, TargetPath: target, VolumeCapability: csitest.MntCap()})
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume below the kubelet root")
	realTarget := filepath.Join(real, "pods", "p1", "volumes", "mount2")
	_, err = n.NodePublishVolume(csitest.Ctx(t), &csi.NodePublishVolumeRequest{VolumeId: x, StagingTargetPath: staging, TargetPath: realTarget, VolumeCapability: csitest.MntCap()})
	csitest.MustCode(t, err, codes.OK, "NodePublishVolume below the kubelet root's real path")
	writeSyncedWithDir(t, filepath.Join(target, "f"), []byte("inside"))

	// A symlink inside the kubelet root that leads out.
	if err := os.Symlink(outside, filepath.Join(kubelet, "pods", "escape")); err != nil {
		t.Fatal(err)
	}
	w := &watcher{t: t, roots: []string{outside, filepath.Join(dir, "kubelet-evil")}}
	csitest.Mkdir(t, filepath.Join(dir, "kubelet-evil"))
	before := w.snap()

	refused := []struct{ name, p string }{
		{"outside", filepath.Join(outside, "t")},
		{"an existing directory outside", filepath.Join(outside, "empty")},
		{"a file outside", filepath.Join(outside, "keep")},
		{"through a symlink inside that leads out", filepath.Join(kubelet, "pods", "escape", "t")},
		{"through a symlink inside that leads out (existing)", filepath.Join(kubelet, "pods", "escape", "empty")},
		{"the kubelet root itself", kubelet},
		{"the kubelet root's real path", real},
		{"a sibling sharing its prefix", filepath.Join(dir, "kubelet-evil", "t")},
		{"above the kubelet root", dir},
	}
	unknown := "vol-0123456789abcdef0123456789abcdef"
	check := func(what string, err error, p string) {
		t.Helper()
		if !csitest.CodeIs(t, err, codes.InvalidArgument, what) {
			return
		}
		msg := status.Convert(err).Message()
		if !strings.Contains(msg, p) || !strings.Contains(msg, kubelet) {
			t.Errorf("%s: the message does not name the path and the kubelet root: %s", what, msg)
		}
	}
	for _, c := range refused {
		cx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := n.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: x, StagingTargetPath: c.p, VolumeCapability: csitest.MntCap()})
		check("NodeStageVolume "+c.name, err, c.p)
		_, err = n.NodeStageVolume(cx, &csi.NodeStageVolumeRequest{VolumeId: unknown, StagingTargetPath: c.p, VolumeCapability: csitest.MntCap()})
		check("NodeStageVolume of an unknown volume "+c.name+" (the path is checked before the lookup)", err, c.p)
		_, err = n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: x, StagingTargetPath: staging, TargetPath: c.p, VolumeCapability: csitest.MntCap()})
		check("NodePublishVolume "+c.name, err, c.p)
		_, err = n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: x, StagingTargetPath: c.p, TargetPath: filepath.Join(pod, "m3"), VolumeCapability: csitest.MntCap()})
		check("NodePublishVolume with staging "+c.name, err, c.p)
		_, err = n.NodePublishVolume(cx, &csi.NodePublishVolumeRequest{VolumeId: "csi-inline", TargetPath: c.p, VolumeCapability: csitest.MntCap(),
			VolumeContext: map[string]string{"csi.storage.k8s.io/ephemeral": "true"}})
		check("ephemeral NodePublishVolume "+c.name, err, c.p)
		_, err = n.NodeUnpublishVolume(cx, &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: c.p})
		check("NodeUnpublishVolume "+c.name, err, c.p)
		_, err = n.NodeUnstageVolume(cx, &csi.NodeUnstageVolumeRequest{VolumeId: x, StagingTargetPath: c.p})
		check("NodeUnstageVolume "+c.name, err, c.p)
		cancel()
	}
	for _, d := range before.diff(w.snap()) {
		t.Errorf("outside the kubelet root: %s", d)
	}
	if got := csitest.DirNames(t, filepath.Join(in.Opts.DataRoot, "volumes")); len(got) != 1 {
		t.Errorf("volumes: %v, want only %s (no ephemeral volume made)", got, x)
	}
	csitest.AssertFileBytes(t, filepath.Join(realTarget, "f"), []byte("inside"))

	for _, tg := range []string{target, realTarget} {
		_, err = n.NodeUnpublishVolume(csitest.Ctx(t), &csi.NodeUnpublishVolumeRequest{VolumeId: x, TargetPath: tg})
		csitest.MustCode(t, err, codes.OK, "NodeUnpublishVolume "+tg)
		csitest.AssertGone(t, tg)
	}
	_, err = n.NodeUnstageVolume(csitest.Ctx(t), &csi.NodeUnstageVolumeRequest{VolumeId: x, StagingTargetPath: staging})
	csitest.MustCode(t, err, codes.OK, "NodeUnstageVolume")
	_, err = in.Controller.DeleteVolume(csitest.Ctx(t), &csi.DeleteVolumeRequest{VolumeId: x})
	csitest.MustCode(t, err, codes.OK, "DeleteVolume")
	if fi, err := os.Lstat(kubelet); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the symlinked kubelet root was changed: %v, %v", fi, err)
	}
}
