// Command floor is the stand-in CSI driver of `make bench-cluster`: its
// Controller service answers CreateVolume and DeleteVolume at once, with
// no storage behind them, so csi-provisioner and the control plane are
// all that a PVC waits for. Binding N PVCs of its StorageClass measures
// the floor of the local cluster, against which localdir's figures are
// read (docs/benchmarks.md). With --node-id it serves the Node service
// instead, for one node's kubelet: NodePublishVolume makes the target
// directory and nothing more, so the pods of its volumes start as
// localdir's do, at the least cost a node can have. Not a driver: a test
// tool.
package main

import (
	"context"
	"errors"
	"flag"
	"io/fs"
	"log"
	"net"
	"os"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DriverName is the stand-in's CSI driver name (its StorageClasses'
// provisioner).
const DriverName = "floor.localdir.test"

type server struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	nodeID string // set: the Node service of this node
}

func (server) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: DriverName, VendorVersion: "0"}, nil
}

func (s server) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	if s.nodeID != "" {
		return &csi.GetPluginCapabilitiesResponse{}, nil
	}
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

// NodeGetInfo names the node (the kubelet's Node name); no topology, as
// the Controller service has no accessibility constraints either.
func (s server) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: s.nodeID}, nil
}

// NodeGetCapabilities: none (no staging, no stats, no expansion).
func (server) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

// NodePublishVolume makes target_path, an empty directory the kubelet
// gives the pod's containers (its parent is the kubelet's); a repeated
// call finds it there. Missing fields are INVALID_ARGUMENT; a raw block
// volume, which would need a device at target_path, is INVALID_ARGUMENT
// too (the benchmark's volumes are filesystem volumes).
func (server) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetTargetPath() == "" || req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume_id, target_path and volume_capability are required")
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Error(codes.InvalidArgument, "the stand-in has no raw block volumes")
	}
	if err := os.Mkdir(req.GetTargetPath(), 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodePublishVolumeResponse{}, nil
}

// NodeUnpublishVolume removes target_path and what the pod wrote in it
// (nothing is mounted there: the pod wrote into the directory itself).
func (server) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" || req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume_id and target_path are required")
	}
	if err := os.RemoveAll(req.GetTargetPath()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func main() {
	sock := flag.String("socket", "", "unix socket to serve on")
	nodeID := flag.String("node-id", "", "serve the Node service for this node (the kubelet's Node name) instead of the Controller service")
	flag.Parse()
	_ = os.Remove(*sock)
	l, err := net.Listen("unix", *sock)
	if err != nil {
		log.Fatal(err)
	}
	s := grpc.NewServer()
	srv := server{nodeID: *nodeID}
	csi.RegisterIdentityServer(s, srv)
	if srv.nodeID != "" {
		csi.RegisterNodeServer(s, srv)
	} else {
		csi.RegisterControllerServer(s, srv)
	}
	log.Fatal(s.Serve(l))
}
