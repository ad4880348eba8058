package testdriver

// Helpers for tests that run the real driver binary as a child process, for
// the cases that need kill -9. The child shares the test's mount namespace,
// so the mounts it makes outlive it exactly as they outlive a crashed node
// plugin.

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
)

// Binary builds ./cmd/localdir-csi once per test binary, into a temp dir.
// Declare one as a package variable and call Remove from TestMain. Without
// Race it is built as the Makefile builds the module outside -race (CGO off,
// -trimpath, the image's configuration), so it reuses the compiled
// dependencies of make build instead of compiling them once more.
type Binary struct {
	TempPattern string // os.MkdirTemp pattern of the dir holding the binary
	Race        bool   // build with -race

	once sync.Once
	dir  string
	path string
	err  error
}

// Path builds the binary on first use and returns its path; a failed build
// fails the test (and every later caller).
func (b *Binary) Path(t testing.TB) string {
	t.Helper()
	b.once.Do(b.build)
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.path
}

func (b *Binary) build() {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		b.err = fmt.Errorf("go env GOMOD: %w", err)
		return
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		b.err = fmt.Errorf("go env GOMOD: not in a module")
		return
	}
	b.dir, b.err = os.MkdirTemp("", b.TempPattern)
	if b.err != nil {
		return
	}
	b.path = filepath.Join(b.dir, "localdir-csi")
	args := []string{"build", "-o", b.path}
	env := os.Environ()
	if b.Race {
		args = append(args, "-race")
	} else {
		args = append(args, "-trimpath")
		env = append(env, "CGO_ENABLED=0")
	}
	cmd := exec.Command("go", append(args, "./cmd/localdir-csi")...)
	cmd.Dir = filepath.Dir(mod)
	cmd.Env = env
	if out, err := cmd.CombinedOutput(); err != nil {
		b.err = fmt.Errorf("go build ./cmd/localdir-csi: %v\n%s", err, out)
	}
}

// Remove deletes the temp dir holding the binary, if one was made.
func (b *Binary) Remove() {
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

// ProcArgs is the command line for an all-mode driver on dir (socket
// dir/csi.sock, data root dir/data, node n1, capacity 1Gi), then extra.
func ProcArgs(dir string, extra ...string) []string {
	return append([]string{
		"--endpoint=unix://" + filepath.Join(dir, "csi.sock"),
		"--data-root=" + filepath.Join(dir, "data"),
		"--node-id=n1",
		"--capacity=1Gi",
	}, extra...)
}

// SyncBuffer is a bytes.Buffer safe for the exec copier and the test.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Proc is one driver process and, after WaitReady, a client connection to
// it.
type Proc struct {
	Cmd    *exec.Cmd
	Output *SyncBuffer   // the process's stdout and stderr
	Done   chan struct{} // closed when the process has ended
	Err    error         // exit status, valid after Done

	Conn *grpc.ClientConn
}

// Launch starts the binary bin with exactly these arguments, without
// waiting for it to serve. The process is killed when the test ends.
func Launch(t testing.TB, bin string, args []string) *Proc {
	t.Helper()
	p := &Proc{Output: &SyncBuffer{}, Done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Stderr = p.Output
	p.Cmd.Stdout = p.Output
	if err := p.Cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.Err = p.Cmd.Wait(); close(p.Done) }()
	t.Cleanup(p.Kill)
	return p
}

// ReadyWait bounds WaitReady.
type ReadyWait struct {
	Total time.Duration // until the process must be ready
	Probe time.Duration // timeout of each Probe
	Poll  time.Duration // pause between Probes
}

// WaitReady connects to p on endpoint ep (setting Conn) and waits until
// Probe answers ready. It fails the test when the process exits or is not
// ready within w.Total.
func (p *Proc) WaitReady(t testing.TB, ep string, w ReadyWait) {
	t.Helper()
	// Short reconnect backoff: the first dial may hit the stale socket of a
	// killed predecessor, and the default 1 s backoff would then dominate
	// every restart.
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	p.Conn = conn
	identity := csi.NewIdentityClient(conn)
	// A stale socket of a killed predecessor may still be there: only a
	// successful Probe proves this process is serving.
	deadline := time.Now().Add(w.Total)
	for {
		select {
		case <-p.Done:
			t.Fatalf("driver exited during start-up (%v); output:\n%s", p.Err, p.Output)
		default:
		}
		c, cancel := context.WithTimeout(context.Background(), w.Probe)
		resp, err := identity.Probe(c, &csi.ProbeRequest{})
		cancel()
		if err == nil && resp.GetReady().GetValue() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("driver not ready after %v (last Probe: %v); output:\n%s", w.Total, err, p.Output)
		}
		time.Sleep(w.Poll)
	}
}

// Kill sends SIGKILL (kill -9), waits for the process to be gone and closes
// the connection; safe to repeat.
func (p *Proc) Kill() {
	select {
	case <-p.Done:
	default:
		_ = p.Cmd.Process.Signal(syscall.SIGKILL)
		<-p.Done
	}
	if p.Conn != nil {
		_ = p.Conn.Close()
	}
}

// Stop sends SIGTERM and requires a clean exit within timeout (else it
// kills the process).
func (p *Proc) Stop(t testing.TB, timeout time.Duration) {
	t.Helper()
	_ = p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.Done:
	case <-time.After(timeout):
		t.Errorf("driver did not stop within %v of SIGTERM", timeout)
		p.Kill()
	}
	if p.Err != nil {
		t.Errorf("driver exited with %v; output:\n%s", p.Err, p.Output)
	}
	_ = p.Conn.Close()
}
