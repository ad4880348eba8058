#!/usr/bin/env bash
# make demo-sanity: start localdir in all mode on a throw-away data root and run the
# csi-sanity command-line tool (kubernetes-csi/csi-test) against it, like a
# CO would talk to the driver. Needs root (real bind mounts).
set -euo pipefail
BIN=${1:?driver binary}
SANITY=${2:?csi-sanity binary}
if [[ $EUID -ne 0 ]]; then
	echo "make demo-sanity needs root: the driver makes real bind mounts." >&2
	exit 1
fi
work=$(mktemp -d /tmp/localdir-demo.XXXXXX)
sock="$work/csi.sock"
pid=
cleanup() {
	[[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
	# anything csi-sanity left mounted under the work dir (it should be nothing)
	grep -o " $work[^ ]*" /proc/self/mountinfo | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

echo "== localdir demo: $("$BIN" --version)"
echo "   data root $work/data, endpoint unix://$sock"
"$BIN" --mode=all --endpoint="unix://$sock" --data-root="$work/data" --node-id=demo-node \
	--capacity=4Gi --max-volume-size=2Gi >"$work/driver.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do [[ -S $sock ]] && break; sleep 0.05; done
[[ -S $sock ]] || { echo "driver did not start:"; cat "$work/driver.log"; exit 1; }

echo "== running csi-sanity against it (Identity, Controller and Node services, real bind mounts)"
set +e
"$SANITY" --csi.endpoint="unix://$sock" --csi.mountdir="$work/target" --csi.stagingdir="$work/staging" \
	--csi.testvolumesize=$((64 << 20)) -ginkgo.no-color >"$work/sanity.log" 2>&1
rc=$?
set -e
grep -E "^Ran [0-9]+ of|Passed \|" "$work/sanity.log" | sed 's/^/   /'
if ((rc != 0)); then
	echo "== csi-sanity FAILED; its output:"
	cat "$work/sanity.log"
	exit $rc
fi
echo "   (skipped specs need capabilities all mode does not advertise: controller publish,"
echo "    VolumeAttributesClass, volume mount group, group snapshots — see docs/capabilities.md)"
echo "== driver log: failed RPCs are logged with their gRPC code; the last few lines:"
grep -c "GRPC failed" "$work/driver.log" | sed 's/^/   failed RPCs logged (csi-sanity sends bad input on purpose): /'
left=$(grep -c " $work" /proc/self/mountinfo || true)
echo "== mounts left under the work dir: $left"
echo "== done: csi-sanity passed."
