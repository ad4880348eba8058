package driver

import (
	"context"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// identity is the CSI Identity service (spec §Identity Service RPC).
type identity struct {
	csi.UnimplementedIdentityServer
	d *Driver
}

// GetPluginInfo answers the driver name and version.
func (s *identity) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: s.d.opts.DriverName, VendorVersion: s.d.version}, nil
}

// GetPluginCapabilities advertises the mode's services (SnapshotMetadata
// where the backend answers it), the accessibility
// constraints (volumes and snapshots live on one node) and ONLINE expansion.
func (s *identity) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	svc := func(t csi.PluginCapability_Service_Type) *csi.PluginCapability {
		return &csi.PluginCapability{Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: t}}}
	}
	caps := []*csi.PluginCapability{
		svc(csi.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		svc(csi.PluginCapability_Service_SNAPSHOT_ACCESSIBILITY_CONSTRAINTS),
	}
	if s.d.opts.Mode != ModeNode {
		caps = append(caps, svc(csi.PluginCapability_Service_CONTROLLER_SERVICE))
	}
	if _, ok := s.d.groupBackend(); ok {
		caps = append(caps, svc(csi.PluginCapability_Service_GROUP_CONTROLLER_SERVICE))
	}
	if _, ok := s.d.metadataBackend(); ok {
		caps = append(caps, svc(csi.PluginCapability_Service_SNAPSHOT_METADATA_SERVICE))
	}
	caps = append(caps, &csi.PluginCapability{Type: &csi.PluginCapability_VolumeExpansion_{
		VolumeExpansion: &csi.PluginCapability_VolumeExpansion{Type: csi.PluginCapability_VolumeExpansion_ONLINE}}})
	return &csi.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe is ready when the data root is writable and the state file
// readable. Errors: FAILED_PRECONDITION with the reason.
func (s *identity) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	if s.d.store != nil {
		if err := s.d.store.Probe(); err != nil {
			return nil, status.Error(codes.FailedPrecondition, err.Error())
		}
	}
	return &csi.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
