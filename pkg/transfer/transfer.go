// Package transfer is the node-to-node data channel of cluster mode: each
// node plugin serves the data of its volumes and snapshots to the node
// plugin that the API says is creating a volume from them, and pulls from
// its peers the data of the volumes it creates from another node's.
//
// The channel is HTTPS (TLS 1.3, HTTP/1.1: one long response body per
// transfer) with mutual authentication by pinned keys: every node plugin
// makes an ECDSA key and a self-signed certificate for it at start (held in
// memory only, renewed before it expires: Identity) and publishes the
// certificate in its LocalNode's status, which the API server lets only
// that node's plugin write (the localdir-node-scope admission policy). A
// client accepts a server only if it presents exactly the certificate its
// node published; a server serves a volume's data only to a client that
// presents exactly the certificate of the node the API says the volume is
// being created on, from this node's data (Authorizer). No bearer secret
// ever crosses the wire, so there is nothing to replay, and an old key is
// refused the moment its node publishes a new one.
package transfer

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// Identity is a node plugin's key and the certificate it publishes.
type Identity struct {
	node     string
	lifetime time.Duration

	mu   sync.RWMutex
	cert tls.Certificate
	pem  string
}

// NewIdentity makes a key for node with a certificate valid for lifetime.
func NewIdentity(node string, lifetime time.Duration) (*Identity, error) {
	id := &Identity{node: node, lifetime: lifetime}
	return id, id.Rotate()
}

// Rotate replaces the key and certificate. Connections made with the old
// ones finish; new ones are refused once the new certificate is published.
func (id *Identity) Rotate() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "localdir node " + id.node, Organization: []string{"localdir.csi.dev"}},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(id.lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return err
	}
	id.mu.Lock()
	defer id.mu.Unlock()
	id.cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}
	id.pem = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	return nil
}

// CertificatePEM is the certificate to publish.
func (id *Identity) CertificatePEM() string {
	id.mu.RLock()
	defer id.mu.RUnlock()
	return id.pem
}

// RotateIfOld rotates once less than half the lifetime is left.
func (id *Identity) RotateIfOld() error {
	id.mu.RLock()
	left := time.Until(id.cert.Leaf.NotAfter)
	id.mu.RUnlock()
	if left > id.lifetime/2 {
		return nil
	}
	return id.Rotate()
}

func (id *Identity) current() *tls.Certificate {
	id.mu.RLock()
	defer id.mu.RUnlock()
	c := id.cert
	return &c
}

// Pinned parses a published certificate.
func Pinned(certPEM string) (*x509.Certificate, error) {
	b, _ := pem.Decode([]byte(certPEM))
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("no PEM certificate")
	}
	return x509.ParseCertificate(b.Bytes)
}

// checkPeer accepts exactly the certificate want, within its validity.
func checkPeer(raw [][]byte, want *x509.Certificate, now time.Time) error {
	if len(raw) != 1 {
		return fmt.Errorf("the peer presented %d certificates, want exactly its published one", len(raw))
	}
	if !bytes.Equal(raw[0], want.Raw) {
		return errors.New("the peer's certificate is not the one its node published")
	}
	if now.Before(want.NotBefore) || now.After(want.NotAfter) {
		return fmt.Errorf("the peer's certificate is outside its validity (%s to %s)", want.NotBefore.Format(time.RFC3339), want.NotAfter.Format(time.RFC3339))
	}
	return nil
}

// Authorizer says what the API allows for a pull of the data for volumeID
// (base: the snapshot the client holds and would take a difference from,
// or "")
// (a volume_id, or the name of a LocalSnapshot that is a snapshot's copy on
// another node: contract.SnapshotCopyName): the create to send the source
// of (Server sends its SourceSnapshotID or SourceVolumeID), the node it is
// made on and the certificate that node published, which the client must
// present (Server checks it); or an error wrapping contract.ErrRefused
// (answered 403) or contract.ErrNotFound.
type Authorizer interface {
	Authorize(ctx context.Context, volumeID, base string) (spec contract.CreateSpec, node, certPEM string, err error)
}

// SendFunc writes the stream of spec's source to w (pkg/volume Store.Send).
type SendFunc func(spec contract.CreateSpec, w io.Writer) error

// Server serves the data of this node's volumes and snapshots to its peers.
type Server struct {
	Identity  *Identity
	Authorize Authorizer
	Send      SendFunc
	// Ranges and ControllerCerts serve the controller the block ranges of
	// this node's snapshots (ranges.go); nil: not served.
	Ranges          RangesFunc
	ControllerCerts ControllerCerts
}

