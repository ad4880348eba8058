package reliability

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/klog/v2"
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

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
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
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// repoRoot is the module root (go env GOMOD).
func repoRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not in a module")
	}
	return filepath.Dir(mod), nil
}

// driverBinary builds ./cmd/localdir-csi once per test run, with -race when
// this test binary has it, so races in the driver under the crash storm's
// load are reported too.
func driverBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		root, err := repoRoot()
		if err != nil {
			binErr = err
			return
		}
		binDir, binErr = os.MkdirTemp("", "localdir-reliability-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "localdir-csi")
		args := []string{"build", "-o", binPath}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "./cmd/localdir-csi")...)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build ./cmd/localdir-csi: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// proc is one driver process and a client connection to it.
type proc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error // exit status, valid after done

	conn       *grpc.ClientConn
	identity   csi.IdentityClient
	controller csi.ControllerClient
	node       csi.NodeClient
}

// syncBuffer is a bytes.Buffer safe for the exec copier and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// procArgs is the command line for an all-mode driver on dir: socket
// dir/csi.sock, data root dir/data.
func procArgs(dir string, extra ...string) []string {
	return append([]string{
		"--endpoint=unix://" + filepath.Join(dir, "csi.sock"),
		"--data-root=" + filepath.Join(dir, "data"),
		"--node-id=n1",
		"--capacity=1Gi",
		"--engine=dir",
	}, extra...)
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
	p := &proc{stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(driverBinary(t), args...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill() })
	return p
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
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	p.conn = conn
	p.identity, p.controller, p.node = csi.NewIdentityClient(conn), csi.NewControllerClient(conn), csi.NewNodeClient(conn)
	// A stale socket of a killed predecessor may still be there: only a
	// successful Probe proves this process is serving.
	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("driver exited during start-up (%v); output:\n%s", p.err, p.stderr)
		default:
		}
		c, cancel := context.WithTimeout(context.Background(), time.Second)
		resp, err := p.identity.Probe(c, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready after 60s (last Probe: %v); output:\n%s", err, p.stderr)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kill sends SIGKILL and waits for the process to be gone; safe to repeat.
func (p *proc) kill() {
	select {
	case <-p.done:
	default:
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.done
	}
	if p.conn != nil {
		_ = p.conn.Close()
	}
}

// killed reports whether the process ended by SIGKILL (not by itself).
func (p *proc) killed() bool {
	st := p.cmd.ProcessState
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
		t.Errorf("%s ended before the kill: %v; output:\n%s", what, p.err, p.stderr)
	}
}

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Errorf("driver did not stop within 30s of SIGTERM")
		p.kill()
	}
	if p.err != nil {
		t.Errorf("driver exited with %v; output:\n%s", p.err, p.stderr)
	}
	_ = p.conn.Close()
}

// checkRaces fails the test when the (race-enabled) driver reported a race.
func (p *proc) checkRaces(t testing.TB) {
	t.Helper()
	if out := p.stderr.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Fatalf("the driver reported a data race:\n%s", out)
	}
}
