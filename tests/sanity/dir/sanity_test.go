package dir

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
)

func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{Engine: "dir", MutableParameters: map[string]string{"dirMode": "0750"}})
}
