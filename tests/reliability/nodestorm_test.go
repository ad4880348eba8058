package reliability

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	lcluster "github.com/localdir-csi/localdir/pkg/cluster"
	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/state"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/csitest"
)

// The crash storm in cluster mode: a real control plane (etcd and
// kube-apiserver, tests/cluster/clustertest), the driver binary as a
// controller-mode and a node-mode process, each with a kubeconfig of the
// ServiceAccount deploy/kubernetes runs it as. The storm's clients send the
// same random mix as in all mode (crash_test.go), the controller calls to
// the controller's socket and the node calls to the node plugin's, while
// the node plugin is SIGKILLed at random moments (one in ten while still
// starting; the controller with it in one round out of five) and started
// again. Most rounds cut the calls in flight short on the client's side and
// look at the node's state file while it is down; the others restart the
// node under the controller calls still waiting for it, which must then
// complete.
//
// While the node plugin is down: every acknowledged volume and snapshot has
// its record in the node's state file, no smaller than acknowledged, and
// every record belongs to an acknowledged object, an acknowledged delete
// the node had not carried out yet or a create cut short by the kill.
// After every restart: the driver started; every call cut short is sent
// again and answers as it would have; once the node plugin has caught up,
//   - the LocalVolume and LocalSnapshot objects are exactly the acknowledged
//     ones, Ready, on the node, with the acknowledged sizes;
//   - the node's data root holds exactly their data with every marker, the
//     mount table and loop devices are what the node calls made, and the
//     controller's ListVolumes, ListSnapshots and GetCapacity agree (the
//     checks of all mode);
// and at the end, after everything was deleted through the driver and the
// node plugin stopped: no object, no data, no record in the state file,
// nothing mounted or attached.

const nodeStormNode = "n1"

type nodeStorm struct {
	*storm
	env                *clustertest.Env
	ctrlArgs, nodeArgs []string
	ctrlEP, nodeEP     string
	ctrl, node         *proc

	ctrlKills, rideThrough, recordChecks int
}

func TestCrashStormNodeMode(t *testing.T) {
	kills := setting("LOCALDIR_NODE_KILLS", 50, 500)
	env := clustertest.Start(t)
	ctrlID, nodeID := env.ControllerIdentity(t), env.NodeIdentity(t, nodeStormNode)
	dir := tempDir(t)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (LOCALDIR_NODE_KILLS=%d)", seed, kills)
	s := &nodeStorm{storm: newStorm(t, dir, filepath.Join(dir, "data"), 3, seed), env: env}
	s.cluster = true
	s.ctrlEP = "unix://" + filepath.Join(dir, "controller.sock")
	s.nodeEP = "unix://" + filepath.Join(dir, "node.sock")
	s.ctrlArgs = []string{"--mode=controller", "--endpoint=" + s.ctrlEP, "--kubeconfig=" + ctrlID.Kubeconfig}
	s.nodeArgs = []string{
		"--mode=node", "--endpoint=" + s.nodeEP, "--kubeconfig=" + nodeID.Kubeconfig,
		"--data-root=" + s.root, "--node-id=" + nodeStormNode, "--capacity=1Gi", "--engine=dir",
		"--kubelet-root=" + filepath.Join(dir, "co"),
	}

	s.node = waitReady(t, launchArgs(t, s.nodeArgs), s.nodeEP)
	env.WaitLocalNode(t, nodeStormNode)
	s.ctrl = waitReady(t, launchArgs(t, s.ctrlArgs), s.ctrlEP)
	for s.kills < kills {
		s.afterNodeRestart()
		if t.Failed() {
			t.FailNow()
		}
		s.round()
		if t.Failed() {
			t.FailNow()
		}
	}
	s.afterNodeRestart()
	s.cleanup(s.clients(), s.waitCaughtUp)
	s.node.stop(t)
	s.ctrl.stop(t)
	s.node.checkRaces(t)
	s.ctrl.checkRaces(t)
	s.assertDataGone()
	vols, snaps := s.records()
	if len(vols)+len(snaps) != 0 {
		t.Errorf("the node's state file still holds %d volumes and %d snapshots after everything was deleted", len(vols), len(snaps))
	}
	assertClean(t, dir)
	t.Logf("survived %d node kills (%d during start-up, %d with the controller; %d rounds restarted under calls in flight, %d state files checked while down); %d entries in orphaned/; %s",
		s.kills, s.startupKills, s.ctrlKills, s.rideThrough, s.recordChecks, len(csitest.DirNames(t, filepath.Join(s.root, "orphaned"))), s.summary())
}

