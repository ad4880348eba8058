package block

import (
	"testing"

	"github.com/localdir-csi/localdir/tests/sanity"
)

func TestSanity(t *testing.T) {
	sanity.Run(t, sanity.Config{Engine: "auto", Block: true, MutableParameters: map[string]string{"writeBytesPerSecond": "10Mi", "readIOPS": "500"}})
}
