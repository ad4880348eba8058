// Package v1alpha1 is the localdir.csi.dev/v1alpha1 API: the custom
// resources through which the controller Deployment and the node plugins
// meet in cluster mode. All of them are cluster-scoped.
//
// +kubebuilder:object:generate=true
// +groupName=localdir.csi.dev
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API group and version of these resources.
var GroupVersion = schema.GroupVersion{Group: "localdir.csi.dev", Version: "v1alpha1"}

// AddToScheme registers the types with a runtime.Scheme.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion,
		&LocalVolume{}, &LocalVolumeList{},
		&LocalSnapshot{}, &LocalSnapshotList{},
		&LocalGroupSnapshot{}, &LocalGroupSnapshotList{},
		&LocalNode{}, &LocalNodeList{},
	)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Label names.
const (
	// NodeLabel on LocalVolume and LocalSnapshot objects names the node that
	// holds the data, so each node plugin watches only its own objects.
	NodeLabel = "localdir.csi.dev/node"
	// ReadoptedLabel marks objects a node plugin re-created for data it
	// still held after their object went away without a delete request
	// (CRDs deleted, an object deleted by hand). Value: "true".
	ReadoptedLabel = "localdir.csi.dev/readopted"
	// CopyOfLabel on a LocalSnapshot that is a copy names the snapshot
	// (spec.copyOf) it is a copy of, so the controller finds every copy.
	CopyOfLabel = "localdir.csi.dev/copy-of"
	// MoveOfLabel on a LocalVolume that moves a volume to another node
	// names the volume (spec.moveOf), so the controller finds its moves.
	MoveOfLabel = "localdir.csi.dev/move-of"
)

// MoveToAnnotation on a PersistentVolumeClaim of localdir names the node to
// move its volume to, in place: the PVC and its PV stay, the data is copied
// there and the PV's node affinity follows (docs/troubleshooting.md, "I
// must drain a node"). It needs the MutablePVNodeAffinity feature gate.
const MoveToAnnotation = "localdir.csi.dev/move-to"

// VolumeDeletedAnnotation ("true") on a move LocalVolume says its volume
// was deleted (DeleteVolume): its node removes what arrived whatever the
// volume's own object says.
const VolumeDeletedAnnotation = "localdir.csi.dev/volume-deleted"

// Annotations of a LocalVolume naming the PVC it was made for (from the
// provisioner's --extra-create-metadata), where a transfer's Events go too.
const (
	PVCNamespaceAnnotation = "localdir.csi.dev/pvc-namespace"
	PVCNameAnnotation      = "localdir.csi.dev/pvc-name"
)

// Phases of LocalVolume and LocalSnapshot.
const (
	PhasePending  = "Pending"  // recorded by the controller, not yet seen by the node
	PhaseReady    = "Ready"    // the data exists on the node
	PhaseFailed   = "Failed"   // the node could not create it; see the Ready condition
	PhaseDeleting = "Deleting" // delete requested, the node is removing the data
)

// ConditionReady is the condition type carrying why an object is or is not
// ready.
const ConditionReady = "Ready"

// ConditionModified is the condition type of a LocalVolume saying whether
// spec.mutableParameters are in effect, and why not.
const ConditionModified = "Modified"

// VolumeMode values, as in a PersistentVolume.
const (
	VolumeModeFilesystem = "Filesystem"
	VolumeModeBlock      = "Block"
)

// Sizes are resource.Quantity values of bytes: the controller and the node
// plugin write them in binary units (2Gi); the schema accepts an integer
// or a quantity string (x-kubernetes-int-or-string).

// ErrorCode is the name of a gRPC status code as codes.Code.String() spells
// it (ResourceExhausted, NotFound, …).
//
// +kubebuilder:validation:Enum=OK;Canceled;Unknown;InvalidArgument;DeadlineExceeded;NotFound;AlreadyExists;PermissionDenied;ResourceExhausted;FailedPrecondition;Aborted;OutOfRange;Unimplemented;Internal;Unavailable;DataLoss;Unauthenticated
type ErrorCode string

// ContentSource is what a new volume is filled from: at most one field set.
type ContentSource struct {
	// Snapshot is the snapshot_id (a LocalSnapshot name) to restore.
	// +optional
	Snapshot string `json:"snapshot,omitempty"`
	// Volume is the volume_id (a LocalVolume name) to clone.
	// +optional
	Volume string `json:"volume,omitempty"`
	// Node is the node holding the source when it is not the volume's own
	// node: the volume's node plugin pulls the data from that node's over
	// the node-to-node channel (docs/design.md), and that node's plugin
	// serves it only for this object. Set by the controller only (the
	// localdir-node-scope policy refuses it from node plugins).
	// +optional
	Node string `json:"node,omitempty"`
}

