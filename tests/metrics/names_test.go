package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/localdir-csi/localdir/pkg/app"
	lm "github.com/localdir-csi/localdir/pkg/metrics"
)

// exportedNames lists every series name the registry can produce,
// histograms with their _bucket/_sum/_count forms.
func exportedNames(t *testing.T) []string {
	t.Helper()
	_ = lm.RegisterState(func() []lm.Sample { return nil })
	_ = app.NodeMetrics
	ch := make(chan *prometheus.Desc, 256)
	go func() { lm.Registry.Describe(ch); close(ch) }()
	var out []string
	for d := range ch {
		name := descName(d.String())
		out = append(out, name, name+"_bucket", name+"_sum", name+"_count")
	}
	return out
}

// descName extracts fqName from a Desc's String(): Desc{fqName: "x", ...}.
func descName(s string) string {
	const k = `fqName: "`
	i := len(k)
	for j := 0; j+len(k) <= len(s); j++ {
		if s[j:j+len(k)] == k {
			rest := s[j+i:]
			for e := 0; e < len(rest); e++ {
				if rest[e] == '"' {
					return rest[:e]
				}
			}
		}
	}
	return ""
}
