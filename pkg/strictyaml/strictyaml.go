// Package strictyaml decodes the project's YAML files (configs, scenarios) strictly: unknown
// fields, duplicate keys, several documents and type mismatches (a fraction for an integer
// included) are errors, and every error is
// one line that names the line and the field, so a person can fix the file from the message.
package strictyaml

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"strings"
	"time"

	yaml "go.yaml.in/yaml/v3"
)

// Decode decodes exactly one YAML document from data into out, rejecting unknown fields. Values
// bound for an encoding.TextUnmarshaler (Duration, for one) are checked first, so that their
// errors carry the line, which yaml.v3 drops.
func Decode(data []byte, out any) error {
	var doc yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&doc); err != nil && !errors.Is(err, io.EOF) {
		return Clean(err)
	}
	budget := MaxExpandedValues
	if err := checkValues(&doc, reflect.TypeOf(out), &budget); err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(out); err != nil {
		if errors.Is(err, io.EOF) {
			return errors.New("the file is empty")
		}
		return Clean(err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return Clean(err)
		}
		return fmt.Errorf("line %d: only one YAML document is allowed", extra.Line)
	}
	return nil
}

// MaxExpandedValues bounds the values a document may hold once its aliases are expanded: a few
// lines of nested aliases expand into billions ("billion laughs"), and every configuration and
// scenario of this project is far smaller.
const MaxExpandedValues = 1_000_000

var (
	unmarshalerType     = reflect.TypeFor[yaml.Unmarshaler]()
	textUnmarshalerType = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkValues walks n alongside the Go type it will be decoded into. It rejects a number with a
// fraction where the type holds integers (yaml.v3 truncates 1.5 to 1 without a word), and runs
// each value bound for an encoding.TextUnmarshaler through it, adding the line to its error.
// Types with their own UnmarshalYAML check themselves.
func checkValues(n *yaml.Node, t reflect.Type, budget *int) error {
	if *budget--; *budget < 0 {
		return fmt.Errorf("line %d: the document expands, through its aliases, into more than %d values", n.Line, MaxExpandedValues)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return nil
	}
	if reflect.PointerTo(t).Implements(textUnmarshalerType) && n.Kind != yaml.DocumentNode {
		if n.Kind != yaml.ScalarNode {
			return fmt.Errorf("line %d: must be a single value", n.Line)
		}
		if n.ShortTag() == "!!null" {
			return nil
		}
		if err := reflect.New(t).Interface().(encoding.TextUnmarshaler).UnmarshalText([]byte(n.Value)); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		return nil
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			if err := checkValues(c, t, budget); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		switch t.Kind() {
		case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
			var f float64
			if n.ShortTag() == "!!float" && n.Decode(&f) == nil && f != math.Trunc(f) {
				return fmt.Errorf("line %d: %q is not a whole number", n.Line, n.Value)
			}
		}
	case yaml.SequenceNode:
		if t.Kind() != reflect.Slice && t.Kind() != reflect.Array {
			return nil
		}
		for _, c := range n.Content {
			if err := checkValues(c, t.Elem(), budget); err != nil {
				return err
			}
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			var vt reflect.Type
			switch t.Kind() {
			case reflect.Map:
				if err := checkValues(n.Content[i], t.Key(), budget); err != nil {
					return err
				}
				vt = t.Elem()
			case reflect.Struct:
				vt = fieldType(t, n.Content[i].Value)
			}
			if vt == nil {
				continue
			}
			if err := checkValues(n.Content[i+1], vt, budget); err != nil {
				return err
			}
		}
	}
	return nil
}

// fieldType returns the type of the field that the key name fills in struct t, looking into
// inlined structs, or nil.
func fieldType(t reflect.Type, name string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		tag, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if tag == "-" || !f.IsExported() {
			continue
		}
		if strings.Contains(","+opts+",", ",inline,") && f.Type.Kind() == reflect.Struct {
			if ft := fieldType(f.Type, name); ft != nil {
				return ft
			}
			continue
		}
		if tag == "" {
			tag = strings.ToLower(f.Name)
		}
		if tag == name {
			return f.Type
		}
	}
	return nil
}

// DecodeNode parses data into a node tree, for callers that need the line of a value.
func DecodeNode(data []byte) (*yaml.Node, error) {
	var n yaml.Node
	if err := yaml.Unmarshal(data, &n); err != nil {
		return nil, Clean(err)
	}
	return &n, nil
}

// Lookup follows mapping keys from root (a document node) and returns the node found, or nil.
func Lookup(root *yaml.Node, keys ...string) *yaml.Node {
	n := root
	if n != nil && n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	for _, k := range keys {
		if n == nil || n.Kind != yaml.MappingNode {
			return nil
		}
		var next *yaml.Node
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == k {
				next = n.Content[i+1]
			}
		}
		n = next
	}
	return n
}

var (
	// A field name or a value may hold any character, newlines and spaces included.
	notFound   = regexp.MustCompile(`(?s)field (.*) not found in type \S+`)
	cannotInto = regexp.MustCompile("(?s)cannot unmarshal (!\\S*)(?: `([^`]*)`)? into \\S+")
)

var tagNames = map[string]string{
	"!!str": "the string", "!!int": "the number", "!!float": "the number", "!!bool": "the boolean",
	"!!seq": "a list", "!!map": "a mapping", "!!null": "null", "!!timestamp": "the timestamp",
}

// Clean turns a yaml.v3 error into one line without Go type names.
func Clean(err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs := make([]string, 0, len(te.Errors))
		for _, m := range te.Errors {
			m = notFound.ReplaceAllStringFunc(m, func(s string) string {
				return fmt.Sprintf("unknown field %q", notFound.FindStringSubmatch(s)[1])
			})
			m = cannotInto.ReplaceAllStringFunc(m, func(s string) string {
				sub := cannotInto.FindStringSubmatch(s)
				what := tagNames[sub[1]]
				if what == "" {
					what = "the value " + sub[1]
				}
				if sub[2] != "" {
					what += fmt.Sprintf(" %q", sub[2])
				}
				return what + " is not valid here"
			})
			msgs = append(msgs, m)
		}
		return errors.New(oneLine(strings.Join(msgs, "; ")))
	}
	return errors.New(oneLine(strings.TrimPrefix(err.Error(), "yaml: ")))
}

// oneLine folds line breaks the patterns above did not catch into spaces.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// Duration is a Go duration string in a file ("90s", "1h30m"). Bare numbers are refused: their
// unit would be a guess. Decode reports a bad one with its line.
type Duration time.Duration

// ParseDuration reads a duration with a unit, refusing bare numbers ("10", "0").
func ParseDuration(text string) (time.Duration, error) {
	v, err := time.ParseDuration(text)
	if err != nil || strings.Trim(text, "+-.0123456789") == "" {
		return 0, fmt.Errorf("%q is not a duration; write one with a unit, such as 10s or 1m30s", text)
	}
	return v, nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(text []byte) error {
	v, err := ParseDuration(string(text))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalText writes the duration as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }
