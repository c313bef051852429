package report

import "sync"

// LastValue remembers the last of a series of values, so that a reporter logs what other writers
// put in its annotations once per distinct value rather than at every sync. The zero value is
// ready to use; it is safe for concurrent use.
type LastValue struct {
	mu   sync.Mutex
	last string
}

// Changed reports whether v differs from the value given last ("" before the first), and
// remembers v.
func (l *LastValue) Changed(v string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	changed := v != l.last
	l.last = v
	return changed
}
