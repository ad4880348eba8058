package app

import (
	"context"
	"fmt"
	"io"
	"net"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/localdir-csi/localdir/pkg/cluster"
	"github.com/localdir-csi/localdir/pkg/contract"
	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/pkg/transfer"
	"github.com/localdir-csi/localdir/pkg/volume"
)

// nodeTransfer is the node agent's cluster.Transfer: this node's Identity,
// a Client with it, and the address published for peers.
type nodeTransfer struct {
	*transfer.Identity
	client  *transfer.Client
	address string
}

func (t *nodeTransfer) Address() string { return t.address }

func (t *nodeTransfer) Pull(ctx context.Context, node, address, certPEM, volumeID, base string) (io.ReadCloser, error) {
	return t.client.Pull(ctx, node, address, certPEM, volumeID, base)
}

var _ cluster.Transfer = (*nodeTransfer)(nil)

// Transfer is a node's node-to-node channel: Serve serves its peers (the
// listener is open from NewTransfer on), Agent is the node agent's end.
type Transfer struct {
	Agent cluster.Transfer
	Serve func(ctx context.Context) error
}

// NewTransfer opens the node-to-node channel of opts (nil when
// --transfer-address is not set): a new key, the server over store,
// authorized from the API through cfg.
func NewTransfer(opts driver.Options, cfg *rest.Config, store *volume.Store) (*Transfer, error) {
	if opts.TransferAddress == "" {
		return nil, nil
	}
	id, err := transfer.NewIdentity(opts.NodeID, opts.TransferCertLifetime)
	if err != nil {
		return nil, err
	}
	reader, err := client.New(cfg, client.Options{Scheme: cluster.Scheme()})
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", opts.TransferAddress)
	if err != nil {
		return nil, fmt.Errorf("--transfer-address=%q: %w", opts.TransferAddress, err)
	}
	srv := &transfer.Server{
		Identity:  id,
		Authorize: &cluster.TransferAuthorizer{Reader: reader, NodeID: opts.NodeID},
		Send: func(spec contract.CreateSpec, w io.Writer) error {
			_, err := store.Send(spec, w)
			return err
		},
	}
	if ns := Namespace(opts); ns != "" {
		srv.Ranges = store.Snapshots().Ranges
		srv.ControllerCerts = cluster.ControllerCerts(reader, ns)
	}
	addr := opts.TransferPeerAddress()
	if h, p, _ := net.SplitHostPort(addr); p == "0" { // a port the kernel picked (tests)
		_, lp, _ := net.SplitHostPort(lis.Addr().String())
		addr = net.JoinHostPort(h, lp)
	}
	return &Transfer{
		Agent: &nodeTransfer{Identity: id, client: &transfer.Client{Identity: id}, address: addr},
		Serve: func(ctx context.Context) error { return srv.Serve(ctx, lis) },
	}, nil
}
