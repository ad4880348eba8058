// Command livenessprobe is a test stand-in for the CSI livenessprobe
// sidecar (registry.k8s.io/sig-storage/livenessprobe), which the Go module
// proxy does not serve, so the end-to-end cluster cannot build it. The
// cluster packs it into an image under the real one's name and tag,
// labelled as a stand-in, for the localdir Deployment and DaemonSet of
// deploy/.
//
// It does what the pods' liveness probes need: GET /healthz on
// --http-endpoint calls the CSI Identity service's Probe on --csi-address
// (within --probe-timeout) and answers 200 when the driver is ready, 500
// with the reason otherwise (CSI spec, Identity Service, Probe).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func main() {
	csiAddr := flag.String("csi-address", "/run/csi/socket", "the driver's socket")
	httpEndpoint := flag.String("http-endpoint", ":9808", "where to serve /healthz")
	timeout := flag.Duration("probe-timeout", time.Second, "how long a Probe may take")
	flag.Int("v", 0, "log verbosity (accepted for the real livenessprobe's flag; ignored)")
	flag.Parse()

	conn, err := grpc.NewClient("unix://"+*csiAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	identity := csi.NewIdentityClient(conn)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), *timeout)
		defer cancel()
		resp, err := identity.Probe(ctx, &csi.ProbeRequest{})
		switch {
		case err != nil:
			http.Error(w, fmt.Sprintf("Probe: %v", err), http.StatusInternalServerError)
		case resp.GetReady() != nil && !resp.GetReady().GetValue():
			http.Error(w, "the driver is not ready", http.StatusInternalServerError)
		default:
			fmt.Fprintln(w, "ok")
		}
	})
	log.Printf("serving /healthz on %s for the driver at %s", *httpEndpoint, *csiAddr)
	log.Fatal(http.ListenAndServe(*httpEndpoint, mux))
}
