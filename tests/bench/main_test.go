package bench

import (
	"flag"
	"io"
	"os"
	"testing"

	"k8s.io/klog/v2"
)

// TestMain keeps the driver's info logs ("Serving CSI", one per benchmark)
// out of the benchmark output; errors still go to stderr.
func TestMain(m *testing.M) {
	fs := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(fs)
	_ = fs.Set("logtostderr", "false")
	_ = fs.Set("stderrthreshold", "ERROR")
	klog.SetOutput(io.Discard)
	os.Exit(m.Run())
}
