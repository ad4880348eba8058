package cluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/localdir-csi/localdir/pkg/cluster/api/v1alpha1"
	"github.com/localdir-csi/localdir/pkg/contract"
)

// Every gRPC code a node can report maps back to itself, and the error
// carries the node's message.
func TestFailureCodes(t *testing.T) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		err := failure(v1.ErrorCode(c.String()), []metav1.Condition{{Type: v1.ConditionReady, Message: "disk on fire"}}, "volume x")
		st := status.Convert(contract.ToStatus(err))
		if st.Code() != c || contract.Code(err) != c || st.Message() != "volume x: disk on fire" {
			t.Errorf("failure(%s) = %v (%s), want that code with the condition's message", c, st.Code(), st.Message())
		}
	}
	if got := status.Code(contract.ToStatus(failure("Bogus", nil, "volume x"))); got != codes.Internal {
		t.Errorf("unknown code name: %s, want Internal", got)
	}
}

// The CRDs allow in status.errorCode exactly the code names failure reads.
func TestErrorCodeEnum(t *testing.T) {
	for _, crd := range []string{"localvolumes", "localsnapshots"} {
		raw, err := os.ReadFile(filepath.Join("..", "..", "deploy", "kubernetes", "crds", "localdir.csi.dev_"+crd+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		_, enum, _ := strings.Cut(string(raw), "errorCode:")
		enum, _, _ = strings.Cut(enum, "type: string")
		var names []string
		for _, l := range strings.Split(enum, "\n") {
			if n, ok := strings.CutPrefix(strings.TrimSpace(l), "- "); ok {
				names = append(names, n)
			}
		}
		var want []string
		for c := codes.OK; c <= codes.Unauthenticated; c++ {
			want = append(want, c.String())
		}
		if !slices.Equal(names, want) || len(reportedCodes) != len(want) {
			t.Errorf("%s: status.errorCode enum %v, want %v (and %d in reportedCodes)", crd, names, want, len(reportedCodes))
		}
	}
}

// setStatus changes volume id's status after a moment, as a node plugin
// would.
func setStatus(t *testing.T, b *ControllerBackend, id string, f func(*v1.LocalVolume)) {
	go func() {
		time.Sleep(100 * time.Millisecond)
		lv := &v1.LocalVolume{}
		if err := b.c.Get(context.Background(), client.ObjectKey{Name: id}, lv); err != nil {
			t.Error(err)
			return
		}
		f(lv)
		if err := b.c.Update(context.Background(), lv); err != nil {
			t.Error(err)
		}
	}()
}

func TestWaitVolume(t *testing.T) {
	ctx := context.Background()
	b := fakeBackend(t, 0, placed("ready", "a", mi, v1.PhasePending), placed("failed", "a", mi, v1.PhasePending),
		placed("slow", "a", mi, v1.PhasePending), placed("gone", "a", mi, v1.PhasePending))

	setStatus(t, b, VolumeIDFor("ready"), func(lv *v1.LocalVolume) {
		lv.Status.Phase, lv.Status.CapacityBytes = v1.PhaseReady, quantity(2*mi)
	})
	if v, err := b.waitVolume(ctx, VolumeIDFor("ready"), false); err != nil || v.CapacityBytes != 2*mi {
		t.Errorf("waitVolume(ready) = %+v, %v; want 2Mi", v, err)
	}

	setStatus(t, b, VolumeIDFor("failed"), func(lv *v1.LocalVolume) {
		lv.Status.Phase, lv.Status.ErrorCode = v1.PhaseFailed, "ResourceExhausted"
	})
	if _, err := b.waitVolume(ctx, VolumeIDFor("failed"), false); contract.Code(err) != codes.ResourceExhausted {
		t.Errorf("waitVolume(failed) = %v, want the node's RESOURCE_EXHAUSTED", err)
	}
	// The failed attempt is deleted (it holds no data) so a retry starts
	// afresh: with the delete intent, on which the node plugin deletes it.
	lv := &v1.LocalVolume{}
	if err := b.c.Get(ctx, client.ObjectKey{Name: VolumeIDFor("failed")}, lv); err != nil || !lv.Spec.DeleteData {
		t.Errorf("failed LocalVolume after the wait: %+v, %v; want spec.deleteData", lv.ObjectMeta, err)
	}

	b.Wait = 300 * time.Millisecond
	if _, err := b.waitVolume(ctx, VolumeIDFor("slow"), false); contract.Code(err) != codes.DeadlineExceeded {
		t.Errorf("waitVolume(slow) = %v, want DEADLINE_EXCEEDED", err)
	}
	b.Wait = 10 * time.Second

	go func() {
		time.Sleep(100 * time.Millisecond)
		_ = b.c.Delete(ctx, placed("gone", "a", mi, ""))
	}()
	if _, err := b.waitVolume(ctx, VolumeIDFor("gone"), false); !errors.Is(err, contract.ErrBusy) {
		t.Errorf("waitVolume(gone) = %v, want ABORTED", err)
	}
	if _, err := b.waitVolume(ctx, VolumeIDFor("never"), false); !errors.Is(err, contract.ErrBusy) {
		t.Errorf("waitVolume(never created) = %v, want ABORTED", err)
	}
}

func TestWaitExpanded(t *testing.T) {
	b := fakeBackend(t, 0, placed("v", "a", 2*mi, v1.PhaseReady))
	id := VolumeIDFor("v")
	setStatus(t, b, id, func(lv *v1.LocalVolume) {
		lv.Status.ObservedGeneration, lv.Status.ErrorCode = lv.Generation, "DataLoss"
	})
	if _, err := b.waitExpanded(context.Background(), id, 2*mi, 0); contract.Code(err) != codes.DataLoss {
		t.Errorf("waitExpanded on a volume whose data is gone: %v, want DATA_LOSS", err)
	}
	// A later expansion (generation+1): the error above, still in the
	// status, was for an earlier generation and does not end the wait; the
	// node grows the volume a moment after the wait starts.
	lv := &v1.LocalVolume{}
	if err := b.c.Get(context.Background(), client.ObjectKey{Name: id}, lv); err != nil {
		t.Fatal(err)
	}
	setStatus(t, b, id, func(lv *v1.LocalVolume) { lv.Status.CapacityBytes = quantity(3 * mi) })
	if got, err := b.waitExpanded(context.Background(), id, 3*mi, lv.Generation+1); err != nil || got != 3*mi {
		t.Errorf("waitExpanded = %d, %v; want 3Mi", got, err)
	}
}
