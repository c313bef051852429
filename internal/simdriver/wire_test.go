package simdriver

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The Go side of the wire is c/sim_wire.h's: the same operations in the same order, the same
// sizes and names.
func TestWireMatchesHeader(t *testing.T) {
	header, err := os.ReadFile("c/sim_wire.h")
	if err != nil {
		t.Fatal(err)
	}
	h := string(header)
	define := func(name string) string {
		m := regexp.MustCompile(`#define ` + name + ` (\S+)`).FindStringSubmatch(h)
		if m == nil {
			t.Fatalf("sim_wire.h defines no %s", name)
		}
		return strings.Trim(m[1], `"`)
	}
	for name, want := range map[string]string{
		"SIM_WIRE_VERSION": strconv.Itoa(wireVersion), "SIM_STR": strconv.Itoa(wireStr), "SIM_VALUES": strconv.Itoa(wireValues),
		"SIM_MIG_SLOTS": strconv.Itoa(migSlots), "SIM_SOCKET_NAME": SocketName,
	} {
		if got := define(name); got != want {
			t.Errorf("%s = %s in sim_wire.h, %s in wire.go", name, got, want)
		}
	}
	enum := regexp.MustCompile(`(?s)enum sim_op \{(.*?)\};`).FindStringSubmatch(h)
	if enum == nil {
		t.Fatal("no enum sim_op")
	}
	var cOps []string
	for _, m := range regexp.MustCompile(`SIM_OP_([A-Z0-9_]+)`).FindAllStringSubmatch(enum[1], -1) {
		cOps = append(cOps, strings.ToLower(strings.ReplaceAll(m[1], "_", "")))
	}
	goOps := goOpNames(t)
	if !slices.Equal(cOps, goOps) {
		t.Errorf("operations differ:\n  C:  %v\n  Go: %v", cOps, goOps)
	}
	if reqSize != 120 || respSize != 168 {
		t.Errorf("request %d, response %d bytes: the C structs are 120 and 168 bytes", reqSize, respSize)
	}
}

// goOpNames reads wire.go's op constants in order, lower-cased without the op prefix.
func goOpNames(t *testing.T) []string {
	f, err := parser.ParseFile(token.NewFileSet(), "wire.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			for _, n := range spec.(*ast.ValueSpec).Names {
				if strings.HasPrefix(n.Name, "op") && len(n.Name) > 2 && n.Name[2] >= 'A' && n.Name[2] <= 'Z' {
					names = append(names, strings.ToLower(n.Name[2:]))
				}
			}
		}
	}
	return names
}