// VolumeTransfer is the progress of a volume's data coming from another
// node (spec.contentSource.node).
type VolumeTransfer struct {
	// SourceNode is the node the data comes from.
	SourceNode string `json:"sourceNode"`
	// BytesDone is the data received so far in the current attempt.
	// +optional
	BytesDone resource.Quantity `json:"bytesDone,omitzero"`
	// BytesTotal is about how much data the source holds (its allocated
	// bytes), as the source node reported at the start of the attempt.
	// +optional
	BytesTotal resource.Quantity `json:"bytesTotal,omitzero"`
	// Attempts counts the attempts made, this one included.
	// +optional
	Attempts int32 `json:"attempts,omitempty"`
	// LastError is why the previous attempt failed ("" for none).
	// +optional
	LastError string `json:"lastError,omitempty"`
	// LastAttemptTime is when the current (or last) attempt started; the
	// next comes no sooner than its backoff after it.
	// +optional
	LastAttemptTime *metav1.Time `json:"lastAttemptTime,omitempty"`
	// StartTime is when the first attempt started; CompletionTime when the
	// data was verified and the volume made.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
}

// LocalVolumeSpec is the volume the controller asks a node to hold.
type LocalVolumeSpec struct {
	// Node is the node id (CSI node_id, the value of the
	// topology.localdir.csi.dev/node key) whose data root holds the volume.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
	// Size is the volume's capacity in bytes. It is a quantity (2Gi).
	// ControllerExpandVolume raises it; the node plugin then grows the
	// volume (btrfs qgroup limit, image file size).
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isInteger() && quantity(string(self)).compareTo(quantity('1')) >= 0",message="size must be a whole number of bytes, at least 1"
	Size resource.Quantity `json:"size"`
	// VolumeMode is Filesystem (a directory, mounted into pods) or Block (an
	// image file attached as a loop device).
	// +kubebuilder:validation:Enum=Filesystem;Block
	// +kubebuilder:default=Filesystem
	VolumeMode string `json:"volumeMode,omitempty"`
	// FsType makes a Filesystem volume an image volume: an image file on
	// the node's data root, formatted with this filesystem at its first
	// stage (the StorageClass parameter csi.storage.k8s.io/fstype). Empty
	// for a directory volume.
	// +kubebuilder:validation:Enum=ext4;xfs
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="fsType is immutable"
	// +optional
	FsType string `json:"fsType,omitempty"`
	// Engine is the storage engine the node used for a Filesystem volume
	// ("dir" or "btrfs"); informational, chosen by the node plugin.
	// +optional
	Engine string `json:"engine,omitempty"`
	// ContentSource, when set, fills the new volume from a snapshot or a
	// volume on the same node.
	// +optional
	ContentSource *ContentSource `json:"contentSource,omitempty"`
	// Parameters are the StorageClass parameters the volume was created
	// with (dirMode, …), without the csi.storage.k8s.io/ ones.
	// +optional
	Parameters map[string]string `json:"parameters,omitempty"`
	// MutableParameters are the mutable parameters (a
	// VolumeAttributesClass's: compression, dirMode) the volume should
	// have; the controller sets them at create and at each
	// ControllerModifyVolume, the node plugin applies them.
	// +optional
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	// CSIName is the CreateVolumeRequest name (the PV name under
	// Kubernetes) the volume was created for.
	CSIName string `json:"csiName"`
	// MoveOf makes this object a move: spec.node pulls volume MoveOf (a
	// LocalVolume on the node spec.contentSource.node names) over the
	// node-to-node channel and holds it under the same volume_id, for the
	// controller to make it the volume's node once it is Ready. Its name is
	// MoveOf + "-move-" + a hash of spec.node.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="moveOf is immutable"
	MoveOf string `json:"moveOf,omitempty"`
	// DeleteData is set by the controller's DeleteVolume: the node plugin
	// then removes the data and deletes this object. Only then is data
	// removed: an object deleted any other way (by hand, with its CRD, by a
	// namespace or etcd restore) leaves the data on the node, which the
	// node plugin re-adopts (re-creates the object) or, while it cannot,
	// reports as orphaned.
	// +optional
	DeleteData bool `json:"deleteData,omitempty"`
}

