package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// hostParts names the host-wide objects a cluster run makes: the bridges
// (network links named linkPrefix*), the nftables table and the cgroup
// tree cgroupRoot in every v1 hierarchy. Unlike the work folder, they
// are the same for every checkout, so a run killed in one checkout (its
// work folder unknown to the next run) leaves them for a run in another.
type hostParts struct {
	linkPrefix string
	table      string
	cgroupRoot string
	// ports are the control plane's fixed TCP ports on 127.0.0.1.
	ports []int
}

// clusterHost is what every end-to-end cluster makes on the host.
var clusterHost = hostParts{
	linkPrefix: "ldir-e2e",
	table:      apiServiceTable,
	cgroupRoot: CgroupRoot,
	ports:      []int{EtcdPort, etcdPeerPort, APIServerPort, kcmPort, schedulerPort, snapshotCtlPort},
}

// links are the network links the cluster makes: the nodes' bridge and
// each node's pod bridge.
func (h hostParts) links() []string {
	ls, _ := filepath.Glob("/sys/class/net/" + h.linkPrefix + "*")
	var out []string
	for _, l := range ls {
		out = append(out, filepath.Base(l))
	}
	return out
}

// hasTable tells whether the nftables table (ip family) exists.
func (h hostParts) hasTable() bool {
	return exec.Command("nft", "list", "table", "ip", h.table).Run() == nil
}

// cgroups are the cgroupRoot trees, one per v1 hierarchy.
func (h hostParts) cgroups() []string {
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/" + h.cgroupRoot)
	return cg
}

// left describes each of the parts that exists, one line each.
func (h hostParts) left() []string {
	var out []string
	for _, l := range h.links() {
		out = append(out, "network link "+l)
	}
	if h.hasTable() {
		out = append(out, "nftables table ip "+h.table)
	}
	if cg := h.cgroups(); len(cg) > 0 {
		out = append(out, "cgroups "+strings.Join(cg, " "))
	}
	return out
}

// inUse lists why the parts may belong to a live cluster: a control
// plane port taken, a process in the cgroup tree, an interface attached
// to a bridge (a node's or a pod's network namespace still there).
func (h hostParts) inUse() []string {
	out := h.takenPorts()
	if pids := procsIn("", "/"+h.cgroupRoot+"/"); len(pids) > 0 {
		out = append(out, fmt.Sprintf("processes %v run in its cgroups", pids))
	}
	for _, l := range h.links() {
		if ifs, _ := os.ReadDir(filepath.Join("/sys/class/net", l, "brif")); len(ifs) > 0 {
			out = append(out, fmt.Sprintf("bridge %s has %d interface(s)", l, len(ifs)))
		}
	}
	return out
}

// takenPorts describes each control plane port that cannot be listened
// on, with the error.
func (h hostParts) takenPorts() []string {
	var out []string
	for _, port := range h.ports {
		if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
			out = append(out, fmt.Sprintf("port 127.0.0.1:%d is taken: %v", port, err))
		} else {
			l.Close()
		}
	}
	return out
}

// remove deletes the bridges, the table and the cgroup trees (deepest
// first; a cgroup goes once it has no process and no child).
func (h hostParts) remove() error {
	errs := []error{rmCgroups(h.cgroups())}
	for _, l := range h.links() {
		// A bridge may go by itself once its last port went.
		if err := run(context.Background(), "ip", "link", "delete", l); err != nil && contains(h.links(), l) {
			errs = append(errs, err)
		}
	}
	if h.hasTable() {
		errs = append(errs, run(context.Background(), "nft", "delete", "table", "ip", h.table))
	}
	return errors.Join(errs...)
}

// reclaim removes the parts a dead run left, or fails, naming both what
// is there and why it looks alive, when a cluster may still run.
func (h hostParts) reclaim(logf func(string, ...any)) error {
	left := h.left()
	if len(left) == 0 {
		return nil
	}
	if why := h.inUse(); len(why) > 0 {
		return fmt.Errorf("another cluster may be running (`make demo-down` in the checkout that started it stops it): %s; %s",
			strings.Join(left, ", "), strings.Join(why, ", "))
	}
	logf("· removing what a run that no longer runs left on the host: %s", strings.Join(left, ", "))
	return h.remove()
}
