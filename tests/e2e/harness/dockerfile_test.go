package harness

import (
	"os"
	"path/filepath"
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

// TestDockerfileUnknownShape: what driverImage would not reproduce is an
// error, not silently skipped; comment lines inside a continued RUN are
// dropped as Docker drops them.
func TestDockerfileUnknownShape(t *testing.T) {
	good := "FROM golang:1 AS build\nRUN CGO_ENABLED=0 go build \\\n# a comment\n -o /out/x ./cmd/x\n" +
		"FROM debian:bookworm-slim\nRUN apt-get install -y e2fsprogs\nCOPY --from=build /out/x /x\nUSER 1:1\nENTRYPOINT [\"/x\"]\n"
	for name, text := range map[string]string{
		"ENV in the final stage": strings.Replace(good, "USER 1:1\n", "USER 1:1\nENV A=b\n", 1),
		"a second RUN":           strings.Replace(good, "USER 1:1\n", "USER 1:1\nRUN true\n", 1),
		"another COPY":           strings.Replace(good, "USER 1:1\n", "USER 1:1\nCOPY etc /etc\n", 1),
		"a third stage":          good + "FROM scratch\n",
	} {
		path := filepath.Join(t.TempDir(), "Dockerfile")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := readDockerfile(path); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
	path := filepath.Join(t.TempDir(), "Dockerfile")
	if err := os.WriteFile(path, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := readDockerfile(path)
	if err != nil {
		t.Fatal(err)
	}
	if d.BuildCmd != "CGO_ENABLED=0 go build -o /out/x ./cmd/x" {
		t.Errorf("build command %q: the comment line was not dropped", d.BuildCmd)
	}
}
