// Package fio runs the fio jobs of localdir's I/O benchmarks (Debian's fio,
// JSON output) against a directory or a block device, and measures how much
// a cold sequential read adds to the node's page cache.
package fio

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Job is one fio job: its name in the figures and fio's arguments.
type Job struct {
	Name string
	Args []string
	// Read names the job's figure: read IOPS or bandwidth, not write.
	Read bool
	// Bandwidth: the figure is MiB/s, not IOPS.
	Bandwidth bool
}

// Jobs are the benchmark's jobs, one figure each: 4 KiB random writes with
// an fsync after each at iodepth 1 (a database's commit), 4 KiB random
// O_DIRECT writes and reads at iodepth 16, and 1 MiB sequential O_DIRECT
// writes and reads.
var Jobs = []Job{
	{Name: "fsync-randwrite-4k", Args: []string{"--rw=randwrite", "--bs=4k", "--fsync=1", "--iodepth=1", "--ioengine=psync"}},
	{Name: "direct-randwrite-4k-qd16", Args: []string{"--rw=randwrite", "--bs=4k", "--direct=1", "--iodepth=16", "--ioengine=libaio"}},
	{Name: "direct-randread-4k-qd16", Args: []string{"--rw=randread", "--bs=4k", "--direct=1", "--iodepth=16", "--ioengine=libaio"}, Read: true},
	{Name: "direct-seqwrite-1m", Args: []string{"--rw=write", "--bs=1m", "--direct=1", "--iodepth=4", "--ioengine=libaio"}, Bandwidth: true},
	{Name: "direct-seqread-1m", Args: []string{"--rw=read", "--bs=1m", "--direct=1", "--iodepth=4", "--ioengine=libaio"}, Read: true, Bandwidth: true},
}

// Unit is the figure's unit: "IOPS" or "MiB/s".
func (j Job) Unit() string {
	if j.Bandwidth {
		return "MiB/s"
	}
	return "IOPS"
}

// Check fails when fio is not installed (make deps installs it).
func Check() error {
	if _, err := exec.LookPath("fio"); err != nil {
		return fmt.Errorf("fio is not installed (make deps installs the Debian package fio): %w", err)
	}
	return nil
}

// Run runs job for runtime on target: a file fio.data of size bytes in
// directory target, or the block device target itself. It returns the
// job's figure (IOPS or MiB/s).
func Run(ctx context.Context, job Job, target string, size int64, runtime time.Duration) (float64, error) {
	file, err := fileOf(target)
	if err != nil {
		return 0, err
	}
	args := append([]string{
		"--name=" + job.Name, "--filename=" + file, "--size=" + strconv.FormatInt(size, 10),
		"--runtime=" + strconv.Itoa(int(runtime.Seconds())), "--time_based", "--ramp_time=1",
		"--output-format=json", "--randrepeat=0", "--norandommap", "--end_fsync=1",
	}, job.Args...)
	out, err := exec.CommandContext(ctx, "fio", args...).Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		return 0, fmt.Errorf("fio %s on %s: %w: %s", job.Name, target, err, stderr)
	}
	return Parse(out, job)
}

// Prepare writes the first size bytes of target's fio file (random data,
// synced), so that every job after it finds its blocks allocated and
// written, on every kind of target alike.
func Prepare(ctx context.Context, target string, size int64) error {
	file, err := fileOf(target)
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, "fio", "--name=prepare", "--filename="+file, "--size="+strconv.FormatInt(size, 10),
		"--rw=write", "--bs=1m", "--ioengine=psync", "--end_fsync=1", "--refill_buffers").CombinedOutput()
	if err != nil {
		return fmt.Errorf("fio prepare %s: %w: %s", file, err, out)
	}
	return nil
}

// fileOf is the file fio works on: target if it is a block device, else
// target/fio.data.
func fileOf(target string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return "", err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFBLK {
		return target, nil
	}
	return filepath.Join(target, "fio.data"), nil
}

// Parse reads job's figure from fio's JSON output (one job).
func Parse(out []byte, job Job) (float64, error) {
	var r struct {
		Jobs []struct {
			Error       int `json:"error"`
			Read, Write struct {
				IOPS    float64 `json:"iops"`
				BWBytes float64 `json:"bw_bytes"`
			}
		} `json:"jobs"`
	}
	// fio may print notes before the JSON.
	if i := strings.IndexByte(string(out), '{'); i > 0 {
		out = out[i:]
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("fio output: %w", err)
	}
	if len(r.Jobs) != 1 || r.Jobs[0].Error != 0 {
		return 0, fmt.Errorf("fio output: %d jobs, want one without error: %s", len(r.Jobs), out)
	}
	s := r.Jobs[0].Write
	if job.Read {
		s = r.Jobs[0].Read
	}
	if job.Bandwidth {
		return s.BWBytes / (1 << 20), nil
	}
	return s.IOPS, nil
}

// CacheGrowth drops the clean page cache, reads the first size bytes of
// target (a directory's fio.data, or a block device) once through the page
// cache, and returns how much Cached + Buffers of /proc/meminfo grew per
// byte read: about 1 when the data is cached once, 2 when twice.
func CacheGrowth(target string, size int64) (float64, error) {
	file, err := fileOf(target)
	if err != nil {
		return 0, err
	}
	unix.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0); err != nil {
		return 0, err
	}
	before, err := cached()
	if err != nil {
		return 0, err
	}
	f, err := os.Open(file)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < size {
		k, err := f.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	if n < size {
		return 0, fmt.Errorf("read %d of %d bytes of %s", n, size, file)
	}
	after, err := cached()
	if err != nil {
		return 0, err
	}
	return float64(after-before) / float64(n), nil
}

// cached is Cached + Buffers of /proc/meminfo, in bytes.
func cached() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var total int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && (fields[0] == "Cached:" || fields[0] == "Buffers:") {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0, err
			}
			total += kb << 10
		}
	}
	return total, sc.Err()
}
