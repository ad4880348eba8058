// Command floor is the stand-in CSI driver of `make bench-cluster`: its
// Controller service answers CreateVolume and DeleteVolume at once, with
// no storage behind them, so csi-provisioner and the control plane are
// all that a PVC waits for. Binding N PVCs of its StorageClass measures
// the floor of the local cluster, against which localdir's figures are
// read (docs/benchmarks.md). It has no Node service: pods of its volumes
// never start. Not a driver: a test tool.
package main

import (
	"context"
	"flag"
	"log"
	"net"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
)

// DriverName is the stand-in's CSI driver name (its StorageClasses'
// provisioner).
const DriverName = "floor.localdir.test"

type server struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
}

func (server) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: "0"}, nil
}

func (server) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{Type: &csi.PluginCapability_Service_{
		Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}}}}}, nil
}

func (server) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

func (server) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{Type: &csi.ControllerServiceCapability_Rpc{
		Rpc: &csi.ControllerServiceCapability_RPC{Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}}}}}, nil
}

// CreateVolume answers with a volume named after the request, of the
// requested size.
func (server) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{VolumeId: req.GetName(), CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}}, nil
}

func (server) DeleteVolume(context.Context, *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	return &csi.DeleteVolumeResponse{}, nil
}

func main() {
	sock := flag.String("socket", "", "unix socket to serve on")
	flag.Parse()
	_ = os.Remove(*sock)
	l, err := net.Listen("unix", *sock)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	csi.RegisterIdentityServer(s, server{})
	csi.RegisterControllerServer(s, server{})
	log.Fatal(s.Serve(l))
}
