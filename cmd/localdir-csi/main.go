// Command localdir-csi is the localdir CSI driver: one binary whose --mode
// selects the services it serves (controller, node or all).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/driver"
)

func main() {
	fs := pflag.NewFlagSet("localdir-csi", pflag.ExitOnError)
	var opts driver.Options
	fss := opts.AddFlags(fs)
	showVersion := fss.FlagSet(driver.FlagsAllModes).Bool("version", false, "print the version and exit")
	fs.AddFlagSet(fss.FlagSet(driver.FlagsAllModes))
	addLogFlags(fss.FlagSet("Logging"))
	fs.AddFlagSet(fss.FlagSet("Logging"))
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: localdir-csi [flags]\n\nlocaldir CSI driver %s.\n", driver.Version())
		cliflag.PrintSections(out, *fss, 0)
	}
	_ = fs.Parse(os.Args[1:])
	opts.ApplyModeDefaults(fs)
	if *showVersion {
		fmt.Println(driver.Version())
		return
	}
	if err := opts.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "localdir-csi:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := app.Run(ctx, opts); err != nil {
		klog.ErrorS(err, "Driver stopped with an error")
		klog.Flush()
		os.Exit(1)
	}
	klog.Flush()
}

// addLogFlags adds klog's -v, --vmodule and --logtostderr to fs; -v keeps
// its one-dash form (-v=2), as in every Kubernetes component.
func addLogFlags(fs *pflag.FlagSet) {
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	for _, name := range []string{"v", "vmodule", "logtostderr"} {
		f := pflag.PFlagFromGoFlag(klogFlags.Lookup(name))
		if name == "v" {
			f.Shorthand = "v"
		}
		fs.AddFlag(f)
	}
}
