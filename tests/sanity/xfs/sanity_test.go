package xfs

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// TestSanity: image volumes formatted xfs, the data root on XFS with
// reflink (snapshots of the images are reflinks).
func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{FS: testfs.XFSReflink, Engine: "dir", FsType: "xfs", MutableParameters: map[string]string{"dirMode": "0750", "readBytesPerSecond": "20Mi"}})
}
