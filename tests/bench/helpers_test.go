package bench

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/localdir-csi/localdir/pkg/driver"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// volumeSize is what every benchmark volume asks for: small, so thousands of
// them fit the capacity of any test machine's disk.
const volumeSize = 1 << 20

// rpcTimeout bounds every single call; a hung driver fails the benchmark
// instead of hanging it.
const rpcTimeout = 30 * time.Second

var volumeIDPattern = regexp.MustCompile(`^vol-[0-9a-f]{32}$`)

// startDriver runs a driver in all mode in a fresh temp dir, like the other
// test suites. The data root must be on a real disk: on tmpfs fsync costs
// nothing and the figures would mean nothing, so a tmpfs temp dir fails the
// benchmark (set TMPDIR to a directory on disk).
func startDriver(b *testing.B) *testdriver.Instance {
	b.Helper()
	in := testdriver.Start(b, func(o *driver.Options) {
		o.CapacityBytes = 1 << 40
	})
	var sfs unix.Statfs_t
	if err := unix.Statfs(in.Dir, &sfs); err != nil {
		b.Fatalf("statfs %s: %v", in.Dir, err)
	}
	switch int64(sfs.Type) {
	case unix.TMPFS_MAGIC, unix.RAMFS_MAGIC:
		b.Fatalf("temp dir %s is on tmpfs/ramfs: fsync would cost nothing; set TMPDIR to a directory on disk", in.Dir)
	}
	return in
}

func mountCap() *csi.VolumeCapability {
	return &csi.VolumeCapability{
		AccessType: &csi.VolumeCapability_Mount{Mount: &csi.VolumeCapability_MountVolume{}},
		AccessMode: &csi.VolumeCapability_AccessMode{Mode: csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER},
	}
}

func mountCreateReq(name string) *csi.CreateVolumeRequest {
	return &csi.CreateVolumeRequest{
		Name:               name,
		CapacityRange:      &csi.CapacityRange{RequiredBytes: volumeSize},
		VolumeCapabilities: []*csi.VolumeCapability{mountCap()},
	}
}

func call() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), rpcTimeout)
}

// createVolumeErr creates one volume and checks the answer: a driver-shaped
// volume_id and the requested capacity.
func createVolumeErr(c csi.ControllerClient, name string) (string, error) {
	return createVolumeOf(c, volumeIDPattern, name)
}

// createVolumeOf is createVolumeErr for a driver whose volume_ids match ids.
func createVolumeOf(c csi.ControllerClient, ids *regexp.Regexp, name string) (string, error) {
	ctx, cancel := call()
	defer cancel()
	resp, err := c.CreateVolume(ctx, mountCreateReq(name))
	if err != nil {
		return "", fmt.Errorf("CreateVolume %s: %w", name, err)
	}
	v := resp.GetVolume()
	if !ids.MatchString(v.GetVolumeId()) {
		return "", fmt.Errorf("CreateVolume %s returned volume_id %q", name, v.GetVolumeId())
	}
	if v.GetCapacityBytes() < volumeSize {
		return "", fmt.Errorf("CreateVolume %s returned capacity %d < %d", name, v.GetCapacityBytes(), volumeSize)
	}
	return v.GetVolumeId(), nil
}

func deleteVolumeErr(c csi.ControllerClient, id string) error {
	ctx, cancel := call()
	defer cancel()
	if _, err := c.DeleteVolume(ctx, &csi.DeleteVolumeRequest{VolumeId: id}); err != nil {
		return fmt.Errorf("DeleteVolume %s: %w", id, err)
	}
	return nil
}

// listVolumeIDs pages through ListVolumes and returns every id, failing on
// a duplicate.
func listVolumeIDs(c csi.ControllerClient) (map[string]bool, error) {
	ids := map[string]bool{}
	token := ""
	for {
		ctx, cancel := call()
		resp, err := c.ListVolumes(ctx, &csi.ListVolumesRequest{MaxEntries: 500, StartingToken: token})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("ListVolumes: %w", err)
		}
		for _, e := range resp.GetEntries() {
			id := e.GetVolume().GetVolumeId()
			if ids[id] {
				return nil, fmt.Errorf("ListVolumes returned %s twice", id)
			}
			ids[id] = true
		}
		if token = resp.GetNextToken(); token == "" {
			return ids, nil
		}
	}
}

