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

	"k8s.io/klog/v2"

	"github.com/localdir-csi/localdir/pkg/app"
	"github.com/localdir-csi/localdir/pkg/driver"
)

func main() {
	fs := flag.NewFlagSet("localdir-csi", flag.ExitOnError)
	var opts driver.Options
	opts.AddFlags(fs)
	showVersion := fs.Bool("version", false, "[all modes] print the version and exit")
	klogFlags := flag.NewFlagSet("klog", flag.ExitOnError)
	klog.InitFlags(klogFlags)
	klogFlags.VisitAll(func(f *flag.Flag) {
		if f.Name == "v" || f.Name == "vmodule" || f.Name == "logtostderr" {
			f.Usage = "[logging] " + f.Usage
			fs.Var(f.Value, f.Name, f.Usage)
		}
	})
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: localdir-csi [flags]\n\nlocaldir CSI driver %s. Flags (the mode each applies to in brackets):\n\n", driver.Version())
		fs.PrintDefaults()
	}
	_ = fs.Parse(os.Args[1:])
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
