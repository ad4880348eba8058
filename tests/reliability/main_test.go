package reliability

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/tests/testdriver"
)

// stress selects the long settings: LOCALDIR_STRESS=1 (make stress).
var stress = os.Getenv("LOCALDIR_STRESS") != ""

// setting returns ci, or long under LOCALDIR_STRESS=1. An environment
// variable named env overrides both (e.g. LOCALDIR_KILLS=2000).
func setting(env string, ci, long int) int {
	if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v > 0 {
		return v
	}
	if stress {
		return long
	}
	return ci
}

// bin builds ./cmd/localdir-csi once per test run, with -race when this
// test binary has it, so races in the driver under the crash storm's load
// are reported too; driverBinary(t) is its path.
var (
	bin          = testdriver.Binary{TempPattern: "localdir-reliability-bin-", Race: raceEnabled}
	driverBinary = bin.Path
)

func TestMain(m *testing.M) {
	// The in-process drivers log every refused call; thousands of them here
	// are the point of the tests, not news. LOCALDIR_TEST_LOGS=1 keeps them.
	if os.Getenv("LOCALDIR_TEST_LOGS") == "" {
		fs := flag.NewFlagSet("klog", flag.ContinueOnError)
		klog.InitFlags(fs)
		_ = fs.Set("logtostderr", "false")
		_ = fs.Set("alsologtostderr", "false")
		_ = fs.Set("stderrthreshold", "FATAL")
		klog.SetOutput(io.Discard)
	}
	code := m.Run()
	bin.Remove()
	os.Exit(code)
}

// proc is one driver process and a client connection to it.
type proc struct {
	*testdriver.Proc
	identity   csi.IdentityClient
	controller csi.ControllerClient
	node       csi.NodeClient
}

// procArgs is the command line for an all-mode driver on dir: socket
// dir/csi.sock, data root dir/data.
func procArgs(dir string, extra ...string) []string {
	return testdriver.ProcArgs(dir, append([]string{"--engine=dir"}, extra...)...)
}

// launch starts the driver binary (all mode) without waiting for it.
func launch(t testing.TB, dir string, extra ...string) *proc {
	t.Helper()
	return launchArgs(t, procArgs(dir, extra...))
}

// launchArgs starts the driver binary with exactly these arguments,
// without waiting for it.
func launchArgs(t testing.TB, args []string) *proc {
	t.Helper()
	return &proc{Proc: testdriver.Launch(t, driverBinary(t), args)}
}

// startProc starts the driver binary on dir and waits until Probe answers
// ready; the test fails when the process exits or is not ready in time ("the
// driver starts every time").
func startProc(t testing.TB, dir string, extra ...string) *proc {
	t.Helper()
	return waitReady(t, launch(t, dir, extra...), "unix://"+filepath.Join(dir, "csi.sock"))
}

// waitReady connects to the launched process p on endpoint ep and waits
// until Probe answers ready, like startProc.
func waitReady(t testing.TB, p *proc, ep string) *proc {
	t.Helper()
	p.WaitReady(t, ep, testdriver.ReadyWait{Total: 60 * time.Second, Probe: time.Second, Poll: 5 * time.Millisecond})
	p.identity, p.controller, p.node = csi.NewIdentityClient(p.Conn), csi.NewControllerClient(p.Conn), csi.NewNodeClient(p.Conn)
	return p
}

// kill sends SIGKILL and waits for the process to be gone; safe to repeat.
func (p *proc) kill() { p.Kill() }

// killed reports whether the process ended by SIGKILL (not by itself).
func (p *proc) killed() bool {
	st := p.Cmd.ProcessState
	if st == nil {
		return false
	}
	ws, ok := st.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// assertKilled fails the test when p ended by itself before its SIGKILL.
func (p *proc) assertKilled(t testing.TB, what string) {
	t.Helper()
	if !p.killed() {
		t.Errorf("%s ended before the kill: %v; output:\n%s", what, p.Err, p.Output)
	}
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	p.Stop(t, 30*time.Second)
}

// checkRaces fails the test when the (race-enabled) driver reported a race.
func (p *proc) checkRaces(t testing.TB) {
	t.Helper()
	if out := p.Output.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Fatalf("the driver reported a data race:\n%s", out)
	}
}
