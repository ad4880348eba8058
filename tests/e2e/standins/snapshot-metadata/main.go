// Command snapshotmetadata is a test stand-in for the external-snapshot-
// metadata sidecar (registry.k8s.io/sig-storage/csi-snapshot-metadata),
// whose Go module the module proxy does not serve, so the end-to-end
// cluster cannot build it. The cluster packs it into an image under the
// real one's name and tag, labelled as a stand-in, for the localdir
// controller Deployment of deploy/.
//
// It does what the deployment around the real sidecar relies on, and
// nothing of the backup API itself: it exits when the certificate files
// cannot be loaded within a minute (the real one exits at once and is
// restarted by the kubelet; waiting keeps the tests' "no container ever
// exited" check meaningful) and when the driver does not advertise the
// SnapshotMetadata service; it serves TLS on --port with the files' certificate (read again
// at each handshake, as the real one watches them) and answers the gRPC
// health service there; GET /health on --http-endpoint answers 200.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {
	csiAddr := flag.String("csi-address", "/run/csi/socket", "the driver's socket")
	certFile := flag.String("tls-cert", "", "the server certificate (PEM)")
	keyFile := flag.String("tls-key", "", "its key (PEM)")
	port := flag.Int("port", 50051, "the TLS gRPC port")
	httpEndpoint := flag.String("http-endpoint", ":8080", "where to serve /health")
	flag.Int("v", 0, "log verbosity (accepted for the real sidecar's flag; ignored)")
	flag.Parse()

	load := func() (*tls.Certificate, error) {
		c, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		return &c, err
	}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		_, err := load()
		if err == nil {
			break
		}
		if time.Since(start) > time.Minute {
			log.Fatalf("TLS certificate %s, key %s: %v", *certFile, *keyFile, err)
		}
	}
	if err := checkDriver(*csiAddr); err != nil {
		log.Fatal(err)
	}
	l, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		log.Fatal(err)
	}
	creds := credentials.NewTLS(&tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return load() }})
	srv := grpc.NewServer(grpc.Creds(creds))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go func() { log.Fatal(srv.Serve(l)) }()
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	log.Printf("serving TLS on :%d and /health on %s for the driver at %s", *port, *httpEndpoint, *csiAddr)
	log.Fatal(http.ListenAndServe(*httpEndpoint, mux))
}

// checkDriver: the driver advertises SNAPSHOT_METADATA_SERVICE.
func checkDriver(addr string) error {
	conn, err := grpc.NewClient("unix://"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := csi.NewIdentityClient(conn).GetPluginCapabilities(ctx, &csi.GetPluginCapabilitiesRequest{})
		cancel()
		if err != nil {
			log.Printf("GetPluginCapabilities: %v; again in a second", err)
			time.Sleep(time.Second)
			continue
		}
		for _, c := range resp.GetCapabilities() {
			if c.GetService().GetType() == csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE {
				return nil
			}
		}
		return fmt.Errorf("the driver at %s does not advertise SNAPSHOT_METADATA_SERVICE", addr)
	}
}
