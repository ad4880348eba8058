package cluster

import (
	"k8s.io/apimachinery/pkg/api/resource"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// The API objects meet the backends' contract types here and only here.

// quantity is a byte count as the API writes sizes (binary units; Value()
// reads it back exactly).
func quantity(n int64) resource.Quantity { return *resource.NewQuantity(n, resource.BinarySI) }

func accessType(mode string) contract.AccessType {
	if mode == v1.VolumeModeBlock {
		return contract.AccessBlock
	}
	return contract.AccessMount
}

func volumeMode(accessType contract.AccessType) string {
	if accessType == contract.AccessBlock {
		return v1.VolumeModeBlock
	}
	return v1.VolumeModeFilesystem
}

func toVolume(lv *v1.LocalVolume) *contract.Volume {
	v := &contract.Volume{
		ID:                lv.Name,
		Name:              lv.Spec.CSIName,
		CapacityBytes:     max(lv.Spec.Size.Value(), lv.Status.CapacityBytes.Value()),
		AccessType:        accessType(lv.Spec.VolumeMode),
		FsType:            lv.Spec.FsType,
		Parameters:        lv.Spec.Parameters,
		MutableParameters: lv.Status.MutableParameters,
		Engine:            contract.Engine(lv.Spec.Engine),
		CreatedAt:         lv.CreationTimestamp.UTC(),
		Node:              lv.Spec.Node,
	}
	if cs := lv.Spec.ContentSource; cs != nil {
		v.SourceSnapshotID, v.SourceVolumeID = cs.Snapshot, cs.Volume
	}
	return v
}

func toSnapshot(ls *v1.LocalSnapshot) *contract.Snapshot {
	s := &contract.Snapshot{
		ID:             ls.Name,
		Name:           ls.Spec.CSIName,
		SourceVolumeID: ls.Spec.SourceVolume,
		SizeBytes:      ls.Status.SizeBytes.Value(),
		CreatedAt:      ls.CreationTimestamp.UTC(),
		Node:           ls.Spec.Node,
	}
	s.GroupSnapshotID = ls.Spec.GroupSnapshot
	if ls.Status.CreationTime != nil {
		s.CreatedAt = ls.Status.CreationTime.UTC()
	}
	return s
}

func phaseOf(p string) string {
	if p == "" {
		return v1.PhasePending
	}
	return p
}
