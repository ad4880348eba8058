package transfer

import (
	"bufio"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// The changed-block channel: the controller asks the node plugin holding a
// snapshot for its block ranges (the CSI SnapshotMetadata service, which the
// controller serves). GET rangesPath + target snapshot id, with baseParam
// (the snapshot to take a delta from, or none: the allocated ranges) and
// startParam. The client must present a certificate the controller
// published (ControllerCerts). The body is text, one line per range,
// "<offset> <length>", then "end"; an error, before or after ranges, is
// "error <gRPC code> <message>" as the last line. A body without either
// last line was cut: the client fails it.
const (
	rangesPath = "/v1/ranges/"
	startParam = "start"
)

// RangesFunc yields the block ranges of snapshot target from start, of its
// data (base "") or of its difference from snapshot base (pkg/volume
// Snapshots.Ranges).
type RangesFunc func(base, target string, start int64, yield func(off, n int64) error) error

// ControllerCerts returns the certificates the controller replicas
// published (PEM), the only clients the ranges are served to.
type ControllerCerts func(ctx context.Context) ([]string, error)

// route sends each request to its handler.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, rangesPath) {
		s.handleRanges(w, r)
		return
	}
	s.handle(w, r)
}

func (s *Server) handleRanges(w http.ResponseWriter, r *http.Request) {
	target := strings.TrimPrefix(r.URL.Path, rangesPath)
	q := r.URL.Query()
	base := q.Get(baseParam)
	start, serr := strconv.ParseInt(q.Get(startParam), 10, 64)
	if s.Ranges == nil || s.ControllerCerts == nil || r.Method != http.MethodGet || !contract.ValidSnapshotID(target) ||
		base != "" && !contract.ValidSnapshotID(base) || serr != nil {
		http.Error(w, "not found", http.StatusNotFound)
		return
	}
	if err := s.admitController(r.Context(), r.TLS.PeerCertificates); err != nil {
		klog.InfoS("Block ranges refused", "snapshot", target, "remote", r.RemoteAddr, "reason", err)
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	cw := &countingWriter{w: w, rc: http.NewResponseController(w)}
	bw := bufio.NewWriterSize(cw, 64<<10)
	err := s.Ranges(base, target, start, func(off, n int64) error {
		if err := r.Context().Err(); err != nil {
			return err
		}
		_, err := fmt.Fprintf(bw, "%d %d\n", off, n)
		return err
	})
	if err != nil {
		klog.V(2).InfoS("Block ranges failed", "snapshot", target, "base", base, "remote", r.RemoteAddr, "err", err)
		fmt.Fprintf(bw, "error %d %s\n", contract.Code(err), strings.ReplaceAll(err.Error(), "\n", " "))
	} else {
		fmt.Fprintln(bw, "end")
	}
	_ = bw.Flush()
}

// admitController accepts a client that presents one certificate, exactly
// one the controller published, within its validity.
func (s *Server) admitController(ctx context.Context, peer []*x509.Certificate) error {
	if len(peer) != 1 {
		return fmt.Errorf("%w: one client certificate required", contract.ErrRefused)
	}
	pems, err := s.ControllerCerts(ctx)
	if err != nil {
		return fmt.Errorf("%w: the controller's certificates cannot be read: %v", contract.ErrRefused, err)
	}
	for _, p := range pems {
		want, err := Pinned(p)
		if err == nil && checkPeer([][]byte{peer[0].Raw}, want, time.Now()) == nil {
			return nil
		}
	}
	return fmt.Errorf("%w: the client's certificate is none the controller published", contract.ErrRefused)
}

// Ranges asks the node at address (whose published certificate is certPEM)
// for the block ranges of snapshot target from start (of its difference
// from base, or of its data when base is ""), and calls yield with each.
// Errors: the node's, with its gRPC code (contract.Reported);
// contract.ErrRefused; a network error or a cut answer (UNAVAILABLE).
func (c *Client) Ranges(ctx context.Context, node, address, certPEM, target, base string, start int64, yield func(off, n int64) error) error {
	tr, err := c.transport(node, address, certPEM)
	if err != nil {
		return err
	}
	defer tr.CloseIdleConnections()
	v := url.Values{startParam: {strconv.FormatInt(start, 10)}}
	if base != "" {
		v.Set(baseParam, base)
	}
	u := url.URL{Scheme: "https", Host: address, Path: rangesPath + target, RawQuery: v.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return &contract.Reported{Code: codes.Unavailable, Message: fmt.Sprintf("reach node %s at %s: %v", node, address, err)}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		why := fmt.Sprintf("node %s: %s", node, strings.TrimSpace(string(msg)))
		if resp.StatusCode == http.StatusForbidden {
			return fmt.Errorf("%w: %s", contract.ErrRefused, why)
		}
		return &contract.Reported{Code: codes.Unavailable, Message: fmt.Sprintf("%s (HTTP %d)", why, resp.StatusCode)}
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		line := sc.Text()
		if line == "end" {
			return nil
		}
		if rest, ok := strings.CutPrefix(line, "error "); ok {
			code, msg, _ := strings.Cut(rest, " ")
			n, err := strconv.ParseUint(code, 10, 32)
			if err != nil {
				break
			}
			return &contract.Reported{Code: codes.Code(n), Message: fmt.Sprintf("node %s: %s", node, msg)}
		}
		a, b, ok := strings.Cut(line, " ")
		off, err1 := strconv.ParseInt(a, 10, 64)
		n, err2 := strconv.ParseInt(b, 10, 64)
		if !ok || err1 != nil || err2 != nil {
			return &contract.Reported{Code: codes.Internal, Message: fmt.Sprintf("node %s sent a bad range line %q", node, line)}
		}
		if err := yield(off, n); err != nil {
			return err
		}
	}
	err = sc.Err()
	if err == nil {
		err = errors.New("the answer ended before its last line")
	}
	return &contract.Reported{Code: codes.Unavailable, Message: fmt.Sprintf("block ranges from node %s: %v", node, err)}
}
