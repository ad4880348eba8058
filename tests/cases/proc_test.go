package cases

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/localdir-csi/localdir/tests/testdriver"
)

// The cases that need kill -9 (C08, C09a) run the real binary as a child
// process. It shares this test's mount namespace, so the mounts it makes
// outlive it exactly as they outlive a crashed node plugin.

// bin builds ./cmd/localdir-csi once per test run; driverBinary(t) is its
// path.
var (
	bin          = testdriver.Binary{TempPattern: "localdir-cases-bin-"}
	driverBinary = bin.Path
)

func TestMain(m *testing.M) {
	code := m.Run()
	bin.Remove()
	os.Exit(code)
}

// caseProcArgs is the command line for a driver on dir (socket dir/csi.sock,
// data root dir/data).
func caseProcArgs(dir string) []string { return testdriver.ProcArgs(dir) }

// caseProc is one driver process and a client connection to it.
type caseProc struct {
	*testdriver.Proc
	// cmd and stderr are Proc.Cmd and Proc.Output under the names the
	// restart cases use.
	cmd    *exec.Cmd
	stderr *testdriver.SyncBuffer
	// in exposes the clients and options in the shape the in-process helpers
	// take, so both kinds of driver are checked the same way.
	in *testdriver.Instance
}

// startCaseProc starts the driver binary on dir and waits until Probe answers
// ready. It fails the test when the process exits or is not ready in time:
// "the driver always starts".
func startCaseProc(t testing.TB, dir string) *caseProc {
	t.Helper()
	tp := testdriver.Launch(t, driverBinary(t), caseProcArgs(dir))
	p := &caseProc{Proc: tp, cmd: tp.Cmd, stderr: tp.Output}
	ep := "unix://" + filepath.Join(dir, "csi.sock")
	p.WaitReady(t, ep, testdriver.ReadyWait{Total: 20 * time.Second, Probe: 500 * time.Millisecond, Poll: 10 * time.Millisecond})
	conn := p.Conn
	p.in = &testdriver.Instance{
		Dir: dir, Endpoint: ep, Conn: conn,
		Identity: csi.NewIdentityClient(conn), Controller: csi.NewControllerClient(conn), Node: csi.NewNodeClient(conn),
	}
	p.in.Opts.DataRoot = filepath.Join(dir, "data")
	p.in.Opts.Endpoint = ep
	return p
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone; safe to
// repeat.
func (p *caseProc) kill(t testing.TB) { p.Kill() }

// stop sends SIGTERM and requires a clean exit.
func (p *caseProc) stop(t testing.TB) {
	t.Helper()
	p.Stop(t, 20*time.Second)
}

// A start whose endpoint names a socket in a directory that does not exist
// fails at once, saying so, before it creates anything: the data root is
// not made.
func TestStartWithoutTheSocketDirectoryCreatesNothing(t *testing.T) {
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	cmd := exec.Command(driverBinary(t), "--endpoint=unix://"+filepath.Join(dir, "missing", "csi.sock"),
		"--data-root="+data, "--node-id=n1", "--capacity=1Gi")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the driver started without its socket's directory:\n%s", out)
	}
	if !strings.Contains(string(out), "create it first") {
		t.Errorf("the error does not say what to do:\n%s", out)
	}
	if _, err := os.Lstat(data); !os.IsNotExist(err) {
		t.Errorf("the data root %s was created: %v", data, err)
	}
}
