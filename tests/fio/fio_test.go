package fio

import "testing"

// Parse takes the figure a job names from fio's JSON, after any notes fio
// prints before it; an error in the job or a second job is refused.
func TestParse(t *testing.T) {
	out := []byte(`note: both iodepth >= 1 and synchronous I/O engine are selected
{"fio version": "fio-3.33", "jobs": [{"jobname": "t", "error": 0,
 "read": {"iops": 10.5, "bw_bytes": 2097152}, "write": {"iops": 4159.4, "bw_bytes": 17036985}}]}`)
	for _, c := range []struct {
		job  Job
		want float64
	}{
		{Job{}, 4159.4},
		{Job{Read: true}, 10.5},
		{Job{Read: true, Bandwidth: true}, 2},
	} {
		if got, err := Parse(out, c.job); err != nil || got != c.want {
			t.Errorf("Parse for %+v = %v, %v; want %v", c.job, got, err, c.want)
		}
	}
	for _, bad := range []string{
		`{"jobs": [{"error": 5, "write": {"iops": 1}}]}`,
		`{"jobs": [{"write": {"iops": 1}}, {"write": {"iops": 2}}]}`,
		`not json`,
	} {
		if _, err := Parse([]byte(bad), Job{}); err == nil {
			t.Errorf("Parse(%s) succeeded, want an error", bad)
		}
	}
}
