//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/localdir-csi/localdir/tests/e2e/harness"
)

// StorageClasses of the stand-in driver (harness.StartFloor).
const (
	floorImmediate = "floor-immediate"
	floorWFFC      = "floor-wffc"
)

// BenchmarkCluster (make bench-cluster) binds many PVCs at once on the
// local cluster, for localdir and, in the same sitting, for a stand-in
// driver whose CreateVolume answers at once and whose NodePublishVolume
// only makes the target directory (the floor: what the control plane,
// csi-provisioner and the kubelet alone cost). Each run prints (SCALE lines) and
// reports all-Bound, p50 and p99 from the first create, all-PVs-deleted
// from the delete, and the API requests per volume, in all and on the
// localdir objects. Figures: docs/benchmarks.md.
func BenchmarkCluster(b *testing.B) {
	if kc == nil {
		b.Skip("needs the e2e cluster: make bench-cluster")
	}
	if err := cl.StartFloor(context.Background()); err != nil {
		b.Fatal(err)
	}
	floorClasses(b)
	for _, c := range []struct {
		name, class string
		n           int
		pods        bool
	}{
		{"floor/immediate-100", floorImmediate, 100, false},
		{"localdir/immediate-100", scImmediate, 100, false},
		{"floor/immediate-1000", floorImmediate, 1000, false},
		{"localdir/immediate-1000", scImmediate, 1000, false},
		{"floor/wffc-100-pods", floorWFFC, 100, true},
		{"localdir/wffc-100-pods", scWFFC, 100, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			for i := range b.N {
				ns := namespace(b, fmt.Sprintf("bench-%s-%d", strings.ReplaceAll(c.name, "/", "-"), i))
				r := bindMany(b, ns, c.class, c.n, c.pods, nil)
				r.report(b, c.name)
				b.ReportMetric(r.allBound.Seconds(), "bound-s")
				b.ReportMetric(r.p50.Seconds(), "p50-s")
				b.ReportMetric(r.p99.Seconds(), "p99-s")
				b.ReportMetric(r.deleted.Seconds(), "deleted-s")
				b.ReportMetric(r.create.total("")/float64(r.n), "bind-req/vol")
				b.ReportMetric(r.create.total(localdirGroup)/float64(r.n), "bind-localdir-req/vol")
				b.ReportMetric(r.remove.total(localdirGroup)/float64(r.n), "delete-localdir-req/vol")
			}
		})
	}
}

// floorClasses creates the stand-in's StorageClasses and its CSIDriver
// (no attach: it has no attacher).
func floorClasses(tb testing.TB) {
	ctx := context.Background()
	immediate, wffc := storagev1.VolumeBindingImmediate, storagev1.VolumeBindingWaitForFirstConsumer
	del := corev1.PersistentVolumeReclaimDelete
	for _, sc := range []*storagev1.StorageClass{
		{ObjectMeta: metav1.ObjectMeta{Name: floorImmediate}, Provisioner: harness.FloorDriverName, VolumeBindingMode: &immediate, ReclaimPolicy: &del},
		{ObjectMeta: metav1.ObjectMeta{Name: floorWFFC}, Provisioner: harness.FloorDriverName, VolumeBindingMode: &wffc, ReclaimPolicy: &del},
	} {
		if _, err := kc.StorageV1().StorageClasses().Create(ctx, sc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			tb.Fatal(err)
		}
	}
	no := false
	d := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: harness.FloorDriverName}, Spec: storagev1.CSIDriverSpec{AttachRequired: &no}}
	if _, err := kc.StorageV1().CSIDrivers().Create(ctx, d, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		tb.Fatal(err)
	}
}
