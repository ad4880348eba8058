#!/usr/bin/env bash
# make e2e-k8s: the Kubernetes external storage e2e suite (e2e.test of
# k8s.io/kubernetes v1.37.2, "External Storage [Driver: localdir.csi.dev]")
# against the local cluster of tests/e2e/harness, with
# deploy/kubernetes/test-driver.yaml. Brings the cluster up (with the
# suite's images), runs the suite, writes the report to _output/e2e-k8s/,
# prints ran/passed/failed/skipped, and tears the cluster down, checking
# that nothing is left behind. See docs/e2e.md.
#
# Usage: tests/e2e/k8s-suite.sh <e2e-cluster binary>
# Environment:
#   E2E_K8S_FOCUS   ginkgo focus (default: External.Storage.*localdir.csi.dev)
#   E2E_K8S_SKIP    ginkgo skip (default: the [Disruptive] specs, which
#                   restart the kubelet over SSH, and "any volume data
#                   source", which needs a volume populator image that
#                   cannot be built here). [Serial] specs run, alone, at the end.
#   E2E_K8S_PROCS   parallel ginkgo processes (default 3)
#   E2E_K8S_TIMEOUT whole-suite timeout (default 90m)
#   E2E_NODES       nodes of the cluster (default 2: the multi-node and
#                   topology specs run)
#   E2E_K8S_PIN     set: one pass, with the pinned driver definition (every
#                   volume and test pod on one node; see SOURCE_SPECS), e.g.
#                   to run the group snapshot specs alone on two nodes
set -uo pipefail
cd "$(dirname "$0")/../.."
CLUSTER=${1:?usage: k8s-suite.sh <e2e-cluster binary>}
ROOT=$PWD
TOOLS=$ROOT/_output/tools/bin
REPORT=$ROOT/_output/e2e-k8s
FOCUS=${E2E_K8S_FOCUS:-External.Storage.*localdir.csi.dev}
# The volume-modify specs of raw block volumes run in a pass of their own
# (below): the class the suite copies for them must be an I/O limit, which
# directory volumes refuse, as raw block volumes refuse dirMode
# (INVALID_ARGUMENT by design, docs/parameters.md).
DEFAULT_SKIP='\[Disruptive\]|any volume data source|block volmode\)\] volume-modify'
SKIP=${E2E_K8S_SKIP:-$DEFAULT_SKIP}
PROCS=${E2E_K8S_PROCS:-3}
TIMEOUT=${E2E_K8S_TIMEOUT:-90m}
export PATH="$TOOLS:$PATH"
KUBECONFIG="${E2E_WORK:-$ROOT/_output/e2e}/kubeconfig"
export E2E_NODES=${E2E_NODES:-2}
# The spec that measures statfs after restoring to a larger size runs in
# the ext4 pass: a directory volume's filesystem is the data root's
# (docs/limitations.md), so the other passes skip it.
DIR_SKIP='default fs.*provisioning should provision correct filesystem size when restoring snapshot to larger size pvc'
# The group snapshot specs: their StatefulSet's pods, and so its volumes,
# spread over the nodes, and a group is cut on one node (members on
# different nodes are FAILED_PRECONDITION by design). On several nodes they
# run in a pass whose StorageClass keeps every volume on one node
# (allowedTopologies, as a user pins a class), with every test pod on that
# node too (the suite's ClientNodeName). Restores and clones run unpinned:
# one whose pod the scheduler puts on another node is copied there
# (docs/design.md, node-to-node transfer).
SOURCE_SPECS='VolumeGroupSnapshottable'
PIN_NODE=localhost
# pinned <test driver file> <out file> <class>: the driver definition with
# its StorageClass replaced by <class> (made by make_class on PIN_NODE) and
# every test pod on PIN_NODE.
pinned() {
	python3 - "$1" "$2" "$3" "$PIN_NODE" <<'PY'
import re, sys
src, out, cls, node = sys.argv[1:]
text = open(src).read()
text, n = re.subn(r"(?m)^(StorageClass:\n  FromExistingClassName: )\S+$", r"\g<1>" + cls, text)
if n != 1:
    sys.exit(f"{src}: no StorageClass.FromExistingClassName to replace")
text += f"\n# Added by tests/e2e/k8s-suite.sh: volumes of class {cls} (on node {node} only), every test pod on {node}.\nClientNodeName: {node}\n"
open(out, "w").write(text)
PY
}
# make_class <name> <fstype|""> [<node>]: a class as deploy/kubernetes's
# localdir (WaitForFirstConsumer, expansion, Delete), of image volumes of
# <fstype> if one is given, whose volumes are made on <node> only if one
# is given.
make_class() {
	local topo=""
	[ -n "${3:-}" ] && topo="allowedTopologies:
  - matchLabelExpressions:
      - key: topology.localdir.csi.dev/node
        values: [$3]"
	kubectl --kubeconfig="$KUBECONFIG" apply -f - >/dev/null <<CLASS
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: $1
provisioner: localdir.csi.dev
parameters: {${2:+csi.storage.k8s.io/fstype: $2}}
volumeBindingMode: WaitForFirstConsumer
allowVolumeExpansion: true
reclaimPolicy: Delete
$topo
CLASS
}

