package health

// Cursor is how far a replayable source has been applied: the kernel log numbers its records
// from 0 at every boot, so a position is a boot and the sequence number of the last record
// whose signals were applied.
type Cursor struct {
	BootID string `json:"bootID"`
	Seq    uint64 `json:"seq"`
}

// Advance applies the signals of one record of a replayable source and moves the source's
// cursor to to, under one lock: a checkpoint taken at any moment holds either both or neither,
// so a restart that replays from the checkpoint's cursor neither loses the record nor applies
// it twice. Signals about unknown devices are dropped, as Observe's error says.
func (t *Tracker) Advance(source string, to Cursor, sigs []Signal, out []Transition) []Transition {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, s := range sigs {
		out, _ = t.observeLocked(s, out)
	}
	t.setCursorLocked(source, to)
	return out
}

// Cursor returns the position of source, and false when nothing of it was applied or
// restored.
func (t *Tracker) Cursor(source string) (Cursor, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	c, ok := t.cursors[source]
	return c, ok
}

func (t *Tracker) setCursorLocked(source string, c Cursor) {
	if t.cursors == nil {
		t.cursors = make(map[string]Cursor)
	}
	t.cursors[source] = c
}

// Advance applies the signals of one record of a replayable source and moves its cursor (see
// Tracker.Advance), then publishes. A Runtime saves the checkpoint when a cursor moves, also
// when the signals changed nothing.
func (m *Monitor) Advance(source string, to Cursor, sigs ...Signal) {
	m.feed.Lock()
	defer m.feed.Unlock()
	m.buf = m.tracker.Advance(source, to, sigs, m.buf[:0])
	m.publishLocked()
	select {
	case m.cursorMoved <- struct{}{}:
	default: // a save is already due; it will read the latest cursor
	}
}

// Cursor returns the position of source (see Tracker.Cursor).
func (m *Monitor) Cursor(source string) (Cursor, bool) { return m.tracker.Cursor(source) }