// dataPath is the one request: GET dataPath + volume_id, with baseParam
// naming the snapshot the client holds, if any.
const (
	dataPath  = "/v1/volumes/"
	baseParam = "base"
)

// Serve serves on lis until ctx is done.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	bl := &batchListener{Listener: lis, config: s.tlsConfig()}
	hs := &http.Server{
		Handler:           http.HandlerFunc(s.route),
		ReadHeaderTimeout: 10 * time.Second,
		ConnContext:       bl.connContext,
		// HTTP/1.1 only: one stream per connection, no HTTP/2 flow control.
		TLSNextProto: map[string]func(*http.Server, *tls.Conn, http.Handler){},
	}
	go func() {
		<-ctx.Done()
		_ = hs.Close()
	}()
	err := hs.Serve(bl)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) tlsConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		NextProtos:     []string{"http/1.1"},
		ClientAuth:     tls.RequireAnyClientCert,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return s.Identity.current(), nil },
	}
}

// admit authorizes a pull of volumeID by the client that presented
// certificate peer (DER): the one the volume's node published, within its
// validity.
func (s *Server) admit(ctx context.Context, volumeID, base string, peer []byte) (contract.CreateSpec, error) {
	spec, node, certPEM, err := s.Authorize.Authorize(ctx, volumeID, base)
	if err != nil {
		return spec, err
	}
	want, err := Pinned(certPEM)
	if err == nil {
		err = checkPeer([][]byte{peer}, want, time.Now())
	}
	if err != nil {
		return spec, fmt.Errorf("%w: volume %s is made on node %s: %v", contract.ErrRefused, volumeID, node, err)
	}
	return spec, nil
}