func (s *nodeStorm) clients() csiClients {
	return csiClients{controller: s.ctrl.controller, node: s.node.node}
}

// round runs the clients, kills the node plugin (sometimes the controller
// too) at a random moment and starts it again.
func (s *nodeStorm) round() {
	t := s.t
	cx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wait := s.startWorkers(cx, s.clients())
	d := time.Duration(50+s.r.IntN(500)) * time.Millisecond
	if s.r.IntN(8) == 0 {
		d = time.Duration(500+s.r.IntN(1500)) * time.Millisecond
	}
	time.Sleep(d)
	s.killing.Store(true)
	withCtrl := s.r.IntN(5) == 0
	s.node.kill()
	s.node.assertKilled(t, "the node plugin")
	if withCtrl {
		time.Sleep(time.Duration(s.r.IntN(30)) * time.Millisecond)
		s.ctrl.kill()
		s.ctrl.assertKilled(t, "the controller")
		s.ctrlKills++
	}
	s.kills++
	if s.r.IntN(3) == 0 {
		// Restart under the calls in flight: a controller call waiting for
		// the node plugin completes once it is back.
		s.rideThrough++
		s.restart(withCtrl)
		done := make(chan struct{})
		go func() { wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(100 * time.Second):
			cancel()
			<-done
			t.Errorf("calls in flight when the node plugin was killed did not complete within 100s of its restart")
		}
		return
	}
	cancel()
	wait()
	s.checkRecords()
	s.restart(withCtrl)
}

// restart starts the node plugin (after a kill during start-up, now and
// then) and the controller when it was killed too.
func (s *nodeStorm) restart(withCtrl bool) {
	t := s.t
	s.node.checkRaces(t)
	if withCtrl {
		s.ctrl.checkRaces(t)
		s.ctrl = waitReady(t, launchArgs(t, s.ctrlArgs), s.ctrlEP)
	}
	if s.r.IntN(10) == 0 {
		// Killed while starting: opening the state, rolling back
		// interrupted work, connecting to the API server.
		s.killWhileStarting(launchArgs(t, s.nodeArgs), 300*time.Millisecond, "the node plugin")
	}
	s.node = waitReady(t, launchArgs(t, s.nodeArgs), s.nodeEP)
}

// afterNodeRestart sends the calls cut short again, waits for the node
// plugin to catch up and checks every invariant.
func (s *nodeStorm) afterNodeRestart() {
	p := s.clients()
	s.retryPending(p)
	s.waitCaughtUp()
	s.verifyObjects()
	s.verify(p)
}

// records reads the node's state file (the node plugin must be down).
func (s *nodeStorm) records() (vols map[string]*contract.Volume, snaps map[string]*contract.Snapshot) {
	t := s.t
	vols, snaps = map[string]*contract.Volume{}, map[string]*contract.Snapshot{}
	path := filepath.Join(s.root, state.FileName)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return vols, snaps // killed before it was ever created
	}
	st, err := state.Open(path)
	if err != nil {
		t.Fatalf("the node's state file: %v", err)
	}
	defer st.Close()
	err = st.View(func(tx *state.Tx) error {
		if err := tx.ForEachVolume("", func(v *contract.Volume) bool { vols[v.ID] = v; return true }); err != nil {
			return err
		}
		return tx.ForEachSnapshot("", func(sn *contract.Snapshot) bool { snaps[sn.ID] = sn; return true })
	})
	if err != nil {
		t.Fatalf("read the node's state file: %v", err)
	}
	return vols, snaps
}

