package transfer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/localdir-csi/localdir/pkg/contract"
)

const target = "vol-0123456789abcdef0123456789abcdef"

// pinAuthorizer allows target, made on node "b" whose published
// certificate is pinned(), as pkg/cluster's does from the API.
type pinAuthorizer struct{ pinned func() string }

func (a pinAuthorizer) Authorize(_ context.Context, volumeID, _ string) (contract.CreateSpec, string, string, error) {
	if volumeID != target {
		return contract.CreateSpec{}, "", "", fmt.Errorf("%w: no volume %s is being created from this node", contract.ErrNotFound, volumeID)
	}
	return contract.CreateSpec{ID: volumeID, SourceSnapshotID: "snap-0123456789abcdef0123456789abcdef"}, "b", a.pinned(), nil
}

type channel struct {
	addr         string
	server, peer *Identity
	sent         int
}

func newChannel(t *testing.T) *channel {
	t.Helper()
	var c *channel
	c = newChannelSending(t, func(spec contract.CreateSpec, w io.Writer) error {
		c.sent++
		_, err := io.WriteString(w, "data of "+spec.SourceSnapshotID)
		return err
	})
	return c
}

// newChannelSending serves target with send.
func newChannelSending(t testing.TB, send func(contract.CreateSpec, io.Writer) error) *channel {
	t.Helper()
	c := &channel{}
	var err error
	if c.server, err = NewIdentity("a", time.Hour); err != nil {
		t.Fatal(err)
	}
	if c.peer, err = NewIdentity("b", time.Hour); err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c.addr = lis.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Identity: c.server, Authorize: pinAuthorizer{c.peer.CertificatePEM}, Send: send}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return c
}

func TestPullAuthenticated(t *testing.T) {
	c := newChannel(t)
	body, err := (&Client{Identity: c.peer}).Pull(context.Background(), "a", c.addr, c.server.CertificatePEM(), target, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(body)
	body.Close()
	if err != nil || string(got) != "data of snap-0123456789abcdef0123456789abcdef" {
		t.Fatalf("pulled %q, %v", got, err)
	}
}

// TestPullRefused: every client or server that is not the one the API names
// gets nothing, and the source sends nothing.
func TestPullRefused(t *testing.T) {
	c := newChannel(t)
	stranger, err := NewIdentity("b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cases := []struct {
		name    string
		pull    func() (io.ReadCloser, error)
		wantErr error
		want    string
	}{
		{"a client with another key under the same node name", func() (io.ReadCloser, error) {
			return (&Client{Identity: stranger}).Pull(ctx, "a", c.addr, c.server.CertificatePEM(), target, "")
		}, contract.ErrRefused, "not the one its node published"},
		{"a server that is not the published one", func() (io.ReadCloser, error) {
			return (&Client{Identity: c.peer}).Pull(ctx, "a", c.addr, stranger.CertificatePEM(), target, "")
		}, nil, "not the one its node published"},
		{"a volume nobody is creating from this node", func() (io.ReadCloser, error) {
			return (&Client{Identity: c.peer}).Pull(ctx, "a", c.addr, c.server.CertificatePEM(), "vol-ffffffffffffffffffffffffffffffff", "")
		}, contract.ErrNotFound, "no volume"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body, err := tc.pull()
			if err == nil {
				body.Close()
				t.Fatal("pulled")
			}
			if (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Pull: %v; want %v containing %q", err, tc.wantErr, tc.want)
			}
		})
	}

	// Without any client certificate the handshake itself fails.
	tr := &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}
	if resp, err := (&http.Client{Transport: tr}).Get("https://" + c.addr + dataPath + target); err == nil {
		resp.Body.Close()
		t.Errorf("a client without a certificate got HTTP %d", resp.StatusCode)
	}
	// A rotated key is refused as soon as the new one is published.
	old := &Identity{node: "b", lifetime: time.Hour, cert: *c.peer.current()}
	if err := c.peer.Rotate(); err != nil {
		t.Fatal(err)
	}
	if _, err := (&Client{Identity: old}).Pull(ctx, "a", c.addr, c.server.CertificatePEM(), target, ""); !errors.Is(err, contract.ErrRefused) {
		t.Errorf("a rotated-out key: %v, want refused", err)
	}
	// A published certificate past its validity is refused even to its key.
	expired, err := NewIdentity("b", -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Identity: c.server, Authorize: pinAuthorizer{expired.CertificatePEM}}
	if _, err := s.admit(ctx, target, "", expired.current().Leaf.Raw); !errors.Is(err, contract.ErrRefused) || !strings.Contains(err.Error(), "outside its validity") {
		t.Errorf("an expired published certificate: %v, want refused", err)
	}
	if c.sent != 0 {
		t.Errorf("the source sent %d streams to refused clients", c.sent)
	}
	if body, err := (&Client{Identity: c.peer}).Pull(ctx, "a", c.addr, c.server.CertificatePEM(), target, ""); err != nil {
		t.Errorf("the rotated key: %v", err)
	} else {
		body.Close()
	}
}

