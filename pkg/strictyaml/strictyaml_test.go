package strictyaml_test

import (
	"errors"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuhealth/gpuhealth/pkg/strictyaml"
)

type inner struct {
	N     int      `yaml:"n"`
	Items []string `yaml:"items"`
}

type Embedded struct {
	Extra uint32 `yaml:"extra"`
}

type doc struct {
	Name     string         `yaml:"name"`
	On       bool           `yaml:"on"`
	Inner    inner          `yaml:"inner"`
	Ints     []int64        `yaml:"ints"`
	Counts   map[string]int `yaml:"counts"`
	Ratio    float64        `yaml:"ratio"`
	A        *float64       `yaml:"a"`
	Embedded `yaml:",inline"`
}

func TestDecodeAcceptsAValidDocument(t *testing.T) {
	var d doc
	err := strictyaml.Decode([]byte("# comment\nname: a\non: true\ninner:\n  n: 3e0\n  items: [x, y]\nints: [1, 2.0]\nratio: 0.5\nextra: 7\n"), &d)
	if err != nil || d.Name != "a" || !d.On || d.Inner.N != 3 || len(d.Inner.Items) != 2 || d.Ints[1] != 2 || d.Ratio != 0.5 || d.Extra != 7 {
		t.Fatalf("Decode: %+v, %v", d, err)
	}
	// An explicit document start and end are one document.
	if err := strictyaml.Decode([]byte("---\nname: b\n...\n"), &d); err != nil || d.Name != "b" {
		t.Fatalf("Decode with markers: %+v, %v", d, err)
	}
}

func TestDecodeErrorsAreOneLineWithoutGoTypes(t *testing.T) {
	cases := []struct {
		name string
		data string
		want []string
	}{
		{"empty", "", []string{"the file is empty"}},
		{"blank", "\n\n   \n", []string{"the file is empty"}},
		{"only comments", "# a\n# b\n", []string{"the file is empty"}},
		{"unknown field", "name: a\nnamez: b\n", []string{"line 2", `unknown field "namez"`}},
		{"unknown nested field", "inner:\n  n: 1\n  m: 2\n", []string{"line 3", `unknown field "m"`}},
		{"unknown field with a space", "name: a\n\"a b\": 1\n", []string{"line 2", `unknown field "a b"`}},
		{"unknown field with a line break", "\"a\\nb\": 1\n", []string{"line 1", `unknown field "a\nb"`}},
		{"two unknown fields", "x: 1\ny: 2\n", []string{"line 1", `"x"`, "line 2", `"y"`}},
		{"duplicate key", "name: a\nname: b\n", []string{"line 2", `"name"`}},
		{"second document", "name: a\n---\nname: b\n", []string{"line 2", "only one YAML document"}},
		{"second, broken document", "name: a\n---\n[\n", []string{"line"}},
		{"string for an int", "inner: {n: many}\n", []string{"line 1", `the string "many" is not valid here`}},
		{"string with a line break for an int", "inner: {n: \"a\\nb\"}\n", []string{"line 1", `"a\nb"`}},
		{"custom tag", "inner: {n: !x \"a\\nb\"}\n", []string{"line 1", `!x "a\nb"`}},
		{"list for a string", "name: [a]\n", []string{"line 1", "a list is not valid here"}},
		{"mapping for a list", "inner: {items: {a: 1}}\n", []string{"line 1", "a mapping is not valid here"}},
		{"fraction for an int", "inner:\n  n: 1.5\n", []string{"line 2", `"1.5" is not a whole number`}},
		{"fraction in a list for an int", "inner: {n: 1}\nints: [1, 2.25]\n", []string{"line 2", `"2.25" is not a whole number`}},
		{"fraction through an alias", "a: &x 2.5\ninner: {n: *x}\n", []string{"line 1", `"2.5" is not a whole number`}},
		{"fraction in a map value", "counts: {a: 1, b: 0.5}\n", []string{"line 1", `"0.5" is not a whole number`}},
		{"fraction in an inline field", "extra: 1.5\n", []string{"line 1", `"1.5" is not a whole number`}},
		{"syntax error", "name: [a\n", []string{"line"}},
		{"tab indentation", "inner:\n\tn: 1\n", []string{"line"}},
		{"not a mapping", "- a\n- b\n", []string{"line 1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var d doc
			err := strictyaml.Decode([]byte(tc.data), &d)
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("error %q is not one non-empty line", msg)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Fatalf("error %q does not contain %q", msg, w)
				}
			}
			for _, leak := range []string{"strictyaml_test.", "[]", "map[", "int64", "uint32", " into ", "yaml: "} {
				if strings.Contains(msg, leak) {
					t.Fatalf("error %q leaks Go detail %q", msg, leak)
				}
			}
		})
	}
}

