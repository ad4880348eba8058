package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// buildImages builds the pause and busybox images offline as OCI layouts
// (umoci) and imports them into containerd's k8s.io namespace:
// registry.k8s.io/pause:3.10 holds the static pause binary of
// tests/e2e/images/pause; docker.io/library/busybox:1.35 holds Debian's
// busybox-static with a link per applet in /bin, /etc/passwd and /tmp.
// Pods use them with imagePullPolicy IfNotPresent: nothing is pulled.
func (c *Cluster) buildImages(ctx context.Context) error {
	dir := c.path("images")
	// busybox root: /bin/busybox and its applets, users root and nobody.
	rootfs := filepath.Join(dir, "busybox-rootfs")
	for _, d := range []string{"bin", "etc", "tmp", "root", "home"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		return err
	}
	if err := run(ctx, "install", "-m", "0755", "/bin/busybox", filepath.Join(rootfs, "bin", "busybox")); err != nil {
		return err
	}
	out, err := execOutput(ctx, "/bin/busybox", "--list")
	if err != nil {
		return err
	}
	for _, a := range strings.Fields(out) {
		if a == "busybox" {
			continue
		}
		if err := os.Symlink("busybox", filepath.Join(rootfs, "bin", a)); err != nil {
			return err
		}
	}
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/home:/bin/false\n",
		"etc/group":  "root:x:0:\nnogroup:x:65534:\n",
	} {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), 0o644); err != nil {
			return err
		}
	}
	for _, img := range []struct {
		name, tag, src, dst string
		config              []string
	}{
		{"registry.k8s.io/pause", "3.10", c.tool("pause"), "/pause", []string{"--config.entrypoint=/pause"}},
		{"docker.io/library/busybox", "1.35", rootfs, "/", []string{"--config.cmd=sh", "--config.env=PATH=/bin"}},
	} {
		layout := filepath.Join(dir, filepath.Base(img.name))
		ref := layout + ":" + img.tag
		for _, argv := range [][]string{
			{"umoci", "init", "--layout", layout},
			{"umoci", "new", "--image", ref},
			{"umoci", "insert", "--image", ref, img.src, img.dst},
			append([]string{"umoci", "config", "--image", ref}, img.config...),
			{"tar", "-C", layout, "-cf", layout + ".tar", "."},
		} {
			if err := run(ctx, argv...); err != nil {
				return fmt.Errorf("image %s: %w", img.name, err)
			}
		}
		if _, err := c.NodeOutput(ctx, "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import",
			"--base-name", img.name, layout+".tar"); err != nil {
			return fmt.Errorf("import %s: %w", img.name, err)
		}
	}
	out, err = c.NodeOutput(ctx, "ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "ls", "-q")
	if err != nil {
		return err
	}
	for _, want := range []string{PauseImage, BusyboxImage} {
		if !strings.Contains(out, want) {
			return fmt.Errorf("image %s missing after import; containerd has: %s", want, out)
		}
	}
	return nil
}
