#!/usr/bin/env bash
# make demo: a one-node Kubernetes cluster on this machine with localdir
# (E2E_NODES=3 make demo: three nodes, the first on btrfs, the others XFS)
# installed from deploy/kubernetes, then the examples/ applied one by one
# with what each shows. The cluster stays up afterwards (make demo-down).
# Usage: tests/e2e/demo.sh <e2e-cluster binary>
set -euo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${1:?usage: demo.sh <e2e-cluster binary>}
ROOT=$PWD
export PATH="$ROOT/_output/tools/bin:$PATH"
export KUBECONFIG="$ROOT/_output/e2e/kubeconfig"
[ -n "${E2E_WORK:-}" ] && export KUBECONFIG="$E2E_WORK/kubeconfig"

bold=$'\e[1m' dim=$'\e[2m' off=$'\e[0m'
[ -t 1 ] || bold='' dim='' off=''
step() { printf '\n%s== %s%s\n' "$bold" "$*" "$off"; }
say() { printf '%s\n' "$*"; }
# run shows a command the way a user would type it, then runs it.
run() {
	local shown=() a
	for a in "$@"; do
		if [[ $a =~ [[:space:]\"\{\|\;\$\>] ]]; then shown+=("'$a'"); else shown+=("$a"); fi
	done
	printf '%s$ %s%s\n' "$dim" "${shown[*]}" "$off"
	"$@" 2>&1 | sed 's/^/  /'
}
quiet() { "$@" >/dev/null; }
trap 'echo; echo "The demo stopped on an error. Logs: _output/e2e/logs/. Tear down with: make demo-down" >&2' ERR

if [ "$(id -u)" != 0 ]; then
	echo "make demo runs a kubelet, containerd and mounts: run it as root." >&2
	exit 1
fi

say "${bold}localdir demo${off}: local directories as Kubernetes volumes, on a real cluster of ${E2E_NODES:-1} node(s)"
say "built on this machine (kube-apiserver, controller-manager, scheduler,"
say "kubelet + containerd, the CSI sidecars), localdir installed from deploy/kubernetes."

step "1. Start the cluster (control plane on 127.0.0.1, kubelets on 10.254.0.x; state in _output/e2e)"
"$CLUSTER" up | sed 's/^/  /'

step "2. localdir is installed (kubectl apply -k deploy/kubernetes): its pods, CSIDriver, StorageClass, snapshot class, one LocalNode per node"
run kubectl -n localdir get pods -o wide
say "The controller Deployment and one node plugin per node (DaemonSet), from images built offline."
run kubectl get csidriver,storageclass,volumesnapshotclass
run kubectl get localnodes
say "Each node plugin reports its node's capacity (btrfs data root on localhost: capacity is enforced; XFS on the others)."

step "3. A PVC (examples/pvc.yaml). The class binds WaitForFirstConsumer: Pending until a pod uses it"
run kubectl apply -f examples/pvc.yaml
run kubectl get pvc data

step "4. A pod that writes to the volume and reads it back (examples/pod.yaml)"
run kubectl apply -f examples/pod.yaml
quiet kubectl wait --for=condition=Ready pod/writer --timeout=120s
run kubectl get pvc data
say "Bound: localdir created the volume on the node the scheduler picked."
run kubectl logs writer
run kubectl exec writer -- ls -l /data

step "5. A snapshot of the volume (examples/snapshot.yaml)"
run kubectl apply -f examples/snapshot.yaml
quiet kubectl wait --for=jsonpath='{.status.readyToUse}'=true volumesnapshot/data-snap --timeout=120s
run kubectl get volumesnapshot data-snap

step "6. A new PVC restored from the snapshot, 2Gi from a 1Gi source (examples/restore.yaml)"
run kubectl apply -f examples/restore.yaml
quiet kubectl wait --for=condition=Ready pod/reader-restored --timeout=120s
run kubectl get pvc data-restored
say "The restored volume holds the snapshot's data:"
run kubectl logs reader-restored

step "7. A clone of the PVC (examples/clone.yaml)"
run kubectl apply -f examples/clone.yaml
quiet kubectl wait --for=condition=Ready pod/reader-clone --timeout=120s
run kubectl get pvc data-clone
run kubectl logs reader-clone

step "8. Resize the PVC from 1Gi to 2Gi while the pod uses it (examples/resize.md)"
# The first node ("localhost") has the btrfs data root, where a directory
# volume's size is a quota; on the others (XFS) it is tracked, not enforced.
on_btrfs=$([ "$(kubectl get pod writer -o jsonpath='{.spec.nodeName}')" = localhost ] && echo yes || true)
if [ -n "$on_btrfs" ]; then
	say "Before: writing 1100Mi into the 1Gi volume fails (btrfs quota = the volume's size):"
	run kubectl exec writer -- sh -c 'dd if=/dev/zero of=/data/fill bs=1M count=1100 2>&1 | grep -E "quota|records out"; rm -f /data/fill'
else
	say "The writer runs on $(kubectl get pod writer -o jsonpath='{.spec.nodeName}'), whose data root is XFS: a directory volume's size is tracked there, not enforced (step 10 shows a size that holds on any data root)."
fi
run kubectl patch pvc data -p '{"spec":{"resources":{"requests":{"storage":"2Gi"}}}}'
quiet kubectl wait --for=jsonpath='{.status.capacity.storage}'=2Gi pvc/data --timeout=120s
run kubectl get pvc data
if [ -n "$on_btrfs" ]; then
	say "After: the same write succeeds, in the same running pod:"
	run kubectl exec writer -- sh -c 'dd if=/dev/zero of=/data/fill bs=1M count=1100 2>&1 | grep -E "quota|records out"; rm -f /data/fill'
fi

step "9. A raw block volume (examples/block.yaml) and an ephemeral inline volume (examples/inline.yaml)"
run kubectl apply -f examples/block.yaml -f examples/inline.yaml
quiet kubectl wait --for=condition=Ready pod/block-user pod/scratch --timeout=120s
run kubectl logs block-user
run kubectl exec scratch -- cat /scratch/f

step "10. An image volume (examples/ext4.yaml): a 64Mi ext4 filesystem whose size holds on any data root"
run kubectl apply -f examples/ext4.yaml
quiet kubectl wait --for=condition=Ready pod/ext4-user --timeout=120s
# The pod writes until the filesystem is full: wait for the end of that.
for _ in $(seq 60); do kubectl logs ext4-user | grep -q refused && break; sleep 1; done
say "df in the pod shows the PVC's size (less ext4's own metadata), and a write past it fails:"
run kubectl logs ext4-user

step "11. A VolumeAttributesClass on the running pod's PVC (examples/volumeattributesclass.yaml): its root becomes 0700"
run kubectl apply -f examples/volumeattributesclass.yaml
run kubectl exec writer -- stat -c %a /data
run kubectl patch pvc data -p '{"spec":{"volumeAttributesClassName":"localdir-private"}}'
quiet kubectl wait --for=jsonpath='{.status.currentVolumeAttributesClassName}'=localdir-private pvc/data --timeout=120s
run kubectl exec writer -- stat -c %a /data

step "12. A group snapshot of two image volumes a pod writes in order (examples/volumegroupsnapshot.yaml)"
run kubectl apply -f examples/volumegroupsnapshot.yaml
quiet kubectl wait --for=condition=Ready pod/app --timeout=120s
quiet kubectl wait --for=jsonpath='{.status.readyToUse}'=true volumegroupsnapshot/app-data --timeout=120s
run kubectl get volumegroupsnapshot app-data
run kubectl get volumesnapshot -o custom-columns=NAME:.metadata.name,READY:.status.readyToUse,GROUP:.metadata.ownerReferences[0].name

step "13. What localdir holds: PVs, and its own LocalVolume / LocalSnapshot / LocalGroupSnapshot objects"
run kubectl get pvc,pv
run kubectl get localvolumes,localsnapshots,localgroupsnapshots

step "The cluster keeps running. To use it:"
say "  export PATH=$ROOT/_output/tools/bin:\$PATH"
say "  export KUBECONFIG=$KUBECONFIG"
say "  kubectl get pods,pvc            # the demo's objects, in namespace default"
say "  kubectl delete pod writer && kubectl apply -f examples/pod.yaml && kubectl logs writer"
say "                                  # a new pod finds the data of the first"
say ""
say "Tear it all down (processes, mounts, loop devices; checks that nothing is left):"
say "  make demo-down"
if [ "${E2E_NODES:-1}" = 1 ]; then
	say ""
	say "The same with three nodes (the first on btrfs, the others on XFS; docs/e2e.md):"
	say "  make demo-down && E2E_NODES=3 make demo"
fi
