package ext4

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
	"github.com/localdir-csi/localdir/tests/testfs"
)

// TestSanity: image volumes formatted ext4, the data root on ext4 (dir
// engine; snapshots of the images are copies).
func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{FS: testfs.Ext4, Engine: "dir", FsType: "ext4", MutableParameters: map[string]string{"dirMode": "0750", "readBytesPerSecond": "20Mi"}})
}
