package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// The images the Kubernetes e2e suite's storage tests run, under the names
// of k8s.io/kubernetes v1.37.2 test/utils/image/manifest.go (built when
// Options.SuiteImages is set; `make e2e-k8s`).
const (
	SuiteBusyboxImage = "registry.k8s.io/e2e-test-images/busybox:1.37.0-2"
	SuiteAgnhostImage = "registry.k8s.io/e2e-test-images/agnhost:2.66.1"
	SuiteNginxImage   = "registry.k8s.io/e2e-test-images/nginx:1.27.0-2"
	SuiteGlibcImage   = "registry.k8s.io/e2e-test-images/glibc-dns-testing:2.1.1"
	SuitePauseImage   = "registry.k8s.io/pause:3.10.2"
)

// image is one image to build: files inserted as layers, then the config.
type image struct {
	ref     string // name:tag
	inserts [][2]string
	config  []string
}

// buildImages builds the pause and busybox images offline as OCI layouts
// (umoci), tarred for Node.importImages to import into each node's containerd
// (k8s.io namespace):
// registry.k8s.io/pause:3.10 holds the static pause binary of
// tests/e2e/images/pause; docker.io/library/busybox:1.35 holds Debian's
// busybox-static with a link per applet in /bin, /etc/passwd and /tmp.
// Pods use them with imagePullPolicy IfNotPresent: nothing is pulled.
//
// With SuiteImages, also the images of the Kubernetes e2e suite, made of
// the same parts: busybox and nginx (the busybox root; nginx serves with
// busybox httpd), agnhost (the busybox root and the agnhost binary built
// from k8s.io/kubernetes/test/images/agnhost, its entrypoint), pause 3.10.2,
// and glibc-dns-testing: the busybox root with the host's GNU dd (the
// suite writes with `dd oflag=nocache`, which busybox lacks) and dash as
// /bin/sh (busybox's shell runs its own dd applet before /bin/dd), with the
// glibc libraries they link.
func (c *Cluster) buildImages(ctx context.Context) error {
	c.imageTars = nil
	dir := c.path("images")
	rootfs := filepath.Join(dir, "busybox-rootfs")
	if err := busyboxRoot(ctx, rootfs); err != nil {
		return err
	}
	images := []image{
		{PauseImage, [][2]string{{c.tool("pause"), "/pause"}}, []string{"--config.entrypoint=/pause"}},
		{BusyboxImage, [][2]string{{rootfs, "/"}}, []string{"--config.cmd=sh", "--config.env=PATH=/bin"}},
	}
	if c.SuiteImages {
		glibc := filepath.Join(dir, "glibc-rootfs")
		if err := glibcRoot(ctx, glibc); err != nil {
			return err
		}
		images = append(images,
			image{SuitePauseImage, [][2]string{{c.tool("pause"), "/pause"}}, []string{"--config.entrypoint=/pause"}},
			image{SuiteBusyboxImage, [][2]string{{rootfs, "/"}}, []string{"--config.cmd=sh", "--config.env=PATH=/bin"}},
			image{SuiteNginxImage, [][2]string{{rootfs, "/"}}, []string{"--config.env=PATH=/bin",
				"--config.cmd=sh", "--config.cmd=-c", "--config.cmd=mkdir -p /www && exec httpd -f -p 80 -h /www"}},
			image{SuiteAgnhostImage, [][2]string{{rootfs, "/"}, {c.tool("agnhost"), "/agnhost"}}, []string{"--config.env=PATH=/bin",
				"--config.entrypoint=/agnhost", "--config.cmd=pause"}},
			image{SuiteGlibcImage, [][2]string{{glibc, "/"}}, []string{"--config.cmd=sh", "--config.env=PATH=/bin"}},
		)
	}
	unsafe := regexp.MustCompile(`[^a-zA-Z0-9.-]+`)
	for _, img := range images {
		i := strings.LastIndex(img.ref, ":")
		name, tag := img.ref[:i], img.ref[i+1:]
		layout := filepath.Join(dir, unsafe.ReplaceAllString(img.ref, "_"))
		ref := layout + ":" + tag
		argvs := [][]string{{"umoci", "init", "--layout", layout}, {"umoci", "new", "--image", ref}}
		for _, in := range img.inserts {
			argvs = append(argvs, []string{"umoci", "insert", "--image", ref, in[0], in[1]})
		}
		argvs = append(argvs, append([]string{"umoci", "config", "--image", ref}, img.config...),
			[]string{"tar", "-C", layout, "-cf", layout + ".tar", "."})
		for _, argv := range argvs {
			if err := run(ctx, argv...); err != nil {
				return fmt.Errorf("image %s: %w", img.ref, err)
			}
		}
		c.imageTars = append(c.imageTars, imageTar{img.ref, name, layout + ".tar"})
	}
	return nil
}

// imageTar is an image built by buildImages: its reference, the name
// ctr's --base-name wants, and the OCI layout's tar.
type imageTar struct{ ref, name, tar string }

// importImages imports the images buildImages made into the node's
// containerd and checks that containerd lists them.
func (n *Node) importImages(ctx context.Context) error {
	ctr := []string{"ctr", "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images"}
	for _, img := range n.c.imageTars {
		if _, err := n.Output(ctx, append(ctr, "import", "--base-name", img.name, img.tar)...); err != nil {
			return fmt.Errorf("import %s: %w", img.ref, err)
		}
	}
	out, err := n.Output(ctx, append(ctr, "ls", "-q")...)
	if err != nil {
		return err
	}
	for _, img := range n.c.imageTars {
		if !strings.Contains(out, img.ref) {
			return fmt.Errorf("image %s missing after import on %s; containerd has: %s", img.ref, n.Name, out)
		}
	}
	return nil
}

// busyboxRoot makes a root with /bin/busybox and its applets, users root
// and nobody.
func busyboxRoot(ctx context.Context, rootfs string) error {
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
	return nil
}

// glibcRoot is a busybox root where /bin/dd is GNU dd and /bin/sh is dash,
// with the shared libraries both link (from ldd).
func glibcRoot(ctx context.Context, rootfs string) error {
	if err := busyboxRoot(ctx, rootfs); err != nil {
		return err
	}
	libs := map[string]bool{}
	for bin, dst := range map[string]string{"/bin/dd": "bin/dd", "/bin/dash": "bin/sh"} {
		if err := os.Remove(filepath.Join(rootfs, dst)); err != nil {
			return err
		}
		if err := run(ctx, "install", "-m", "0755", bin, filepath.Join(rootfs, dst)); err != nil {
			return err
		}
		out, err := execOutput(ctx, "ldd", bin)
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(out) {
			if strings.HasPrefix(f, "/") {
				libs[f] = true
			}
		}
	}
	for lib := range libs {
		// install follows the symlink: the root gets the file itself.
		if err := run(ctx, "install", "-D", "-m", "0755", lib, filepath.Join(rootfs, lib)); err != nil {
			return err
		}
	}
	return nil
}
