package harness

import (
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
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
	deploy, err := c.deployImages(ctx, dir)
	if err != nil {
		return err
	}
	images = append(images, deploy...)
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
	for _, img := range images {
		tar, err := ociArchive(ctx, dir, img)
		if err != nil {
			return err
		}
		c.imageTars = append(c.imageTars, imageTar{img.ref, img.ref[:strings.LastIndex(img.ref, ":")], tar})
	}
	return nil
}

// ociArchive builds img with umoci as an OCI image layout in dir (its
// tag the layout's reference name) and tars it: the archive ctr imports
// and skopeo reads as oci-archive:. It returns the archive's path.
func ociArchive(ctx context.Context, dir string, img image) (string, error) {
	tag := img.ref[strings.LastIndex(img.ref, ":")+1:]
	layout := filepath.Join(dir, regexp.MustCompile(`[^a-zA-Z0-9.-]+`).ReplaceAllString(img.ref, "_"))
	ref := layout + ":" + tag
	argvs := [][]string{{"umoci", "init", "--layout", layout}, {"umoci", "new", "--image", ref}}
	for _, in := range img.inserts {
		argvs = append(argvs, []string{"umoci", "insert", "--image", ref, in[0], in[1]})
	}
	argvs = append(argvs, append([]string{"umoci", "config", "--image", ref}, img.config...),
		[]string{"tar", "-C", layout, "-cf", layout + ".tar", "."})
	for _, argv := range argvs {
		if err := run(ctx, argv...); err != nil {
			return "", fmt.Errorf("image %s: %w", img.ref, err)
		}
	}
	return layout + ".tar", nil
}

// BuildDriverImage builds localdir's image as the Dockerfile of the
// repository at root describes it (driverImage), without Docker, into
// the OCI archive out: the image deploy/kubernetes names, tagged with its
// tag there. work is a scratch folder, emptied first.
func BuildDriverImage(ctx context.Context, root, work, out string) error {
	tag, err := DriverImageTag(root)
	if err != nil {
		return err
	}
	if err := os.RemoveAll(work); err != nil {
		return err
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return err
	}
	img, err := driverImage(ctx, root, filepath.Join(work, "rootfs"), DriverImageName+":"+tag, tag)
	if err != nil {
		return err
	}
	tar, err := ociArchive(ctx, work, img)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.Rename(tar, out)
}

// DriverImageName is the name deploy/ gives localdir's own image.
const DriverImageName = "localdir/localdir-csi"

// DriverImageTag is the tag deploy/kubernetes/kustomization.yaml (in the
// repository at root) gives DriverImageName.
func DriverImageTag(root string) (string, error) {
	images, err := DeployImages(root)
	if err != nil {
		return "", err
	}
	for _, im := range images {
		if im.Name == DriverImageName {
			return im.NewTag, nil
		}
	}
	return "", fmt.Errorf("deploy/kubernetes/kustomization.yaml names no %s image", DriverImageName)
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
	for bin, dst := range map[string]string{"/bin/dd": "bin/dd", "/bin/dash": "bin/sh"} {
		if err := os.Remove(filepath.Join(rootfs, dst)); err != nil {
			return err
		}
		if err := run(ctx, "install", "-m", "0755", bin, filepath.Join(rootfs, dst)); err != nil {
			return err
		}
	}
	return addLibs(ctx, rootfs, "/bin/dd", "/bin/dash")
}