if [ "$(id -u)" != 0 ]; then
	echo "make e2e-k8s runs a kubelet, containerd and mounts: run it as root." >&2
	exit 1
fi

rc=0
teardown() {
	echo "== tearing the cluster down"
	"$CLUSTER" down --check || rc=1
	exit $rc
}
trap teardown EXIT
trap 'rc=130; exit' INT TERM

t0=$(date +%s)
echo "== cluster up (with the suite's images)"
if ! "$CLUSTER" up --suite-images; then
	rc=1
	exit
fi

rm -rf "$REPORT"
mkdir -p "$REPORT"

# The VolumeAttributesClass test-driver.yaml names: dirMode, which every
# filesystem volume takes; and one for the raw block pass: an I/O limit.
kubectl --kubeconfig="$KUBECONFIG" apply -f - >/dev/null <<VAC
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata:
  name: localdir-e2e
driverName: localdir.csi.dev
parameters:
  dirMode: "0750"
---
apiVersion: storage.k8s.io/v1
kind: VolumeAttributesClass
metadata:
  name: localdir-e2e-io
driverName: localdir.csi.dev
parameters:
  writeBytesPerSecond: 100Mi
VAC

# suite <report dir> <test driver file> <focus> [<extra skip>]: one run of
# e2e.test, its log and reports in the report dir, and its summary.
suite() {
	local dir=$1 driver=$2 focus=$3 prc=0 skip=$SKIP
	[ -n "${4:-}" ] && skip="$SKIP|$4"
	mkdir -p "$dir"
	echo "== e2e.test: focus '$focus', skip '$skip', $PROCS processes; log in $dir/e2e.log"
	ginkgo --procs="$PROCS" --timeout="$TIMEOUT" --focus="$focus" --skip="$skip" \
		--no-color --output-dir="$dir" --junit-report=junit.xml --json-report=report.json \
		"$TOOLS/e2e.test" -- \
		--kubeconfig="$KUBECONFIG" --provider=local --kubectl-path="$TOOLS/kubectl" \
		--storage.testdriver="$driver" \
		--report-dir="$dir" --node-os-distro=debian >"$dir/e2e.log" 2>&1 || prc=$?
	[ $prc = 0 ] || rc=$prc
	# The summary: ginkgo's own line, then the failed specs by name.
	grep -E '^Ran [0-9]+ of [0-9]+ Specs|^(SUCCESS|FAIL)! .*Passed' "$dir/e2e.log" | tail -2
	python3 - "$dir/report.json" "$focus" "$skip" <<'EOF' | tee "$dir/summary.txt" || true
# Counts over the specs the focus and skip select (ginkgo reports every
# spec of e2e.test; those filtered out are "skipped" too, and not counted).
import json, re, sys
focus, skip = re.compile(sys.argv[2]), re.compile(sys.argv[3])
count = {"passed": 0, "failed": 0, "skipped": 0, "other": 0}
fails = []
for suite in json.load(open(sys.argv[1])):
    for s in suite.get("SpecReports") or []:
        if s.get("LeafNodeType") != "It":
            continue
        text = " ".join((s.get("ContainerHierarchyTexts") or []) + [s.get("LeafNodeText", "")])
        if not focus.search(text) or skip.search(text):
            continue
        state = s.get("State")
        if state in ("failed", "panicked", "timedout", "interrupted", "aborted"):
            count["failed"] += 1
            fails.append(text)
        elif state in count:
            count[state] += 1
        else:
            count["other"] += 1
ran = count["passed"] + count["failed"]
print(f"selected {ran + count['skipped'] + count['other']}: ran {ran}, passed {count['passed']}, "
      f"failed {count['failed']}, skipped {count['skipped']}" + (f", other {count['other']}" if count["other"] else ""))
for f in fails:
    print("  FAILED:", f)
EOF
}

