package transfer

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"sync"
)

// Fewer, larger system calls under TLS. crypto/tls writes each record (16
// KiB at most) with a write of its own and reads about one per read; on a
// stream of gigabytes those calls cost more than the encryption. The
// server's handler batches the records of each of its writes into writes
// of up to batchSize (batchConn); the client reads through a buffer of
// readBufferSize.
const (
	batchSize      = 512 << 10
	readBufferSize = 512 << 10
)

// batchConn is the TCP connection under a server's tls.Conn. Between
// startBatch and endBatch it gathers what TLS writes and sends it in large
// writes; endBatch sends the rest, so nothing TLS wrote outlives the
// tls.Conn.Write that wrote it.
type batchConn struct {
	net.Conn
	mu       sync.Mutex
	batching bool
	buf      []byte
	err      error
}

func (c *batchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.batching {
		return c.Conn.Write(p)
	}
	if c.err != nil {
		return 0, c.err
	}
	if len(c.buf)+len(p) > batchSize {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	if len(p) >= batchSize {
		n, err := c.Conn.Write(p)
		c.err = err
		return n, err
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *batchConn) flushLocked() error {
	if len(c.buf) > 0 && c.err == nil {
		_, c.err = c.Conn.Write(c.buf)
	}
	c.buf = c.buf[:0]
	return c.err
}

func (c *batchConn) startBatch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batching = true
	if c.buf == nil {
		c.buf = make([]byte, 0, batchSize)
	}
}

// endBatch sends what the batch gathered: its error is the error of the
// writes it gathered.
func (c *batchConn) endBatch() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.batching = false
	return c.flushLocked()
}

// batchListener makes the server's TLS connections over batchConns and
// keeps each batchConn for its tls.Conn until ConnContext takes it.
type batchListener struct {
	net.Listener
	config *tls.Config
	conns  sync.Map // *tls.Conn → *batchConn
}

func (l *batchListener) Accept() (net.Conn, error) {
	raw, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	bc := &batchConn{Conn: raw}
	tc := tls.Server(bc, l.config)
	l.conns.Store(tc, bc)
	return tc, nil
}

type batchConnKey struct{}

// connContext is the http.Server's ConnContext: it hands each connection's
// batchConn to its requests.
func (l *batchListener) connContext(ctx context.Context, c net.Conn) context.Context {
	if bc, ok := l.conns.LoadAndDelete(c); ok {
		return context.WithValue(ctx, batchConnKey{}, bc)
	}
	return ctx
}

// readBufConn is the TCP connection under a client's tls.Conn, read
// through a buffer.
type readBufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *readBufConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialTLS dials address and completes the TLS handshake of config over a
// readBufConn.
func dialTLS(ctx context.Context, address string, config *tls.Config) (net.Conn, error) {
	var d net.Dialer
	raw, err := d.DialContext(ctx, "tcp", address)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(&readBufConn{Conn: raw, r: bufio.NewReaderSize(raw, readBufferSize)}, config)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, err
	}
	return tc, nil
}