// checkRecords compares the state file of the killed node plugin with the
// model while no call is in flight.
func (s *nodeStorm) checkRecords() {
	t := s.t
	s.recordChecks++
	vols, snaps := s.records()
	// What a record may belong to besides an acknowledged object: an
	// acknowledged delete the node had not carried out, a create cut short.
	maybe := map[string]bool{}
	// What may lack its record although acknowledged: the object of a
	// delete cut short, which the node carried out before the kill.
	mayLack := map[string]bool{}
	for _, w := range s.workers {
		for _, id := range w.gone {
			maybe[id] = true
		}
		if op := w.pending; op != nil && op.newVol != "" {
			maybe[lcluster.VolumeIDFor(op.newVol)] = true
		}
		if op := w.pending; op != nil && op.newSnap != "" {
			maybe[lcluster.SnapshotIDFor(op.newSnap)] = true
		}
		if op := w.pending; op != nil && op.deletes != "" {
			mayLack[op.deletes] = true
		}
	}
	// name of every record, by id.
	recorded := map[string]string{}
	for id, r := range vols {
		recorded[id] = r.Name
	}
	for id, r := range snaps {
		recorded[id] = r.Name
	}
	for _, v := range s.allVols() {
		delete(recorded, v.id)
		r, ok := vols[v.id]
		if !ok && mayLack[v.id] {
			continue
		}
		if !ok || r.CapacityBytes < v.size || r.Name != v.name {
			t.Errorf("acknowledged volume %s (%s, %d bytes): the node's state file holds %+v", v.id, v.name, v.size, r)
		}
	}
	for _, sn := range s.allSnaps() {
		delete(recorded, sn.id)
		r, ok := snaps[sn.id]
		if !ok && mayLack[sn.id] {
			continue
		}
		if !ok || r.SizeBytes != sn.size || r.SourceVolumeID != sn.src || r.Name != sn.name {
			t.Errorf("acknowledged snapshot %s (%s, %d bytes of %s): the node's state file holds %+v", sn.id, sn.name, sn.size, sn.src, r)
		}
	}
	for id, name := range recorded {
		if !maybe[id] {
			t.Errorf("the node's state file holds %s (%s), which no acknowledged or interrupted create made", id, name)
		}
	}
}

// objects lists the LocalVolumes and LocalSnapshots (admin client).
func (s *nodeStorm) objects() (map[string]*v1.LocalVolume, map[string]*v1.LocalSnapshot) {
	t := s.t
	lvs, lss := &v1.LocalVolumeList{}, &v1.LocalSnapshotList{}
	if err := s.env.Client.List(context.Background(), lvs); err != nil {
		t.Fatalf("list LocalVolumes: %v", err)
	}
	if err := s.env.Client.List(context.Background(), lss); err != nil {
		t.Fatalf("list LocalSnapshots: %v", err)
	}
	vols, snaps := map[string]*v1.LocalVolume{}, map[string]*v1.LocalSnapshot{}
	for i := range lvs.Items {
		vols[lvs.Items[i].Name] = &lvs.Items[i]
	}
	for i := range lss.Items {
		snaps[lss.Items[i].Name] = &lss.Items[i]
	}
	return vols, snaps
}

