// Package metrics checks the Prometheus metrics an all-mode driver serves
// on --metrics-address, and that the Grafana dashboard in deploy/grafana
// only queries metrics the driver exports.
package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

func freePort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// scrape returns every sample as "name{labels}" → value.
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			out[name+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

var mnt = []*csi.VolumeCapability{{
	AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
	AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
}}

func TestMetricsMoveWithVolumes(t *testing.T) {
	testdriver.RequireRoot(t)
	dir := testdriver.TempDir(t)
	o := testdriver.DefaultOptions(dir)
	o.CapacityBytes = 100 << 20
	o.MaxVolumeBytes = 50 << 20
	o.MetricsAddress = freePort(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("driver: %v", err)
		}
	})
	var before map[string]float64
	for deadline := time.Now().Add(10 * time.Second); ; {
		if _, err := http.Get("http://" + o.MetricsAddress + "/metrics"); err == nil {
			before = scrape(t, o.MetricsAddress)
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("metrics endpoint did not come up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	node := `node="test-node"`
	if before["localdir_capacity_bytes{"+node+"}"] != 100<<20 || before["localdir_allocatable_bytes{"+node+"}"] != 100<<20 {
		t.Fatalf("capacity series at start: %v %v", before["localdir_capacity_bytes{"+node+"}"], before["localdir_allocatable_bytes{"+node+"}"])
	}
	conn, err := grpc.NewClient(o.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cc := csi.NewControllerClient(conn)
	var resp *csi.CreateVolumeResponse
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err = cc.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "m1", VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 30 << 20}})
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	// One that fails: above --max-volume-size.
	if _, err := cc.CreateVolume(context.Background(), &csi.CreateVolumeRequest{Name: "m2", VolumeCapabilities: mnt, CapacityRange: &csi.CapacityRange{RequiredBytes: 60 << 20}}); err == nil {
		t.Fatal("60Mi above the 50Mi maximum was accepted")
	}
	after := scrape(t, o.MetricsAddress)
	checks := []struct {
		key   string
		delta float64
	}{
		{`localdir_rpc_requests_total{code="OK",method="CreateVolume"}`, 1},
		{`localdir_rpc_requests_total{code="OutOfRange",method="CreateVolume"}`, 1},
		{`localdir_rpc_duration_seconds{method="CreateVolume"}`, 2},
		{"localdir_allocatable_bytes{" + node + "}", -30 << 20},
		{"localdir_allocated_bytes{" + node + "}", 30 << 20},
		{`localdir_volumes{node="test-node",phase="Ready"}`, 1},
	}
	for _, c := range checks {
		if got := after[c.key] - before[c.key]; got != c.delta {
			t.Errorf("%s moved by %v, want %v", c.key, got, c.delta)
		}
	}
	if _, err := cc.DeleteVolume(context.Background(), &csi.DeleteVolumeRequest{VolumeId: resp.GetVolume().GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	if got := scrape(t, o.MetricsAddress)["localdir_allocatable_bytes{"+node+"}"]; got != 100<<20 {
		t.Errorf("allocatable after delete = %v", got)
	}
}

// metricRef finds localdir_* metric names in a PromQL expression.
var metricRef = regexp.MustCompile(`\blocaldir_[a-z_]+`)

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(clustertest.Root(t), "deploy", "grafana", "localdir-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	// The Grafana dashboard model: a title, a uid and panels with targets.
	var dash struct {
		Title         string `json:"title"`
		UID           string `json:"uid"`
		SchemaVersion int    `json:"schemaVersion"`
		Panels        []struct {
			Title   string             `json:"title"`
			Type    string             `json:"type"`
			GridPos struct{ W, H int } `json:"gridPos"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || dash.SchemaVersion == 0 || len(dash.Panels) == 0 {
		t.Fatalf("not a dashboard model: %+v", dash)
	}
	exported := map[string]bool{}
	for _, n := range exportedNames(t) {
		exported[n] = true
	}
	queries := 0
	for _, p := range dash.Panels {
		if p.Title == "" || p.Type == "" || p.GridPos.W == 0 || p.GridPos.H == 0 || len(p.Targets) == 0 {
			t.Errorf("panel %q is incomplete", p.Title)
		}
		for _, tg := range p.Targets {
			refs := metricRef.FindAllString(tg.Expr, -1)
			if len(refs) == 0 {
				t.Errorf("panel %q query %q names no localdir metric", p.Title, tg.Expr)
			}
			for _, r := range refs {
				queries++
				if !exported[r] {
					t.Errorf("panel %q queries %s, which the driver does not export", p.Title, r)
				}
			}
		}
	}
	if queries < 10 {
		t.Errorf("only %d metric references in the dashboard", queries)
	}
}
