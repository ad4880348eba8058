package unprivileged

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
)

// csi-sanity as any user (make unit): the Node service over mount.Fake, the
// dir engine on a temporary directory.
func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{Engine: "dir", Unprivileged: true, MutableParameters: map[string]string{"dirMode": "0750"}})
}
