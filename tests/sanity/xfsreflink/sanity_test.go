package xfsreflink

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
	"github.com/localdir-csi/localdir/tests/testfs"
)

func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{FS: testfs.XFSReflink, Engine: "dir", MutableParameters: map[string]string{"dirMode": "0750"}})
}
