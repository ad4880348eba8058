package volume

// The per-volume lock: every data operation of the Store and node operation
// of pkg/publish holds its volume's lock for the whole call, so two calls on
// one volume never run at once: the second fails with contract.ErrBusy (a
// reconciler requeues), except teardowns, which wait (LockWait). The holds
// (holds.go) are finer, letting compatible operations overlap.

// lock takes the locks of the non-empty keys, all or none; contract.ErrBusy
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

// lockChange takes the per-volume locks of keys, then the exclusive hold of
// keys[0] for what (a create, a delete, an expansion): contract.ErrBusy
// when either is taken. The returned func releases both.
func (m *Store) lockChange(what string, keys ...string) (func(), error) {
	unlock, err := m.lock(keys...)
	if err != nil {
		return nil, err
	}
	release, err := m.holds.change(keys[0], what)
	if err != nil {
		unlock()
		return nil, err
	}
	return func() { release(); unlock() }, nil
}
