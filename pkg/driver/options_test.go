package driver

import (
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func validOptions() Options {
	return Options{
		Mode:               ModeAll,
		Endpoint:           "unix:///csi/csi.sock",
		DriverName:         DefaultDriverName,
		NodeID:             "node-1",
		DataRoot:           "/var/lib/localdir",
		DefaultVolumeBytes: gib,
		Engine:             "auto",
		HeartbeatInterval:  30 * time.Second,
		NodeStaleAfter:     3 * time.Minute,
		KubeAPIQPS:         200,
		KubeAPIBurst:       400,
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Options)
		msgPart string // "" = valid
	}{
		{"valid all", nil, ""},
		{"valid node", func(o *Options) { o.Mode = ModeNode }, ""},
		{"valid controller", func(o *Options) { o.Mode = ModeController }, ""},
		{"empty mode", func(o *Options) { o.Mode = "" }, "--mode"},
		{"bad mode", func(o *Options) { o.Mode = "both" }, "--mode"},
		{"mode wrong case", func(o *Options) { o.Mode = "Node" }, "--mode"},
		{"empty endpoint", func(o *Options) { o.Endpoint = "" }, "--endpoint"},
		{"tcp endpoint", func(o *Options) { o.Endpoint = "tcp://127.0.0.1:10000" }, "--endpoint"},
		{"relative unix endpoint", func(o *Options) { o.Endpoint = "unix://csi.sock" }, "--endpoint"},
		{"bare path endpoint", func(o *Options) { o.Endpoint = "/csi/csi.sock" }, "--endpoint"},
		{"unix: single slash", func(o *Options) { o.Endpoint = "unix:/csi/csi.sock" }, "--endpoint"},
		{"empty driver name", func(o *Options) { o.DriverName = "" }, "--driver-name"},
		{"63-char driver name", func(o *Options) { o.DriverName = strings.Repeat("d", 63) }, ""},
		{"64-char driver name", func(o *Options) { o.DriverName = strings.Repeat("d", 64) }, "--driver-name"},
		{"empty node id", func(o *Options) { o.NodeID = "" }, "--node-id"},
		{"node id fqdn", func(o *Options) { o.NodeID = "worker-1.example.com" }, ""},
		{"node id uppercase and underscore", func(o *Options) { o.NodeID = "Node_A1" }, ""},
		{"node id one char", func(o *Options) { o.NodeID = "a" }, ""},
		{"node id 63 chars", func(o *Options) { o.NodeID = strings.Repeat("n", 63) }, ""},
		{"node id 64 chars", func(o *Options) { o.NodeID = strings.Repeat("n", 64) }, "--node-id"},
		{"node id leading dash", func(o *Options) { o.NodeID = "-node" }, "--node-id"},
		{"node id trailing dot", func(o *Options) { o.NodeID = "node." }, "--node-id"},
		{"node id slash", func(o *Options) { o.NodeID = "node/1" }, "--node-id"},
		{"node id space", func(o *Options) { o.NodeID = "node 1" }, "--node-id"},
		{"node id newline", func(o *Options) { o.NodeID = "node1\n" }, "--node-id"},
		{"node id bad in node mode", func(o *Options) { o.Mode = ModeNode; o.NodeID = "a/b" }, "--node-id"},
		{"relative data root", func(o *Options) { o.DataRoot = "var/lib/localdir" }, "--data-root"},
		{"dot data root", func(o *Options) { o.DataRoot = "./data" }, "--data-root"},
		{"empty data root", func(o *Options) { o.DataRoot = "" }, "--data-root"},
		{"host root as data root", func(o *Options) { o.DataRoot = "/" }, "not the root of the host"},
		{"host root as data root, unclean", func(o *Options) { o.DataRoot = "//./" }, "not the root of the host"},
		{"relative data root in node mode", func(o *Options) { o.Mode = ModeNode; o.DataRoot = "data" }, "--data-root"},
		// Controller mode keeps no data and uses no node id of its own.
		{"controller ignores data root", func(o *Options) { o.Mode = ModeController; o.DataRoot = "" }, ""},
		{"engine dir", func(o *Options) { o.Engine = "dir" }, ""},
		{"engine btrfs", func(o *Options) { o.Engine = "btrfs" }, ""},
		{"empty engine", func(o *Options) { o.Engine = "" }, "--engine"},
		{"unknown engine", func(o *Options) { o.Engine = "zfs" }, "--engine"},
		{"engine wrong case", func(o *Options) { o.Engine = "Btrfs" }, "--engine"},
		{"negative capacity", func(o *Options) { o.CapacityBytes = -1 }, "negative"},
		{"negative max volume", func(o *Options) { o.MaxVolumeBytes = -1 }, "negative"},
		{"zero default size", func(o *Options) { o.DefaultVolumeBytes = 0 }, "--default-volume-size"},
		{"negative default size", func(o *Options) { o.DefaultVolumeBytes = -4096 }, "--default-volume-size"},
		{"negative volumes per node", func(o *Options) { o.MaxVolumesPerNode = -1 }, "negative"},
		{"zero API rate in node mode", func(o *Options) { o.Mode = ModeNode; o.KubeAPIQPS = 0 }, "--kube-api-qps"},
		{"zero API burst in controller mode", func(o *Options) { o.Mode = ModeController; o.KubeAPIBurst = 0 }, "--kube-api-burst"},
		{"all mode has no API client", func(o *Options) { o.KubeAPIQPS, o.KubeAPIBurst = 0, 0 }, ""},
		{"zero heartbeat in node mode", func(o *Options) { o.Mode = ModeNode; o.HeartbeatInterval = 0 }, "--heartbeat-interval"},
		{"sub-second staleness in controller mode", func(o *Options) { o.Mode = ModeController; o.NodeStaleAfter = time.Millisecond }, "--node-stale-after"},
		{"all mode has no heartbeat", func(o *Options) { o.HeartbeatInterval, o.NodeStaleAfter = 0, 0 }, ""},
		{"zero limits are fine", func(o *Options) { o.CapacityBytes, o.MaxVolumeBytes, o.MaxVolumesPerNode = 0, 0, 0 }, ""},
		// All mode serves /metrics over plain HTTP: loopback only. The
		// cluster modes serve HTTPS to tokens the API server allows.
		{"all mode metrics on 127.0.0.1", func(o *Options) { o.MetricsAddress = "127.0.0.1:9810" }, ""},
		{"all mode metrics on ::1", func(o *Options) { o.MetricsAddress = "[::1]:9810" }, ""},
		{"all mode metrics on localhost", func(o *Options) { o.MetricsAddress = "localhost:9810" }, ""},
		{"all mode metrics on every address", func(o *Options) { o.MetricsAddress = ":9810" }, "only on a loopback address"},
		{"all mode metrics on 0.0.0.0", func(o *Options) { o.MetricsAddress = "0.0.0.0:9810" }, "only on a loopback address"},
		{"all mode metrics on a LAN address", func(o *Options) { o.MetricsAddress = "192.168.1.5:9810" }, "only on a loopback address"},
		{"controller metrics on every address", func(o *Options) { o.Mode = ModeController; o.MetricsAddress = ":9810" }, ""},
		{"node metrics on every address", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = ":9810" }, ""},
		{"metrics address without a port", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = "9810" }, "must be host:port"},
		{"metrics port 0", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = ":0" }, "from 1 to 65535"},
		{"metrics port too large", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = ":65536" }, "from 1 to 65535"},
		{"metrics port by name", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = ":http" }, "from 1 to 65535"},
		{"metrics cert dir in node mode", func(o *Options) { o.Mode = ModeNode; o.MetricsAddress = ":9810"; o.MetricsCertDir = "/certs" }, ""},
		{"metrics cert dir in all mode", func(o *Options) { o.MetricsAddress = "127.0.0.1:9810"; o.MetricsCertDir = "/certs" }, "--metrics-cert-dir"},
		{"metrics cert dir without address", func(o *Options) { o.Mode = ModeController; o.MetricsCertDir = "/certs" }, "set --metrics-address too"},
		{"relative metrics cert dir", func(o *Options) { o.Mode = ModeController; o.MetricsAddress = ":9810"; o.MetricsCertDir = "certs" }, "absolute path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := validOptions()
			if tc.mod != nil {
				tc.mod(&o)
			}
			err := o.Validate()
			if tc.msgPart == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.msgPart) {
				t.Fatalf("Validate() = %v, want an error mentioning %q", err, tc.msgPart)
			}
		})
	}
}