// TestPinnedValidity: a published certificate past its NotAfter is refused
// even when it matches.
func TestPinnedValidity(t *testing.T) {
	id, err := NewIdentity("a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	leaf := id.current().Leaf
	if err := checkPeer([][]byte{leaf.Raw}, leaf, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := checkPeer([][]byte{leaf.Raw}, leaf, time.Now().Add(2*time.Hour)); err == nil || !strings.Contains(err.Error(), "validity") {
		t.Errorf("an expired certificate: %v", err)
	}
	if err := checkPeer(nil, leaf, time.Now()); err == nil {
		t.Error("no certificate accepted")
	}
	if _, err := Pinned("garbage"); err == nil {
		t.Error("garbage parsed as a certificate")
	}
}

// TestPullIdleTimeout: a source that stops sending mid-stream (a cut
// network) fails the read after IdleTimeout, not after TCP gives up.
func TestPullIdleTimeout(t *testing.T) {
	old := IdleTimeout
	IdleTimeout = 300 * time.Millisecond
	defer func() { IdleTimeout = old }()
	server, _ := NewIdentity("a", time.Hour)
	peer, _ := NewIdentity("b", time.Hour)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := &Server{Identity: server, Authorize: pinAuthorizer{peer.CertificatePEM}, Send: func(_ contract.CreateSpec, w io.Writer) error {
		_, _ = w.Write(make([]byte, 64<<10)) // more than the response buffers
		<-release
		return nil
	}}
	go func() { _ = s.Serve(ctx, lis) }()
	defer close(release)
	body, err := (&Client{Identity: peer}).Pull(ctx, "a", lis.Addr().String(), server.CertificatePEM(), target, "")
	if err != nil {
		t.Fatal(err)
	}
	defer body.Close()
	start := time.Now()
	_, err = io.ReadAll(body)
	if err == nil || !strings.Contains(err.Error(), "no data from the source node") || time.Since(start) > 5*time.Second {
		t.Fatalf("a stalled stream: %v after %s", err, time.Since(start))
	}
}

// BenchmarkPull moves 1 GiB from memory to memory through the channel (TLS
// and HTTP over loopback, both ends in this process): the channel's own
// cost.
func BenchmarkPull(b *testing.B) {
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	const size = 1 << 30
	c := newChannelSending(b, func(_ contract.CreateSpec, w io.Writer) error {
		for n := 0; n < size; n += len(buf) {
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
	b.SetBytes(size)
	for i := 0; i < b.N; i++ {
		body, err := (&Client{Identity: c.peer}).Pull(context.Background(), "a", c.addr, c.server.CertificatePEM(), target, "")
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, body, make([]byte, 1<<20))
		body.Close()
		if err != nil || n != size {
			b.Fatalf("pulled %d bytes: %v", n, err)
		}
	}
}
