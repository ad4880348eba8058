package btrfs

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
	"github.com/localdir-csi/localdir/tests/testfs"
)

func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{FS: testfs.Btrfs, Engine: "btrfs", MutableParameters: map[string]string{"compression": "zstd", "dirMode": "0750"}})
}
