package driver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"google.golang.org/grpc/codes"
)

func TestApplyModeDefaultsKubeletRoot(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"node mode, not given", []string{"--mode=node"}, DefaultKubeletRoot},
		{"node mode, given", []string{"--mode=node", "--kubelet-root=/k"}, "/k"},
		{"node mode, turned off", []string{"--mode=node", "--kubelet-root="}, ""},
		{"all mode, not given", []string{"--mode=all"}, ""},
		{"all mode, given", []string{"--kubelet-root=/k"}, "/k"},
		{"controller mode", []string{"--mode=controller"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var o Options
			fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
			o.AddFlags(fs)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			o.ApplyModeDefaults(fs)
			if o.KubeletRoot != tc.want {
				t.Errorf("KubeletRoot = %q, want %q", o.KubeletRoot, tc.want)
			}
		})
	}
	var o Options
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	o.NodeID, o.DataRoot, o.Endpoint = "n", "/d", "unix:///s.sock"
	o.KubeletRoot = "var/lib/kubelet"
	if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "--kubelet-root") {
		t.Errorf("Validate with a relative --kubelet-root: %v", err)
	}
}

func TestCheckKubeletRoot(t *testing.T) {
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	real := filepath.Join(dir, "real")
	for _, d := range []string{filepath.Join(real, "pods", "p"), filepath.Join(dir, "out")} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(dir, "kubelet")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(dir, "out"), filepath.Join(real, "pods", "esc")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p  string
		ok bool
	}{
		{link + "/pods/p/mount", true},
		{real + "/pods/p/mount", true},
		{link + "/pods/new/deeper/mount", true}, // parents that do not exist yet
		{link + "/pods/esc", true},              // the last component is judged as it is (a symlink: refused later)
		{link + "/pods/esc/mount", false},       // a parent leads out
		{link, false},
		{real, false},
		{dir + "/kubelet-evil/x", false},
		{dir + "/realx/pods", false},
		{dir + "/out/x", false},
		{"/", false},
	} {
		err := checkKubeletRoot("target_path", tc.p, link)
		if (err == nil) != tc.ok {
			t.Errorf("checkKubeletRoot(%q) = %v, want ok=%v", tc.p, err, tc.ok)
		}
		if err != nil {
			wantCode(t, err, codes.InvalidArgument)
			if !strings.Contains(err.Error(), tc.p) || !strings.Contains(err.Error(), link) {
				t.Errorf("message does not name the path and the root: %v", err)
			}
		}
	}
	if err := checkKubeletRoot("target_path", "/anything", ""); err != nil {
		t.Errorf("an empty kubelet root must not check: %v", err)
	}
}