func (s *Server) handle(w http.ResponseWriter, r *http.Request) {
	volumeID, ok := strings.CutPrefix(r.URL.Path, dataPath)
	base := r.URL.Query().Get(baseParam)
	if r.Method != http.MethodGet || !ok || !contract.ValidVolumeID(volumeID) && contract.SnapshotOfCopy(volumeID) == "" && contract.VolumeOfMove(volumeID) == "" ||
		base != "" && !contract.ValidSnapshotID(base) {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	peer := r.TLS.PeerCertificates
	if len(peer) != 1 {
		http.Error(w, "one client certificate required", http.StatusForbidden)
		return
	}
	spec, err := s.admit(r.Context(), volumeID, base, peer[0].Raw)
	if err != nil {
		klog.InfoS("Transfer refused", "volumeID", volumeID, "remote", r.RemoteAddr, "reason", err)
		code := http.StatusForbidden
		if errors.Is(err, contract.ErrNotFound) {
			code = http.StatusNotFound
		} else if !errors.Is(err, contract.ErrRefused) {
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	klog.InfoS("Sending data to another node", "volumeID", volumeID, "remote", r.RemoteAddr,
		"sourceSnapshot", spec.SourceSnapshotID, "sourceVolume", spec.SourceVolumeID, "base", spec.BaseSnapshotID)
	w.Header().Set("Content-Type", "application/x-localdir-stream")
	// Send's errors before the first byte are the caller's to see; after
	// it, the connection is cut so the client never mistakes a partial
	// stream for a whole one (the stream's digest would catch it too).
	cw := &countingWriter{w: w, rc: http.NewResponseController(w)}
	cw.bc, _ = r.Context().Value(batchConnKey{}).(*batchConn)
	if err := s.Send(spec, cw); err != nil {
		klog.ErrorS(err, "Sending data to another node failed", "volumeID", volumeID, "remote", r.RemoteAddr)
		if cw.n == 0 {
			code := http.StatusInternalServerError
			switch {
			case errors.Is(err, contract.ErrNotFound):
				code = http.StatusNotFound
			case errors.Is(err, contract.ErrBusy):
				code = http.StatusConflict
			case errors.Is(err, contract.ErrInvalid), errors.Is(err, contract.ErrOutOfRange):
				code = http.StatusUnprocessableEntity
			case errors.Is(err, contract.ErrPrecondition):
				code = http.StatusPreconditionFailed
			}
			http.Error(w, err.Error(), code)
			return
		}
		panic(http.ErrAbortHandler)
	}
}

// IdleTimeout is how long either end waits for the other to take or send
// a byte before it gives the transfer up: a cut network is noticed within
// it, not after TCP's retransmissions run out (a quarter of an hour).
var IdleTimeout = 30 * time.Second

// countingWriter counts what the response carried, each write bounded by
// IdleTimeout.
type countingWriter struct {
	w  io.Writer
	rc *http.ResponseController
	bc *batchConn // the connection's, when known: each write is one batch
	n  int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	_ = c.rc.SetWriteDeadline(time.Now().Add(IdleTimeout))
	if c.bc != nil {
		c.bc.startBatch()
	}
	n, err := c.w.Write(p)
	if c.bc != nil {
		if berr := c.bc.endBatch(); err == nil && berr != nil {
			n, err = 0, berr
		}
	}
	c.n += int64(n)
	return n, err
}

// idleReader cancels its request once no byte arrived for IdleTimeout.
type idleReader struct {
	body   io.ReadCloser
	timer  *time.Timer
	idle   *atomic.Bool // set when the timer cancelled the request
	cancel context.CancelFunc
}

func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if n > 0 {
		r.timer.Reset(IdleTimeout)
	}
	if err != nil && r.idle.Load() {
		err = fmt.Errorf("no data from the source node for %s: %w", IdleTimeout, err)
	}
	return n, err
}

func (r *idleReader) Close() error {
	r.timer.Stop()
	r.cancel()
	return r.body.Close()
}

// Client pulls data from peers with this node's Identity.
type Client struct {
	Identity *Identity
}

// Pull opens the stream of the source of volumeID from the node at address
// whose published certificate is certPEM. Errors: contract.ErrNotFound (the
// peer holds no such source), contract.ErrRefused, contract.ErrBusy (the source is
// being changed: retry), contract.ErrInvalid (the source does not fit the
// volume), contract.ErrPrecondition (the source cannot leave its node: an
// encrypted directory volume's), or a network error (retry).
func (c *Client) Pull(ctx context.Context, node, address, certPEM, volumeID, base string) (io.ReadCloser, error) {
	tr, err := c.transport(node, address, certPEM)
	if err != nil {
		return nil, err
	}
	u := url.URL{Scheme: "https", Host: address, Path: dataPath + volumeID}
	if base != "" {
		u.RawQuery = url.Values{baseParam: {base}}.Encode()
	}
	ctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		cancel()
		return nil, err
	}
	idle := &atomic.Bool{}
	timer := time.AfterFunc(IdleTimeout, func() { idle.Store(true); cancel() })
	resp, err := tr.RoundTrip(req)
	if err != nil {
		timer.Stop()
		cancel()
		if idle.Load() {
			err = fmt.Errorf("no answer for %s: %w", IdleTimeout, err)
		}
		return nil, fmt.Errorf("reach node %s at %s: %w", node, address, err)
	}
	if resp.StatusCode == http.StatusOK {
		return &idleReader{body: resp.Body, timer: timer, idle: idle, cancel: cancel}, nil
	}
	timer.Stop()
	defer cancel()
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	why := fmt.Sprintf("node %s: %s", node, strings.TrimSpace(string(msg)))
	switch resp.StatusCode {
	case http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", contract.ErrNotFound, why)
	case http.StatusForbidden:
		return nil, fmt.Errorf("%w: %s", contract.ErrRefused, why)
	case http.StatusConflict:
		return nil, fmt.Errorf("%w: %s", contract.ErrBusy, why)
	case http.StatusUnprocessableEntity:
		return nil, fmt.Errorf("%w: %s", contract.ErrInvalid, why)
	case http.StatusPreconditionFailed:
		return nil, fmt.Errorf("%w: %s", contract.ErrPrecondition, why)
	}
	return nil, fmt.Errorf("%s (HTTP %d)", why, resp.StatusCode)
}

// transport is an HTTPS transport to the node at address that presents
// this Client's Identity and accepts exactly certPEM, the certificate that
// node published.
func (c *Client) transport(node, address, certPEM string) (*http.Transport, error) {
	want, err := Pinned(certPEM)
	if err != nil {
		return nil, fmt.Errorf("node %s published no usable transfer certificate: %w", node, err)
	}
	tc := &tls.Config{
		MinVersion: tls.VersionTLS13,
		NextProtos: []string{"http/1.1"},
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.Identity.current(), nil
		},
		// The server is authenticated by its pinned certificate, not by a
		// CA and a name: VerifyPeerCertificate does it.
		InsecureSkipVerify: true,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if err := checkPeer(raw, want, time.Now()); err != nil {
				return fmt.Errorf("node %s at %s: %w", node, address, err)
			}
			return nil
		},
	}
	tr := &http.Transport{
		DialTLSContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			return dialTLS(ctx, addr, tc)
		},
		DisableKeepAlives: true,
		ForceAttemptHTTP2: false,
		TLSNextProto:      map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
	return tr, nil
}