// LocalVolumeStatus is what the node plugin reports.
type LocalVolumeStatus struct {
	// Phase is Pending, Ready, Failed or Deleting.
	// +optional
	Phase string `json:"phase,omitempty"`
	// Conditions: Ready (True once the data exists; False with a reason
	// and a message a person can act on).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// CapacityBytes is the capacity the node actually provides, in bytes
	// (a quantity).
	// +optional
	CapacityBytes resource.Quantity `json:"capacityBytes,omitzero"`
	// UsedBytes is the space the volume's data occupies, in bytes (a
	// quantity), as last measured by the node plugin.
	// +optional
	UsedBytes resource.Quantity `json:"usedBytes,omitzero"`
	// Path is where the data lives on the node.
	// +optional
	Path string `json:"path,omitempty"`
	// ErrorCode is the gRPC code name (e.g. ResourceExhausted) of a failed
	// create, which the controller returns to the CO.
	// +optional
	ErrorCode ErrorCode `json:"errorCode,omitempty"`
	// MutableParameters are the mutable parameters in effect on the node.
	// +optional
	MutableParameters map[string]string `json:"mutableParameters,omitempty"`
	// ModifyErrorCode is the gRPC code name of the last failed apply of
	// spec.mutableParameters ("" once they are in effect); the Modified
	// condition says why.
	// +optional
	ModifyErrorCode ErrorCode `json:"modifyErrorCode,omitempty"`
	// ObservedGeneration is the spec generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Transfer is the progress of the data coming from another node.
	// +optional
	Transfer *VolumeTransfer `json:"transfer,omitempty"`
}

// LocalVolume is one CSI volume held on one node's local disk. Its name is
// the volume_id.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lv,categories=localdir
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.spec.size`
// +kubebuilder:printcolumn:name="Mode",type=string,JSONPath=`.spec.volumeMode`,priority=1
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="PV",type=string,JSONPath=`.spec.csiName`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LocalVolume struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LocalVolumeSpec   `json:"spec"`
	Status LocalVolumeStatus `json:"status,omitempty"`
}

// LocalVolumeList is a list of LocalVolume.
//
// +kubebuilder:object:root=true
type LocalVolumeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LocalVolume `json:"items"`
}

// LocalSnapshotSpec is the snapshot the controller asks a node to take.
type LocalSnapshotSpec struct {
	// SourceVolume is the volume_id (LocalVolume name) to snapshot.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sourceVolume is immutable"
	SourceVolume string `json:"sourceVolume"`
	// Node is the node id holding the source volume and the snapshot.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
	// CSIName is the CreateSnapshotRequest name ("" for a member of a
	// group snapshot).
	CSIName string `json:"csiName"`
	// GroupSnapshot is the LocalGroupSnapshot (group_snapshot_id) this
	// snapshot was cut in; its node plugin made this object. Such a
	// snapshot is never taken on its own.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="groupSnapshot is immutable"
	GroupSnapshot string `json:"groupSnapshot,omitempty"`
	// DeleteData is set by the controller's DeleteSnapshot: the node
	// plugin then removes the data and deletes this object; see
	// LocalVolumeSpec.DeleteData.
	// +optional
	DeleteData bool `json:"deleteData,omitempty"`
	// Copies is how many nodes should hold the snapshot: this one and
	// Copies-1 others, each with a LocalSnapshot copy of it (the
	// VolumeSnapshotClass parameter copies). 0 or 1: this node only.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="copies is immutable"
	Copies int32 `json:"copies,omitempty"`
	// CopyOf makes this object a copy: spec.node pulls snapshot CopyOf
	// (a LocalSnapshot cut on another node) from that node over the
	// node-to-node channel and holds it under the same snapshot_id. Its
	// name is CopyOf + "-copy-" + a hash of spec.node.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="copyOf is immutable"
	CopyOf string `json:"copyOf,omitempty"`
}

// LocalSnapshotStatus is what the node plugin reports.
type LocalSnapshotStatus struct {
	// ReadyToUse is true once the snapshot can be restored.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`
	// Phase is Pending, Ready, Failed or Deleting.
	// +optional
	Phase string `json:"phase,omitempty"`
	// SizeBytes is the restore size, in bytes (a quantity): the source's
	// capacity when taken.
	// +optional
	SizeBytes resource.Quantity `json:"sizeBytes,omitzero"`
	// CreationTime is when the snapshot was taken.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// Conditions: Ready, with a reason and a message.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ErrorCode is the gRPC code name of a failed snapshot.
	// +optional
	ErrorCode ErrorCode `json:"errorCode,omitempty"`
	// VolumeMode and FsType are the source volume's, which a copy on
	// another node records with its data.
	// +optional
	VolumeMode string `json:"volumeMode,omitempty"`
	// +optional
	FsType string `json:"fsType,omitempty"`
	// Transfer is a copy's progress (spec.copyOf set): the data pulled
	// from the node of the snapshot it copies.
	// +optional
	Transfer *VolumeTransfer `json:"transfer,omitempty"`
}

