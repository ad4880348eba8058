package cases

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/localdir-csi/localdir/tests/testdriver"
)

// The cases that need kill -9 (C08, C09a) run the real binary as a child
// process. It shares this test's mount namespace, so the mounts it makes
// outlive it exactly as they outlive a crashed node plugin.

var (
	binOnce sync.Once
	binPath string
	binErr  error
	binDir  string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// driverBinary builds ./cmd/localdir-csi once per test run.
func driverBinary(t testing.TB) string {
	t.Helper()
	binOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			binErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		mod := strings.TrimSpace(string(out))
		if mod == "" || mod == os.DevNull {
			binErr = fmt.Errorf("go env GOMOD: not in a module")
			return
		}
		binDir, binErr = os.MkdirTemp("", "localdir-cases-bin-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "localdir-csi")
		cmd := exec.Command("go", "build", "-o", binPath, "./cmd/localdir-csi")
		cmd.Dir = filepath.Dir(mod)
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

	conn *grpc.ClientConn
	// in exposes the clients and options in the shape the in-process helpers
	// take, so both kinds of driver are checked the same way.
	in *testdriver.Instance
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

// procArgs is the command line for a driver on dir (socket dir/csi.sock,
// data root dir/data).
func procArgs(dir string) []string {
	return []string{
		"--endpoint=unix://" + filepath.Join(dir, "csi.sock"),
		"--data-root=" + filepath.Join(dir, "data"),
		"--node-id=n1",
		"--capacity=1Gi",
	}
}

// startProc starts the driver binary on dir and waits until Probe answers
// ready. It fails the test when the process exits or is not ready in time:
// "the driver always starts".
func startProc(t testing.TB, dir string) *proc {
	t.Helper()
	bin := driverBinary(t)
	p := &proc{stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(bin, procArgs(dir)...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.kill(t) })

	ep := "unix://" + filepath.Join(dir, "csi.sock")
	// Short reconnect backoff: the first dial may hit the stale socket of a
	// killed predecessor, and the default 1 s backoff would then dominate
	// every restart of C09a.
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	p.conn = conn
	p.in = &testdriver.Instance{
		Dir: dir, Endpoint: ep, Conn: conn,
		Identity: csi.NewIdentityClient(conn), Controller: csi.NewControllerClient(conn), Node: csi.NewNodeClient(conn),
	}
	p.in.Opts.DataRoot = filepath.Join(dir, "data")
	p.in.Opts.Endpoint = ep

	// A stale socket of a killed predecessor may still be there: only a
	// successful Probe proves this process is serving.
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case <-p.done:
			t.Fatalf("driver exited during start-up (%v); output:\n%s", p.err, p.stderr)
		default:
		}
		c, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		resp, err := p.in.Identity.Probe(c, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready after 20s (last Probe: %v); output:\n%s", err, p.stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone; safe to
// repeat.
func (p *proc) kill(t testing.TB) {
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

// stop sends SIGTERM and requires a clean exit.
func (p *proc) stop(t testing.TB) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Errorf("driver did not stop within 20s of SIGTERM")
		p.kill(t)
	}
	if p.err != nil {
		t.Errorf("driver exited with %v; output:\n%s", p.err, p.stderr)
	}
	_ = p.conn.Close()
}
