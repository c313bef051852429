package healthtest

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// Log is a logger that keeps what it is told, for tests of what code logs (a warning given
// once, a problem named). Its zero value is ready; it is safe for concurrent use.
type Log struct {
	mu    sync.Mutex
	lines []string
}

// Logger returns a logger that writes into l, one line per call: its name prefix, then the
// message and key/value pairs as funcr renders them.
func (l *Log) Logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, strings.TrimSpace(prefix+" "+args))
	}, funcr.Options{})
}

// Context returns a context carrying l's logger (as klog.NewContext and logr.NewContext do), for
// code that takes its logger from the context.
func (l *Log) Context() context.Context {
	return logr.NewContext(context.Background(), l.Logger())
}

// Lines returns what was logged so far, a line per call.
func (l *Log) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// Containing returns the lines that contain every one of parts.
func (l *Log) Containing(parts ...string) []string {
	var out []string
	for _, line := range l.Lines() {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			out = append(out, line)
		}
	}
	return out
}

// String returns the lines joined by newlines, for failure messages.
func (l *Log) String() string { return strings.Join(l.Lines(), "\n") }
