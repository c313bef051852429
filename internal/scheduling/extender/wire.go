package extender

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	corev1 "k8s.io/api/core/v1"
)

// The /filter call of a nodeCacheCapable extender is ExtenderArgs{Pod, NodeNames} in and
// ExtenderFilterResult{NodeNames, FailedNodes} out. At 5,000 nodes encoding/json spent two
// thirds of the call on the names alone: one reflected, allocated string per name in, a map
// sorted by key out. This file reads and writes that one shape by hand and leaves every other
// body to encoding/json, so that what the extender accepts and answers does not change.

// readBody reads r (the request body, already bounded by http.MaxBytesReader) into buf, which it
// grows as needed (at first to sizeHint bytes, when that is more), and returns the filled buffer.
func readBody(buf []byte, r io.Reader, sizeHint int64) ([]byte, error) {
	buf = buf[:0]
	if sizeHint > 0 && int64(cap(buf)) < sizeHint+1 {
		buf = make([]byte, 0, sizeHint+1) // +1: the read that sees EOF needs room
	}
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				return buf, fmt.Errorf("request body is larger than %d bytes", tooBig.Limit)
			}
			return buf, fmt.Errorf("read request: %w", err)
		}
	}
}

// parseNamesArgs decodes body when it is exactly what kube-scheduler sends a nodeCacheCapable
// extender: one JSON object with the keys Pod (an object or null), Nodes (null) and NodeNames (an
// array of strings), each at most once, spelled so, and every node name printable ASCII without
// escapes. It appends the names, as slices of body, to names. ok is false for any other body: the
// caller then decodes it with encoding/json, which also finds out whether it is valid at all.
// For a body it accepts, the pod and names are what encoding/json's Decoder would make of it
// (FuzzNamesArgs checks that).
func parseNamesArgs(body []byte, names [][]byte) (pod *corev1.Pod, _ [][]byte, hasNames, ok bool) {
	s := scanner{b: body}
	if !s.byte('{') {
		return nil, names, false, false
	}
	var seenPod, seenNodes bool
	if s.byte('}') {
		return nil, names, false, true
	}
	for {
		key, ok := s.plainString()
		if !ok || !s.byte(':') {
			return nil, names, false, false
		}
		switch string(key) {
		case "Pod":
			if seenPod {
				return nil, names, false, false
			}
			seenPod = true
			if !s.null() {
				obj, ok := s.object()
				// Pod is decoded as encoding/json decodes a field of type *corev1.Pod.
				if !ok || json.Unmarshal(obj, &pod) != nil {
					return nil, names, false, false
				}
			}
		case "Nodes":
			if seenNodes || !s.null() {
				return nil, names, false, false
			}
			seenNodes = true
		case "NodeNames":
			if hasNames {
				return nil, names, false, false
			}
			if s.null() {
				// Only a repeated key could make it non-nil again, and that is declined above.
				break
			}
			hasNames = true
			if !s.byte('[') {
				return nil, names, false, false
			}
			if !s.byte(']') {
				for {
					name, ok := s.plainString()
					if !ok {
						return nil, names, false, false
					}
					names = append(names, name)
					if s.byte(']') {
						break
					}
					if !s.byte(',') {
						return nil, names, false, false
					}
				}
			}
		default:
			return nil, names, false, false
		}
		if s.byte('}') {
			// Like json.Decoder, whatever follows the object is not read.
			return pod, names, hasNames, true
		}
		if !s.byte(',') {
			return nil, names, false, false
		}
	}
}

// scanner reads JSON tokens from b; each method skips white space first and reports false,
// without a promise about where it stopped, when b does not go on as asked.
type scanner struct {
	b []byte
	i int
}

func (s *scanner) space() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) byte(c byte) bool {
	s.space()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

func (s *scanner) null() bool {
	s.space()
	if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// plainString reads a string of printable ASCII without escapes and returns its content.
func (s *scanner) plainString() ([]byte, bool) {
	if !s.byte('"') {
		return nil, false
	}
	start := s.i
	for ; s.i < len(s.b); s.i++ {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return s.b[start : s.i-1], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
	}
	return nil, false
}

// object returns the extent of the object that starts here by matching brackets outside
// strings. It does not validate what is inside: the caller's json.Unmarshal does, and for valid
// JSON the extent is exact.
func (s *scanner) object() ([]byte, bool) {
	s.space()
	if s.i >= len(s.b) || s.b[s.i] != '{' {
		return nil, false
	}
	start, depth := s.i, 0
	for ; s.i < len(s.b); s.i++ {
		switch s.b[s.i] {
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth == 0 {
				s.i++
				return s.b[start:s.i], true
			}
		case '"':
			for s.i++; s.i < len(s.b) && s.b[s.i] != '"'; s.i++ {
				if s.b[s.i] == '\\' {
					s.i++
				}
			}
		}
	}
	return nil, false
}

// appendJSONString appends s as a JSON string, byte for byte as encoding/json writes it.
func appendJSONString[S string | []byte](dst []byte, s S) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(string(s)) // a string always encodes
			return append(dst, quoted...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}
