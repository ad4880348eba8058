package volume

// The per-volume lock. Every data operation of the Store, and every node
// operation of pkg/publish (through NodeAccess.Lock and LockWait), on a volume takes
// its id's lock for the whole call, so that any two calls on
// one volume — from the CSI services or from the cluster node agent's
// reconcilers — never run at once: the second fails at once with
// contract.ErrBusy (ABORTED; a reconciler requeues), except Unpublish,
// which waits (bounded by its context) because the CO must be able to
// finish it. Unrelated volumes never wait on each other.
//
// The lock is coarser than the holds (holds.go), which let compatible
// operations overlap (two clones of one volume, a snapshot of a staged
// volume) but keep a delete or an expansion from changing what another
// operation reads; the lock is what gives the CSI "one call per volume at a
// time" answer whoever calls.

// lock takes the per-volume locks of the non-empty keys (volume ids, an
// ephemeral volume's CO id, a snapshot id), all or none; contract.ErrBusy
// when one is taken.
func (m *Store) lock(keys ...string) (func(), error) {
	var ks []string
	for _, k := range keys {
		if k != "" {
			ks = append(ks, k)
		}
	}
	return m.locks.Acquire("volume", ks...)
}