// addLibs copies into rootfs, at the same paths, the shared libraries (and
// the ELF interpreter) the host's binaries bins link, as ldd lists them.
// A static binary has none.
func addLibs(ctx context.Context, rootfs string, bins ...string) error {
	libs := map[string]bool{}
	for _, bin := range bins {
		out, err := exec.CommandContext(ctx, "ldd", bin).Output()
		if err != nil {
			// ldd exits 1 on a static binary ("not a dynamic executable").
			continue
		}
		for _, f := range strings.Fields(string(out)) {
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

// DeployImage is one entry of deploy/kubernetes/kustomization.yaml's
// `images:`: the image name the manifests use and the tag deploy/ pins.
type DeployImage struct {
	Name   string `json:"name"`
	NewTag string `json:"newTag"`
}

// Ref is the reference a container of deploy/ runs: name:tag.
func (i DeployImage) Ref() string { return i.Name + ":" + i.NewTag }

// DeployImages reads the `images:` of deploy/kubernetes/kustomization.yaml
// in the repository at root: the images deploy/ runs, in file order.
func DeployImages(root string) ([]DeployImage, error) {
	b, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Images []DeployImage `json:"images"`
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return nil, fmt.Errorf("kustomization.yaml: %w", err)
	}
	return k.Images, nil
}

// StandInLabel marks the images of test stand-ins (node-driver-registrar,
// livenessprobe): they carry the real images' names so that deploy/ runs
// unchanged, and this label says what they are.
const StandInLabel = "dev.localdir.e2e/stand-in"

// deployImages are the images deploy/kubernetes/kustomization.yaml names
// (`images:`, with their tags), built here so the Deployment and the
// DaemonSet run as they are: localdir's own (driverImage), the CSI sidecars
// from the binaries `make e2e-tools` built out of their modules (entrypoint
// /<name>, as in the real images), and the stand-ins for
// csi-node-driver-registrar, livenessprobe and csi-snapshot-metadata
// (tests/e2e/standins),
// labelled StandInLabel. An image there the harness does not know is an
// error, so a new one cannot go untested.
func (c *Cluster) deployImages(ctx context.Context, dir string) ([]image, error) {
	k, err := DeployImages(c.Root)
	if err != nil {
		return nil, err
	}
	const sigStorage = "registry.k8s.io/sig-storage/"
	var out []image
	for _, im := range k {
		ref := normalizeRef(im.Name) + ":" + im.NewTag
		name := strings.TrimPrefix(im.Name, sigStorage)
		tool, standIn := name, false
		switch {
		case im.Name == DriverImageName:
			img, err := driverImage(ctx, c.Root, filepath.Join(dir, "localdir-rootfs"), ref, im.NewTag)
			if err != nil {
				return nil, err
			}
			out = append(out, img)
			continue
		case name == "csi-node-driver-registrar":
			tool, standIn = "registrar", true
		case name == "livenessprobe":
			standIn = true
		case name == "csi-snapshot-metadata":
			tool, standIn = "snapshot-metadata", true
		case name == "csi-provisioner" || name == "csi-attacher" || name == "csi-resizer" || name == "csi-snapshotter":
		default:
			return nil, fmt.Errorf("deploy/kubernetes/kustomization.yaml names image %s, which the end-to-end cluster cannot build (images.go)", im.Name)
		}
		rootfs := filepath.Join(dir, name+"-rootfs")
		if err := os.MkdirAll(rootfs, 0o755); err != nil {
			return nil, err
		}
		if err := run(ctx, "install", "-m", "0755", c.tool(tool), filepath.Join(rootfs, name)); err != nil {
			return nil, err
		}
		if err := addLibs(ctx, rootfs, c.tool(tool)); err != nil {
			return nil, err
		}
		config := []string{"--config.entrypoint=/" + name}
		if standIn {
			config = append(config, "--config.label="+StandInLabel+"=test stand-in for "+im.Name+", built from tests/e2e/standins/"+tool)
		}
		out = append(out, image{ref, [][2]string{{rootfs, "/"}}, config})
	}
	return out, nil
}

// normalizeRef is the full name the container runtime gives an image
// name: one without a registry host is docker.io's (library/ when it has
// no path).
func normalizeRef(name string) string {
	first, _, found := strings.Cut(name, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return name
	}
	if !found {
		name = "library/" + name
	}
	return "docker.io/" + name
}

// basePackages are the packages of the Dockerfile's base image
// (debian:bookworm-slim) that localdir runs: mount and umount (package
// mount), through k8s.io/mount-utils, and /bin/sh (dash), which the
// packages' shell-script programs (fsck.xfs, xfs_info…) run under.
var basePackages = []string{"mount", "dash"}

// driverImage builds localdir's image as the Dockerfile does, without a
// registry: the binary with the Dockerfile's own build command (its
// ${VERSION} the tag deploy/ names), the files of the Debian packages it
// installs (and of basePackages) copied from this machine, which runs the
// same Debian release (bookworm), with the shared libraries their
// programs link; /etc/passwd with the nonroot user (65532), the
// Dockerfile's USER, LABELs and ENTRYPOINT, and Debian's PATH.
func driverImage(ctx context.Context, root, rootfs, ref, version string) (image, error) {
	d, err := readDockerfile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return image{}, err
	}
	// The packages are copied from this machine: its Debian release must
	// be the base image's.
	osr, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return image{}, err
	}
	if codename := regexp.MustCompile(`(?m)^VERSION_CODENAME=(\S+)$`).FindSubmatch(osr); codename == nil ||
		d.Base != "debian:"+string(codename[1])+"-slim" {
		return image{}, fmt.Errorf("the Dockerfile's base is %s but this machine is not that Debian release (/etc/os-release): its packages cannot stand in for the base's", d.Base)
	}
	for _, dir := range []string{"etc", "tmp", "out"} {
		if err := os.MkdirAll(filepath.Join(rootfs, dir), 0o755); err != nil {
			return image{}, err
		}
	}
	// Debian's merged /usr, as on this machine: /bin, /sbin, /lib, /lib64
	// link to their /usr folders.
	for _, dir := range []string{"/bin", "/sbin", "/lib", "/lib64"} {
		if target, err := os.Readlink(dir); err == nil {
			if err := os.MkdirAll(filepath.Join(rootfs, filepath.Dir(dir), target), 0o755); err != nil {
				return image{}, err
			}
			if err := os.Symlink(target, filepath.Join(rootfs, dir)); err != nil {
				return image{}, err
			}
		}
	}
	// The build command, run in the repository with /out/ (its output
	// folder) under the image's root.
	bin := filepath.Join(rootfs, d.Output)
	cmd := exec.CommandContext(ctx, "sh", "-c", strings.Replace(d.BuildCmd, " -o "+d.Output+" ", " -o '"+bin+"' ", 1))
	cmd.Dir, cmd.Env = root, append(os.Environ(), "VERSION="+version)
	if out, err := cmd.CombinedOutput(); err != nil {
		return image{}, fmt.Errorf("the Dockerfile's build command: %v: %s", err, out)
	}
	if err := os.Rename(bin, filepath.Join(rootfs, d.Copy)); err != nil {
		return image{}, err
	}
	if err := os.RemoveAll(filepath.Join(rootfs, "out")); err != nil {
		return image{}, err
	}
	var elfs []string
	for _, pkg := range append(append([]string{}, basePackages...), d.Packages...) {
		files, err := execOutput(ctx, "dpkg", "-L", pkg)
		if err != nil {
			return image{}, fmt.Errorf("package %s (the Dockerfile installs it; apt-get install %s): %w", pkg, pkg, err)
		}
		for _, f := range strings.Fields(files) {
			if regexp.MustCompile(`^/usr/share/(doc|man|info|locale|lintian|bug)/`).MatchString(f) {
				continue
			}
			isELF, err := copyPackageFile(f, rootfs)
			if err != nil {
				return image{}, fmt.Errorf("package %s: %w", pkg, err)
			}
			if isELF {
				elfs = append(elfs, f)
			}
		}
	}
	if err := addLibs(ctx, rootfs, elfs...); err != nil {
		return image{}, err
	}
	for name, content := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnonroot:x:65532:65532::/nonexistent:/usr/sbin/nologin\n",
		"etc/group":  "root:x:0:\nnonroot:x:65532:\n",
	} {
		if err := os.WriteFile(filepath.Join(rootfs, name), []byte(content), 0o644); err != nil {
			return image{}, err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		return image{}, err
	}
	config := []string{"--config.user=" + d.User, "--config.env=PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, e := range d.Entrypoint {
		config = append(config, "--config.entrypoint="+e)
	}
	for k, v := range d.Labels {
		if k == "org.opencontainers.image.version" {
			v = version
		}
		config = append(config, "--config.label="+k+"="+v)
	}
	return image{ref, [][2]string{{rootfs, "/"}}, config}, nil
}

// copyPackageFile copies a file a package installed (path as dpkg lists
// it) to the same path under rootfs: regular files with their mode,
// symlinks as symlinks, directories skipped. It tells whether the file is
// an ELF program or library (whose libraries addLibs then adds).
func copyPackageFile(path, rootfs string) (bool, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.IsDir() {
		return false, nil // a diverted or removed file, or a directory
	}
	dst := filepath.Join(rootfs, path)
	if _, err := os.Lstat(dst); err == nil {
		return false, nil // a merged-/usr link made already
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return false, err
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		target, err := os.Readlink(path)
		if err != nil {
			return false, err
		}
		return false, os.Symlink(target, dst)
	}
	if !fi.Mode().IsRegular() {
		return false, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	if err := os.WriteFile(dst, b, fi.Mode().Perm()); err != nil {
		return false, err
	}
	f, err := elf.Open(path)
	if err != nil {
		return false, nil
	}
	f.Close()
	return true, nil
}
