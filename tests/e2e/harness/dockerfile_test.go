package harness

import (
	"os"
	"reflect"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile keeps the image the end-to-end cluster builds offline
// (driverImage) in step with the Dockerfile: the reader finds the build
// command, packages, user and entrypoint, and `make static` builds with the
// same command.
func TestDockerfile(t *testing.T) {
	d, err := readDockerfile("../../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(d.BuildCmd, "CGO_ENABLED=0 go build ") || !strings.HasSuffix(d.BuildCmd, " ./cmd/localdir-csi") {
		t.Errorf("build command %q: want a static go build of ./cmd/localdir-csi", d.BuildCmd)
	}
	if want := []string{d.Copy}; !reflect.DeepEqual(d.Entrypoint, want) {
		t.Errorf("entrypoint %q, want the copied binary %q", d.Entrypoint, want)
	}
	for _, p := range []string{"e2fsprogs", "xfsprogs", "util-linux"} {
		if !contains(d.Packages, p) {
			t.Errorf("packages %q lack %s (mkfs, fsck, resize, blkid for image volumes)", d.Packages, p)
		}
	}
	if d.User != "65532:65532" || d.Base != "debian:bookworm-slim" {
		t.Errorf("user %q base %q, want 65532:65532 on debian:bookworm-slim (driverImage makes that user and copies bookworm's packages)", d.User, d.Base)
	}
	// `make static`: the same command with the Makefile's variables.
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^static:.*\n\t(.*)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no static target")
	}
	static := strings.NewReplacer("$(GO)", "go", "$(IMAGE_TAG)", "${VERSION}", "$(OUT)/static/", "/out/").Replace(string(m[1]))
	if static != d.BuildCmd {
		t.Errorf("make static runs\n  %s\nthe Dockerfile\n  %s", static, d.BuildCmd)
	}
}
