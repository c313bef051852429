package health

import (
	"fmt"
	"strings"
)

// enumNames is the text form of a small enum whose values index its names (Severity, ClearsOn,
// RecoveryAction): their String, MarshalText and Parse functions are its methods.
type enumNames[T ~uint8] struct {
	typ   string // the Go type, for a value without a name: "Severity(7)"
	what  string // the type in errors: "unknown severity \"x\""
	names []string
}

// String returns v's name, or typ(v) for a value without one.
func (e enumNames[T]) String(v T) string {
	if int(v) < len(e.names) {
		return e.names[v]
	}
	return fmt.Sprintf("%s(%d)", e.typ, uint8(v))
}

// marshal returns v's name, and an error for a value without one.
func (e enumNames[T]) marshal(v T) ([]byte, error) {
	if int(v) >= len(e.names) {
		return nil, fmt.Errorf("invalid %s %d", e.what, uint8(v))
	}
	return []byte(e.names[v]), nil
}

// parse returns the value named s; the error lists the names.
func (e enumNames[T]) parse(s string) (T, error) {
	for i, name := range e.names {
		if s == name {
			return T(i), nil
		}
	}
	last := len(e.names) - 1
	return 0, fmt.Errorf("unknown %s %q (want %s or %s)", e.what, s, strings.Join(e.names[:last], ", "), e.names[last])
}

// unmarshal sets *v to the value named b.
func (e enumNames[T]) unmarshal(v *T, b []byte) error {
	parsed, err := e.parse(string(b))
	if err != nil {
		return err
	}
	*v = parsed
	return nil
}