func TestParseEndpoint(t *testing.T) {
	p, err := ParseEndpoint("unix:///run/csi/csi.sock")
	if err != nil || p != "/run/csi/csi.sock" {
		t.Fatalf("ParseEndpoint = %q, %v", p, err)
	}
	for _, ep := range []string{"", "unix://", "unix://x.sock", "tcp:///x.sock", "UNIX:///x.sock", " unix:///x.sock"} {
		if _, err := ParseEndpoint(ep); err == nil {
			t.Errorf("ParseEndpoint(%q) accepted", ep)
		}
	}
}

func TestParseBytes(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"1Gi", gib, true},
		{"100Mi", 100 * mib, true},
		{"1073741824", gib, true},
		{"0", 0, true},
		{"1", 1, true},
		{"1G", 1_000_000_000, true},
		{"500M", 500_000_000, true},
		{"4Ki", 4096, true},
		{"1.5Ki", 1536, true},
		{"1e3", 1000, true},
		{" 1Gi ", gib, true},
		{"\t2Mi\n", 2 * mib, true},
		{"0.5", 1, true}, // fractions round up to a whole byte
		{"1m", 1, true},  // one milli-byte is still a byte
		{"9223372036854775807", math.MaxInt64, true},
		{"7Ei", 7 << 60, true},
		{"-1", 0, false},
		{"-1Gi", 0, false},
		{"-0.5", 0, false},
		{"-1e30", 0, false},
		{"abc", 0, false},
		{"", 0, false},
		{"1 Gi", 0, false},
		{"1gi", 0, false},
		{"0x10", 0, false},
		{"1GiB", 0, false},
		// Too large for an int64: never silently 0 or negative.
		{"9223372036854775808", 0, false},
		{"18446744073709551616", 0, false},
		// resource.ParseQuantity itself saturates binary-suffix overflows
		// at MaxInt64 (there is no way to tell them apart afterwards).
		{"8Ei", math.MaxInt64, true},
		{"100Ei", math.MaxInt64, true},
		{"1e19", 0, false},
		{"10E", 0, false},
		{"1e30", 0, false},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseBytes(tc.in)
			if tc.ok {
				if err != nil || got != tc.want {
					t.Fatalf("ParseBytes(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
				}
				return
			}
			if err == nil {
				t.Fatalf("ParseBytes(%q) = %d, want an error", tc.in, got)
			}
			if !strings.Contains(err.Error(), tc.in) && tc.in != "" {
				t.Fatalf("error %q does not quote the input", err)
			}
		})
	}
}

