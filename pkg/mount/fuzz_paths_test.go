package mount

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	mountutils "k8s.io/mount-utils"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// FuzzCheckOutside: a staging or target path CheckOutside accepts neither
// lies in the data root nor contains it, whatever its dots, slashes and
// symlinks (the fuzz tree holds symlinks into and around the data root).
func FuzzCheckOutside(f *testing.F) {
	dir, err := filepath.EvalSymlinks(f.TempDir())
	if err != nil {
		f.Fatal(err)
	}
	// A data root as pkg/volume lays it out (volumes/<id>).
	root := filepath.Join(dir, "data")
	kubelet := filepath.Join(dir, "kubelet")
	for _, d := range []string{filepath.Join(kubelet, "pods", "p1"), filepath.Join(dir, "data", "volumes", "vol-0123456789abcdef0123456789abcdef")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			f.Fatal(err)
		}
	}
	for link, target := range map[string]string{
		filepath.Join(kubelet, "pods", "to-root"):    filepath.Join(dir, "data"),
		filepath.Join(kubelet, "pods", "to-volumes"): "../../data/volumes",
		filepath.Join(kubelet, "pods", "to-parent"):  dir,
		filepath.Join(kubelet, "pods", "loop"):       "loop",
	} {
		if err := os.Symlink(target, link); err != nil {
			f.Fatal(err)
		}
	}
	for _, s := range []string{
		kubelet + "/pods/p1/mount", kubelet + "/pods/to-root/x", kubelet + "/pods/to-volumes/vol-0123456789abcdef0123456789abcdef/x",
		kubelet + "/pods/to-parent", kubelet + "/pods/to-parent/data", kubelet + "/pods/loop/x", dir, dir + "/data", dir + "/data/state.db",
		dir + "/../" + filepath.Base(dir) + "/data/x", "/", "/proc/self/root" + dir + "/data/x", kubelet + "/pods/to-root",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if !filepath.IsAbs(p) || strings.ContainsRune(p, 0) || len(p) > 4000 {
			return // refused before (pkg/driver checkNodePath)
		}
		err := CheckOutside(root, "target_path", p)
		if err != nil {
			if !errors.Is(err, contract.ErrInvalid) {
				t.Fatalf("CheckOutside(%q) = %v, want contract.ErrInvalid", p, err)
			}
			return
		}
		// Accepted: resolve the parent the way the kernel will walk it.
		parent, perr := filepath.EvalSymlinks(filepath.Dir(filepath.Clean(p)))
		if perr != nil {
			return // the parent does not exist: nothing can be made there
		}
		rp := filepath.Join(parent, filepath.Base(p))
		if mountutils.PathWithinBase(rp, root) || mountutils.PathWithinBase(root, rp) {
			t.Fatalf("CheckOutside accepted %q, which resolves to %q, in or above the data root %s", p, rp, root)
		}
	})
}
