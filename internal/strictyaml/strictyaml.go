// Package strictyaml decodes the project's YAML files (configs, scenarios) strictly: unknown
// fields, duplicate keys, several documents and type mismatches are errors, and every error is
// one line that names the line and the field, so a person can fix the file from the message.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Decode decodes exactly one YAML document from data into out, rejecting unknown fields.
func Decode(data []byte, out any) error {
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
	notFound   = regexp.MustCompile(`field (\S+) not found in type \S+`)
	cannotInto = regexp.MustCompile("cannot unmarshal (!!\\w+)(?: `([^`]*)`)? into \\S+")
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
			m = notFound.ReplaceAllString(m, `unknown field "$1"`)
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
		return errors.New(strings.Join(msgs, "; "))
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return errors.New(strings.ReplaceAll(msg, "\n", " "))
}