// LocalSnapshot is one CSI snapshot held on one node. Its name is the
// snapshot_id.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lsnap,categories=localdir
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.sourceVolume`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Copy Of",type=string,JSONPath=`.spec.copyOf`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LocalSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LocalSnapshotSpec   `json:"spec"`
	Status LocalSnapshotStatus `json:"status,omitempty"`
}

// LocalSnapshotList is a list of LocalSnapshot.
//
// +kubebuilder:object:root=true
type LocalSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LocalSnapshot `json:"items"`
}

// LocalGroupSnapshotSpec is the volume group snapshot the controller asks
// a node to cut: one snapshot of each of its volumes at one point in time.
type LocalGroupSnapshotSpec struct {
	// Node is the node id holding every volume of the group.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="node is immutable"
	Node string `json:"node"`
	// CSIName is the CreateVolumeGroupSnapshotRequest name.
	CSIName string `json:"csiName"`
	// Volumes are the source volume_ids (LocalVolume names).
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="volumes are immutable"
	Volumes []string `json:"volumes"`
	// Snapshots are the snapshot_ids of the members, Snapshots[i] the one
	// of Volumes[i]; the node plugin creates a LocalSnapshot of each once
	// the group is cut.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="snapshots are immutable"
	Snapshots []string `json:"snapshots"`
	// Copies is how many nodes should hold each member (the
	// VolumeGroupSnapshotClass parameter copies): the controller keeps
	// Copies-1 copies of every member as of LocalSnapshotSpec.Copies.
	// 0 or 1: this node only.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="copies is immutable"
	Copies int32 `json:"copies,omitempty"`
}

// LocalGroupSnapshotStatus is what the node plugin reports.
type LocalGroupSnapshotStatus struct {
	// ReadyToUse is true once every member is cut and its LocalSnapshot
	// exists.
	// +optional
	ReadyToUse bool `json:"readyToUse,omitempty"`
	// Phase is Pending, Ready or Failed.
	// +optional
	Phase string `json:"phase,omitempty"`
	// CreationTime is when the members were cut.
	// +optional
	CreationTime *metav1.Time `json:"creationTime,omitempty"`
	// Conditions: Ready, with a reason and a message.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	// ErrorCode is the gRPC code name of a failed group snapshot.
	// +optional
	ErrorCode ErrorCode `json:"errorCode,omitempty"`
}

// LocalGroupSnapshot is one CSI volume group snapshot held on one node.
// Its name is the group_snapshot_id; its members are LocalSnapshots whose
// spec.groupSnapshot names it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lgsnap,categories=localdir
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.node`
// +kubebuilder:printcolumn:name="Ready",type=boolean,JSONPath=`.status.readyToUse`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LocalGroupSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   LocalGroupSnapshotSpec   `json:"spec"`
	Status LocalGroupSnapshotStatus `json:"status,omitempty"`
}

// LocalGroupSnapshotList is a list of LocalGroupSnapshot.
//
// +kubebuilder:object:root=true
type LocalGroupSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LocalGroupSnapshot `json:"items"`
}

// OrphanedData is data on a node that no LocalVolume or LocalSnapshot
// claims.
type OrphanedData struct {
	// ID is the volume_id or snapshot_id of the data.
	ID string `json:"id"`
	// Kind is Volume or Snapshot.
	Kind string `json:"kind"`
	// Path is where the data is on the node.
	Path string `json:"path"`
	// SizeBytes is the recorded size, in bytes (a quantity).
	SizeBytes resource.Quantity `json:"sizeBytes"`
}