func TestAddFlags(t *testing.T) {
	var o Options
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	o.AddFlags(fs)
	if err := fs.Parse([]string{"--capacity=100Gi", "--max-volume-size=10Gi", "--default-volume-size=512Mi", "--node-id=n1", "--data-root=/data"}); err != nil {
		t.Fatal(err)
	}
	if o.CapacityBytes != 100*gib || o.MaxVolumeBytes != 10*gib || o.DefaultVolumeBytes != 512*mib {
		t.Fatalf("sizes = %d %d %d", o.CapacityBytes, o.MaxVolumeBytes, o.DefaultVolumeBytes)
	}
	if err := o.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	if o.HeartbeatInterval != 30*time.Second || o.NodeStaleAfter != 3*time.Minute {
		t.Fatalf("--heartbeat-interval %s, --node-stale-after %s: want the defaults 30s and 3m", o.HeartbeatInterval, o.NodeStaleAfter)
	}
	if got := fs.Lookup("capacity").Value.String(); got != "100Gi" {
		t.Fatalf("capacity flag String() = %q", got)
	}
	if err := fs.Parse([]string{"--capacity=-1"}); err == nil {
		t.Fatal("negative --capacity accepted")
	}
	if err := fs.Parse([]string{"--max-volume-size=1e30"}); err == nil {
		t.Fatal("overflowing --max-volume-size accepted")
	}
}
