// Command registrar is a test stand-in for node-driver-registrar
// (registry.k8s.io/sig-storage/csi-node-driver-registrar), which the Go
// module proxy does not serve, so the end-to-end cluster cannot build it.
// It does the part the kubelet needs: it asks the CSI driver for its name
// (GetPluginInfo) and serves the kubelet's plugin registration API
// (k8s.io/kubelet/pkg/apis/pluginregistration/v1: GetInfo and
// NotifyRegistrationStatus) on a socket in <kubelet root>/plugins_registry/.
// The kubelet's plugin watcher finds the socket, calls GetInfo, connects to
// the driver's socket and records the driver in the node's CSINode object.
//
// It is a test tool only. The end-to-end cluster packs it into an image
// under the real registrar's name and tag (the localdir-node DaemonSet of
// deploy/ runs it as it would the real one), labelled as a stand-in; it
// takes the real registrar's flags the DaemonSet passes (--csi-address,
// --kubelet-registration-path, --http-endpoint, --v) and serves /healthz on
// --http-endpoint: 200 once the kubelet accepted the registration.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type server struct {
	registerapi.UnimplementedRegistrationServer
	name, endpoint string
	failed         chan string
	registered     atomic.Bool
}

func (s *server) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	log.Printf("GetInfo from the kubelet: %s at %s", s.name, s.endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.name,
		Endpoint:          s.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (s *server) NotifyRegistrationStatus(_ context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !st.PluginRegistered {
		log.Printf("the kubelet refused the registration: %s", st.Error)
		select {
		case s.failed <- st.Error:
		default:
		}
	} else {
		log.Printf("registered with the kubelet")
		s.registered.Store(true)
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// driverName waits for the driver's socket and asks for its name.
func driverName(ctx context.Context, addr string) (string, error) {
	conn, err := grpc.NewClient("unix://"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := csi.NewIdentityClient(conn).GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			return resp.GetName(), nil
		}
		log.Printf("waiting for the driver at %s: %v", addr, err)
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func main() {
	csiAddr := flag.String("csi-address", "", "the driver's socket, as this process sees it")
	regPath := flag.String("kubelet-registration-path", "", "the driver's socket, as the kubelet sees it")
	// The real registrar's container mounts the kubelet's plugins_registry
	// at /registration.
	regDir := flag.String("plugin-registration-dir", "/registration", "the kubelet's plugin registration directory, as this process sees it")
	httpEndpoint := flag.String("http-endpoint", "", "where to serve /healthz (200 once registered); empty: not served")
	flag.Int("v", 0, "log verbosity (accepted for the real registrar's flag; ignored)")
	flag.Parse()
	if *csiAddr == "" || *regPath == "" {
		log.Fatal("--csi-address and --kubelet-registration-path are required")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	name, err := driverName(ctx, *csiAddr)
	if err != nil {
		log.Fatalf("driver name: %v", err)
	}
	sock := filepath.Join(*regDir, name+"-reg.sock")
	if err := os.Remove(sock); err != nil && !os.IsNotExist(err) {
		log.Fatal(err)
	}
	lis, err := net.Listen("unix", sock)
	if err != nil {
		log.Fatal(err)
	}
	defer os.Remove(sock)
	s := &server{name: name, endpoint: *regPath, failed: make(chan string, 1)}
	g := grpc.NewServer()
	registerapi.RegisterRegistrationServer(g, s)
	go func() {
		if err := g.Serve(lis); err != nil {
			log.Printf("serve: %v", err)
		}
	}()
	log.Printf("serving the registration of %s on %s", name, sock)
	if *httpEndpoint != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
			if !s.registered.Load() {
				http.Error(w, "not registered with the kubelet yet", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		go func() { log.Print(http.ListenAndServe(*httpEndpoint, mux)) }()
	}
	select {
	case <-ctx.Done():
		g.Stop()
	case msg := <-s.failed:
		g.Stop()
		os.Remove(sock)
		fmt.Fprintln(os.Stderr, "registration failed:", msg)
		os.Exit(1)
	}
}