// LocalNodeStatus is written by a node plugin about its own node.
type LocalNodeStatus struct {
	// Engine is the storage engine of new Filesystem volumes (dir, btrfs).
	Engine string `json:"engine,omitempty"`
	// CapacityBytes is the data root's capacity (--capacity, or its
	// filesystem's size), in bytes (a quantity, as all sizes here).
	// +optional
	CapacityBytes resource.Quantity `json:"capacityBytes,omitzero"`
	// AllocatableBytes is what a new volume can still be guaranteed on
	// this node: min(capacity − allocated, free − headroom), in bytes.
	// +optional
	AllocatableBytes resource.Quantity `json:"allocatableBytes,omitzero"`
	// AllocatedBytes is the sum of the sizes of the volumes the node
	// plugin holds (creates and expansions in progress included).
	// +optional
	AllocatedBytes resource.Quantity `json:"allocatedBytes,omitzero"`
	// HeadroomBytes is what those volumes may still write: the sum of
	// their sizes minus the bytes each uses on its own. Free space less
	// this is what new volumes can have.
	// +optional
	HeadroomBytes resource.Quantity `json:"headroomBytes,omitzero"`
	// FreeBytes is the free space of the data root's filesystem, in bytes.
	// +optional
	FreeBytes resource.Quantity `json:"freeBytes,omitzero"`
	// MaxVolumeBytes is the largest volume the node accepts (0 = no limit).
	// +optional
	MaxVolumeBytes resource.Quantity `json:"maxVolumeBytes,omitzero"`
	// DriverVersion is the node plugin's version.
	DriverVersion string `json:"driverVersion,omitempty"`
	// Heartbeat is when the node plugin last wrote this status.
	Heartbeat metav1.Time `json:"heartbeat,omitempty"`
	// Orphans is data on the node that no object claims (kept, never
	// deleted on its own).
	// +optional
	Orphans []OrphanedData `json:"orphans,omitempty"`
	// Transfer is where the node plugin serves the node-to-node data
	// channel and the certificate it authenticates with (pinned by its
	// peers; docs/security.md). Absent: the node plugin serves no channel.
	// +optional
	Transfer *TransferEndpoint `json:"transfer,omitempty"`
	// RecoveryProblems lists data that the node plugin's start-up recovery
	// found and could not put in order (an interrupted operation's
	// leftover it could not remove or move aside). The data stays where
	// it is and everything else is served; a person decides.
	// +optional
	RecoveryProblems []RecoveryProblem `json:"recoveryProblems,omitempty"`
}

// TransferEndpoint is a node plugin's end of the node-to-node channel.
type TransferEndpoint struct {
	// Address is host:port (--transfer-advertise-address: the node plugin
	// pod's IP and port).
	Address string `json:"address"`
	// Certificate is the PEM certificate of the node plugin's current key.
	Certificate string `json:"certificate"`
}

// RecoveryProblem is one leftover that start-up recovery could not handle.
type RecoveryProblem struct {
	// Path is the data's path on the node.
	Path string `json:"path"`
	// Problem says what recovery tried and why it failed.
	Problem string `json:"problem"`
}

// LocalNode describes one node's localdir storage. Its name is the node
// id; the node plugin creates and updates it.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=lnode,categories=localdir
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Engine",type=string,JSONPath=`.status.engine`
// +kubebuilder:printcolumn:name="Capacity",type=string,JSONPath=`.status.capacityBytes`
// +kubebuilder:printcolumn:name="Allocatable",type=string,JSONPath=`.status.allocatableBytes`
// +kubebuilder:printcolumn:name="Version",type=string,JSONPath=`.status.driverVersion`
// +kubebuilder:printcolumn:name="Heartbeat",type=date,JSONPath=`.status.heartbeat`
type LocalNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Status LocalNodeStatus `json:"status,omitempty"`
}

// LocalNodeList is a list of LocalNode.
//
// +kubebuilder:object:root=true
type LocalNodeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LocalNode `json:"items"`
}

// Deleting says whether the volume is on its way out: a DeleteVolume
// recorded spec.deleteData (the node plugin removes the data, then the
// object), or the object is deleted (by hand, or with its CRD). The CSI
// Controller service no longer lists it.
func (lv *LocalVolume) Deleting() bool {
	return lv.Spec.DeleteData || lv.DeletionTimestamp != nil
}

// Deleting says whether the snapshot is on its way out, as
// LocalVolume.Deleting.
func (ls *LocalSnapshot) Deleting() bool {
	return ls.Spec.DeleteData || ls.DeletionTimestamp != nil
}
