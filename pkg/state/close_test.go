package state

import (
	"errors"
	"path/filepath"
	"sync"
	"testing"

	"github.com/localdir-csi/localdir/pkg/contract"
)

// An Update racing with Close either commits or gets ErrClosed; it never
// panics on the closed queue (the node agent may still reconcile while the
// process shuts down).
func TestUpdateRacingCloseNeverPanics(t *testing.T) {
	for round := 0; round < 20; round++ {
		s, err := Open(filepath.Join(t.TempDir(), FileName))
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for i := 0; i < 16; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := s.Update(func(tx *Tx) error {
					return tx.PutVolume(&contract.Volume{ID: "vol-00000000000000000000000000000001", AccessType: contract.AccessMount, CapacityBytes: 1})
				})
				if err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("Update: %v", err)
				}
			}()
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if err := s.Update(func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
			t.Fatalf("Update after Close: %v, want ErrClosed", err)
		}
		if err := s.View(func(*Tx) error { return nil }); !errors.Is(err, ErrClosed) {
			t.Fatalf("View after Close: %v, want ErrClosed", err)
		}
	}
}