t1=$(date +%s)
if [ -n "${E2E_K8S_PIN:-}" ]; then
	make_class localdir-e2e-pinned "" "$PIN_NODE"
	pinned "$ROOT/deploy/kubernetes/test-driver.yaml" "$REPORT/test-driver-pinned.yaml" localdir-e2e-pinned
	suite "$REPORT" "$REPORT/test-driver-pinned.yaml" "$FOCUS"
elif [ -z "${E2E_K8S_FOCUS:-}" ] && [ "$E2E_NODES" -gt 1 ]; then
	suite "$REPORT" "$ROOT/deploy/kubernetes/test-driver.yaml" "$FOCUS" "$SOURCE_SPECS|$DIR_SKIP"
	make_class localdir-e2e-pinned "" "$PIN_NODE"
	pinned "$ROOT/deploy/kubernetes/test-driver.yaml" "$REPORT/test-driver-pinned.yaml" localdir-e2e-pinned
	suite "$REPORT/pinned" "$REPORT/test-driver-pinned.yaml" "External.Storage.*localdir.csi.dev.*($SOURCE_SPECS)"
elif [ -z "${E2E_K8S_FOCUS:-}" ]; then
	suite "$REPORT" "$ROOT/deploy/kubernetes/test-driver.yaml" "$FOCUS" "$DIR_SKIP"
else
	suite "$REPORT" "$ROOT/deploy/kubernetes/test-driver.yaml" "$FOCUS"
fi
# The suite runs its provisioning specs (among them "correct filesystem size
# when restoring snapshot to larger size pvc") only with the driver's
# default StorageClass, whose volumes are directories: their filesystem is
# the data root's. Run those specs again with an ext4 image-volume class as
# the default (test-driver-ext4.yaml), on every node.
if [ -z "${E2E_K8S_FOCUS:-}" ]; then
	make_class localdir-e2e-ext4 ext4
	suite "$REPORT/ext4" "$ROOT/deploy/kubernetes/test-driver-ext4.yaml" 'External.Storage.*localdir.csi.dev.*default fs.*provisioning'
fi
# The volume-modify specs of raw block volumes, with the I/O limit class.
if [ -z "${E2E_K8S_FOCUS:-}" ] || [[ "$E2E_K8S_FOCUS" == *volume-modify* ]]; then
	sed 's/^  FromExistingClassName: localdir-e2e$/  FromExistingClassName: localdir-e2e-io/' \
		"$ROOT/deploy/kubernetes/test-driver.yaml" >"$REPORT/test-driver-io.yaml"
	saved=$SKIP
	SKIP='\[Disruptive\]|any volume data source'
	suite "$REPORT/block-modify" "$REPORT/test-driver-io.yaml" 'External.Storage.*localdir.csi.dev.*block volmode\)\] volume-modify'
	SKIP=$saved
fi
t2=$(date +%s)
echo "suite $((t2 - t1)) s, with cluster up $((t2 - t0)) s"
