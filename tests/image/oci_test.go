package image

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/localdir-csi/localdir/tests/cluster/clustertest"
	"github.com/localdir-csi/localdir/tests/e2e/harness"
	"github.com/localdir-csi/localdir/tests/testdriver"
)

// TestImageOCIPushesToARegistry: `make image-oci` builds the image without
// Docker; the archive is pushed with skopeo, as docs/install.md says, to a
// real registry (Debian's docker-registry, on loopback), pulled back and
// unpacked: it carries the Dockerfile's user, entrypoint and version label,
// and its root runs the driver and the filesystem tools image volumes need.
func TestImageOCIPushesToARegistry(t *testing.T) {
	testdriver.RequireRoot(t)
	root := clustertest.Root(t)
	for _, tool := range []string{"skopeo", "docker-registry", "umoci"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is missing: run make deps", tool)
		}
	}
	tag, err := harness.DriverImageTag(root)
	if err != nil {
		t.Fatal(err)
	}
	makeTarget(t, root, "image-oci")
	archive := filepath.Join(root, "_output", "image", "localdir-csi-"+tag+".tar")
	if _, err := os.Stat(archive); err != nil {
		t.Fatalf("make image-oci wrote no %s: %v", archive, err)
	}

	addr := startRegistry(t)
	ref := "docker://" + addr + "/localdir/localdir-csi:" + tag
	skopeo(t, "copy", "--dest-tls-verify=false", "oci-archive:"+archive, ref)

	var inspect struct {
		Labels map[string]string
	}
	if err := json.Unmarshal([]byte(skopeo(t, "inspect", "--tls-verify=false", ref)), &inspect); err != nil {
		t.Fatal(err)
	}
	if v := inspect.Labels["org.opencontainers.image.version"]; v != tag {
		t.Errorf("pushed image's version label %q, want %q", v, tag)
	}
	var cfg struct {
		Config struct {
			User       string
			Entrypoint []string
		}
	}
	if err := json.Unmarshal([]byte(skopeo(t, "inspect", "--tls-verify=false", "--config", ref)), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Config.User != "65532:65532" || strings.Join(cfg.Config.Entrypoint, " ") != "/localdir-csi" {
		t.Errorf("pushed image's user %q and entrypoint %q, want the Dockerfile's 65532:65532 and /localdir-csi", cfg.Config.User, cfg.Config.Entrypoint)
	}

	// Pulled back and unpacked, its root runs the driver and mkfs.ext4.
	dir := t.TempDir()
	skopeo(t, "copy", "--src-tls-verify=false", ref, "oci:"+filepath.Join(dir, "layout")+":"+tag)
	bundle := filepath.Join(dir, "bundle")
	if out, err := exec.Command("umoci", "unpack", "--image", filepath.Join(dir, "layout")+":"+tag, bundle).CombinedOutput(); err != nil {
		t.Fatalf("umoci unpack: %v\n%s", err, out)
	}
	rootfs := filepath.Join(bundle, "rootfs")
	for _, argv := range [][]string{{"/localdir-csi", "--help"}, {"/usr/sbin/mkfs.ext4", "-V"}, {"/usr/sbin/mkfs.xfs", "-V"}} {
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs}
		out, err := cmd.CombinedOutput()
		if err != nil && !(argv[1] == "--help" && strings.Contains(string(out), "--mode")) {
			t.Errorf("%v in the pulled image: %v\n%s", argv, err, out)
		}
	}
}

func skopeo(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("skopeo", args...).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("skopeo %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return string(out)
}

// startRegistry runs Debian's docker-registry on a free loopback port with
// its storage in a temporary folder, and returns host:port.
func startRegistry(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yml")
	conf := fmt.Sprintf("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n", filepath.Join(dir, "data"), addr)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(dir, "registry.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	reg := exec.Command("docker-registry", "serve", cfg)
	reg.Stdout, reg.Stderr = log, log
	if err := reg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = reg.Process.Kill()
		_ = reg.Wait()
		log.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("registry log:\n%s", b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("registry on %s did not answer: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
