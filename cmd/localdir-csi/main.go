// Command localdir-csi is the localdir CSI driver: one binary whose --mode
// selects the services it serves (controller, node or all).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
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
	fs.Usage = func() { usage(fs) }
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

// usage prints the flags grouped by the modes they apply to; every flag's
// help starts with its modes in brackets ("[node, all] …").
func usage(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintf(out, "Usage: localdir-csi [flags]\n\nlocaldir CSI driver %s.\n", driver.Version())
	groups := []struct{ tag, title string }{
		{"[all modes]", "All modes"},
		{"[controller, all]", "Controller service (controller and all mode)"},
		{"[controller, node]", "Cluster modes (controller and node)"},
		{"[node, all]", "Node service and data root (node and all mode)"},
		{"[logging]", "Logging"},
	}
	shown := map[string]bool{}
	groups = append(groups, struct{ tag, title string }{"", "Other"})
	for _, g := range groups {
		var lines []string
		fs.VisitAll(func(f *flag.Flag) {
			help, ok := strings.CutPrefix(f.Usage, g.tag+" ")
			if g.tag == "" {
				help, ok = f.Usage, !shown[f.Name]
			}
			if !ok || shown[f.Name] {
				return
			}
			shown[f.Name] = true
			def := ""
			if !strings.Contains(help, "(default") && f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" {
				def = fmt.Sprintf(" (default %q)", f.DefValue)
			}
			lines = append(lines, fmt.Sprintf("  --%s\n      %s%s\n", f.Name, help, def))
		})
		if len(lines) > 0 {
			fmt.Fprintf(out, "\n%s:\n%s", g.title, strings.Join(lines, ""))
		}
	}
}