func TestCleanFoldsPlainErrors(t *testing.T) {
	got := strictyaml.Clean(errors.New("yaml: line 3: did not find\r\nexpected key"))
	if got.Error() != "line 3: did not find expected key" {
		t.Fatalf("Clean = %q", got)
	}
}

func TestDecodeNodeAndLookup(t *testing.T) {
	root, err := strictyaml.DecodeNode([]byte("a:\n  b:\n    - x\n    - y\n  c: 1\nd: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strictyaml.Lookup(root, "a", "b"); n == nil || n.Kind != yaml.SequenceNode || n.Line != 3 || len(n.Content) != 2 {
		t.Fatalf("Lookup(a, b) = %+v", n)
	}
	if n := strictyaml.Lookup(root, "d"); n == nil || n.Value != "2" || n.Line != 6 {
		t.Fatalf("Lookup(d) = %+v", n)
	}
	if n := strictyaml.Lookup(root); n == nil || n.Kind != yaml.MappingNode {
		t.Fatalf("Lookup() = %+v, want the top mapping", n)
	}
	for _, keys := range [][]string{{"x"}, {"a", "x"}, {"d", "e"}, {"a", "b", "c"}} {
		if n := strictyaml.Lookup(root, keys...); n != nil {
			t.Errorf("Lookup(%q) = %+v, want nil", keys, n)
		}
	}
	if n := strictyaml.Lookup(nil, "a"); n != nil {
		t.Fatal("Lookup(nil) found something")
	}
	if _, err := strictyaml.DecodeNode([]byte("a: [\n")); err == nil || strings.Contains(err.Error(), "\n") {
		t.Fatalf("DecodeNode of broken YAML: %v", err)
	}
}

// TestAliasExpansionIsBounded: a few lines of nested aliases ("billion laughs") are refused with
// a clear error instead of being walked value by value.
func TestAliasExpansionIsBounded(t *testing.T) {
	refs := func(name string) string { return strings.TrimSuffix(strings.Repeat("*"+name+",", 200), ",") }
	doc := "defs:\n  - &a [1, 2, 3, 4, 5]\n  - &b [" + refs("a") + "]\n  - &c [" + refs("b") + "]\n" +
		"items: [" + refs("c") + "]\n"
	var out struct {
		Defs  [][][]int   `yaml:"defs"`
		Items [][][][]int `yaml:"items"`
	}
	err := strictyaml.Decode([]byte(doc), &out)
	if err == nil || !strings.Contains(err.Error(), "expands, through its aliases, into more than 1000000 values") {
		t.Fatalf("Decode = %v, want the expansion refused", err)
	}
	// Aliases that expand into little are fine.
	var small struct {
		Defs  []int   `yaml:"defs"`
		Items [][]int `yaml:"items"`
	}
	if err := strictyaml.Decode([]byte("defs: &d [1, 2]\nitems: [*d, *d]\n"), &small); err != nil || len(small.Items) != 2 {
		t.Fatalf("a small alias: %v %+v", err, small)
	}
}
