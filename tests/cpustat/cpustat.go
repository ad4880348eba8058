// Package cpustat reads the CPU time of this machine's processes by name
// (/proc/<pid>/stat, through prometheus/procfs), for the benchmarks that
// report what each process of a run used (tests/e2e BenchmarkCluster,
// tests/cluster/scale BenchmarkAPIWrites).
package cpustat

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/procfs"
)

// Seconds is the CPU time (user + system, in seconds) of this machine's
// processes by name, from /proc/<pid>/stat: the cluster's processes (the
// control plane, the kubelets, the sidecars and localdir run here), kernel
// threads (kworker/… summed as "kworker") and this test. A process that
// exited between two readings loses its share.
type Seconds map[string]float64

// Read reads Seconds now.
func Read(tb testing.TB) Seconds {
	tb.Helper()
	procs, err := procfs.AllProcs()
	if err != nil {
		tb.Fatal(err)
	}
	c := Seconds{}
	for _, p := range procs {
		s, err := p.Stat()
		if err != nil {
			continue // exited meanwhile
		}
		name := s.Comm
		if i := strings.IndexByte(name, '/'); i > 0 {
			name = name[:i] // kworker/u4:1-events_unbound
		}
		if name == "localdir-csi" {
			if args, err := p.CmdLine(); err == nil {
				for _, a := range args {
					if strings.HasPrefix(a, "--mode=") {
						name += " " + strings.TrimPrefix(a, "--mode=")
					}
				}
			}
		}
		c[name] += s.CPUTime()
	}
	return c
}

// Since is the CPU each name used from before to c (names that used less
// than 10 ms are left out).
func (c Seconds) Since(before Seconds) Seconds {
	d := Seconds{}
	for k, v := range c {
		if v-before[k] >= 0.01 {
			d[k] = v - before[k]
		}
	}
	return d
}

// String lists the total and the eight largest users, largest first.
func (c Seconds) String() string {
	names := make([]string, 0, len(c))
	var total float64
	for k, v := range c {
		names = append(names, k)
		total += v
	}
	sort.Slice(names, func(i, j int) bool { return c[names[i]] > c[names[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "%.2f s:", total)
	for i, k := range names {
		if i == 8 {
			break
		}
		fmt.Fprintf(&b, " %s %.2f", k, c[k])
	}
	return b.String()
}