// expectVolumes fails the benchmark unless ListVolumes shows exactly want
// volumes, all of them in expected when expected is not nil.
func expectVolumes(b *testing.B, c csi.ControllerClient, want int, expected map[string]bool) {
	b.Helper()
	ids, err := listVolumeIDs(c)
	if err != nil {
		b.Fatal(err)
	}
	if len(ids) != want {
		b.Fatalf("ListVolumes shows %d volumes, want %d", len(ids), want)
	}
	for id := range expected {
		if !ids[id] {
			b.Fatalf("ListVolumes does not show volume %s", id)
		}
	}
}

// populate creates n volumes (16 at a time) and returns their ids.
func populate(b *testing.B, c csi.ControllerClient, prefix string, n int) []string {
	b.Helper()
	ids := make([]string, n)
	var next atomic.Int64
	errs := make(chan error, 16)
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				id, err := createVolumeErr(c, fmt.Sprintf("%s-%05d", prefix, i))
				if err != nil {
					errs <- err
					return
				}
				ids[i] = id
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	if d := len(idSet(ids)); d != n {
		b.Fatalf("populate: %d distinct volume ids for %d volumes", d, n)
	}
	return ids
}

// pairStats are the figures of one or more create+delete runs.
type pairStats struct {
	pairs   int
	elapsed time.Duration
	create  []time.Duration
	delete  []time.Duration
}

func (s *pairStats) rate() float64 { return float64(s.pairs) / s.elapsed.Seconds() }

func (s *pairStats) add(o *pairStats) {
	s.pairs += o.pairs
	s.elapsed += o.elapsed
	s.create = append(s.create, o.create...)
	s.delete = append(s.delete, o.delete...)
}

// runPairs makes n CreateVolume+DeleteVolume pairs, spread over conc
// concurrent clients (each takes the next pair when its last one is done),
// and times the whole run. Every create must return a volume id and every
// delete must succeed.
func runPairs(c csi.ControllerClient, prefix string, n, conc int) (*pairStats, error) {
	return runPairsOf(c, volumeIDPattern, prefix, n, conc)
}

// runPairsOf is runPairs for a driver whose volume_ids match ids.
func runPairsOf(c csi.ControllerClient, ids *regexp.Regexp, prefix string, n, conc int) (*pairStats, error) {
	type result struct {
		create, delete time.Duration
		err            error
	}
	results := make([]result, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				r := &results[i]
				t0 := time.Now()
				id, err := createVolumeOf(c, ids, fmt.Sprintf("%s-%05d", prefix, i))
				t1 := time.Now()
				if err != nil {
					r.err = err
					continue
				}
				r.err = deleteVolumeErr(c, id)
				r.create, r.delete = t1.Sub(t0), time.Since(t1)
			}
		}()
	}
	wg.Wait()
	s := &pairStats{pairs: n, elapsed: time.Since(start)}
	var errs []error
	for _, r := range results {
		if r.err != nil {
			errs = append(errs, r.err)
			continue
		}
		s.create = append(s.create, r.create)
		s.delete = append(s.delete, r.delete)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%d of %d pairs failed, first: %w", len(errs), n, errs[0])
	}
	return s, nil
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) in ms.
func percentile(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	rank := int(float64(len(s))*p/100+0.999999) - 1
	rank = max(0, min(rank, len(s)-1))
	return float64(s[rank]) / float64(time.Millisecond)
}

// sameDir reports whether a and b show the same directory (same device and
// inode).
func sameDir(a, b string) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Stat(a, &sa); err != nil {
		return false, err
	}
	if err := unix.Stat(b, &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// mkdirs creates each directory (and its parents) like kubelet does before
// a node call.
func mkdirs(b *testing.B, dirs ...string) {
	b.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o750); err != nil {
			b.Fatal(err)
		}
	}
}

// lexists reports whether lstat of p succeeds.
func lexists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