// objectProblems lists how the objects differ from the model.
func (s *nodeStorm) objectProblems() []string {
	var out []string
	lvs, lss := s.objects()
	want := map[string]bool{}
	for _, v := range s.allVols() {
		want[v.id] = true
		lv, ok := lvs[v.id]
		mode := v1.VolumeModeFilesystem
		if v.block {
			mode = v1.VolumeModeBlock
		}
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("acknowledged volume %s (%s) has no LocalVolume", v.id, v.name))
		case lv.Deleting():
			out = append(out, fmt.Sprintf("LocalVolume %s (%s) is being deleted", v.id, v.name))
		case lv.Status.Phase != v1.PhaseReady || lv.Status.ErrorCode != "":
			out = append(out, fmt.Sprintf("LocalVolume %s (%s) is %q (error %q)", v.id, v.name, lv.Status.Phase, lv.Status.ErrorCode))
		case lv.Spec.Size.Value() != v.size || lv.Status.CapacityBytes.Value() != v.size:
			out = append(out, fmt.Sprintf("LocalVolume %s (%s): spec.size %d, status.capacityBytes %d, acknowledged %d", v.id, v.name, lv.Spec.Size.Value(), lv.Status.CapacityBytes.Value(), v.size))
		case lv.Spec.Node != nodeStormNode || lv.Spec.CSIName != v.name || lv.Spec.VolumeMode != mode:
			out = append(out, fmt.Sprintf("LocalVolume %s: node %q, name %q, mode %q; want %q, %q, %q", v.id, lv.Spec.Node, lv.Spec.CSIName, lv.Spec.VolumeMode, nodeStormNode, v.name, mode))
		}
	}
	for id, lv := range lvs {
		if !want[id] {
			out = append(out, fmt.Sprintf("LocalVolume %s (%s, phase %q, deleting %v) is not an acknowledged volume", id, lv.Spec.CSIName, lv.Status.Phase, lv.Deleting()))
		}
	}
	want = map[string]bool{}
	for _, sn := range s.allSnaps() {
		want[sn.id] = true
		ls, ok := lss[sn.id]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("acknowledged snapshot %s (%s) has no LocalSnapshot", sn.id, sn.name))
		case ls.Deleting():
			out = append(out, fmt.Sprintf("LocalSnapshot %s (%s) is being deleted", sn.id, sn.name))
		case !ls.Status.ReadyToUse || ls.Status.Phase != v1.PhaseReady:
			out = append(out, fmt.Sprintf("LocalSnapshot %s (%s) is %q, readyToUse %v", sn.id, sn.name, ls.Status.Phase, ls.Status.ReadyToUse))
		case ls.Status.SizeBytes.Value() != sn.size || ls.Spec.SourceVolume != sn.src || ls.Spec.Node != nodeStormNode:
			out = append(out, fmt.Sprintf("LocalSnapshot %s: %d bytes of %s on %q; acknowledged %d bytes of %s", sn.id, ls.Status.SizeBytes.Value(), ls.Spec.SourceVolume, ls.Spec.Node, sn.size, sn.src))
		}
	}
	for id, ls := range lss {
		if !want[id] {
			out = append(out, fmt.Sprintf("LocalSnapshot %s (%s, deleting %v) is not an acknowledged snapshot", id, ls.Spec.CSIName, ls.Deleting()))
		}
	}
	return out
}

// dataNames lists the data the node holds for the model and what it holds.
func (s *nodeStorm) dataNames() (want, got []string) {
	for _, v := range s.allVols() {
		if v.block {
			want = append(want, "block/"+v.id+".img")
		} else {
			want = append(want, "volumes/"+v.id)
		}
	}
	for _, sn := range s.allSnaps() {
		if sn.block {
			want = append(want, "snapshots/"+sn.id+".img")
		} else {
			want = append(want, "snapshots/"+sn.id)
		}
	}
	for _, d := range []string{"volumes", "block", "snapshots"} {
		for _, n := range csitest.DirNames(s.t, filepath.Join(s.root, d)) {
			got = append(got, d+"/"+n)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	return want, got
}

// waitCaughtUp waits until the node plugin has carried out every
// acknowledged call: the objects and the data are the model's. It fails
// the test with the differences after a minute.
func (s *nodeStorm) waitCaughtUp() {
	deadline := time.Now().Add(60 * time.Second)
	for {
		probs := s.objectProblems()
		want, got := s.dataNames()
		if len(probs) == 0 && slices.Equal(want, got) {
			return
		}
		if time.Now().After(deadline) {
			s.t.Errorf("the node plugin did not catch up within 60s of its restart:\n\t%s\n\tdata %v, want %v", strings.Join(probs, "\n\t"), got, want)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// verifyObjects checks the objects against the model (after waitCaughtUp).
func (s *nodeStorm) verifyObjects() {
	for _, p := range s.objectProblems() {
		s.t.Error(p)
	}
}
