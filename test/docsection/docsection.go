// Package docsection keeps generated parts of the docs in step with the tests that measure them:
// a test computes a section's text and Check compares it with what the document has between
// <!-- NAME:begin --> and <!-- NAME:end -->. GPUHEALTH_UPDATE_DOCS=1 rewrites the section instead.
package docsection

import (
	"os"
	"strings"
	"testing"
)

// UpdateEnv names the variable that makes Check rewrite a stale section.
const UpdateEnv = "GPUHEALTH_UPDATE_DOCS"

// Check compares the section NAME of doc with want; with $GPUHEALTH_UPDATE_DOCS=1 it rewrites it.
// how names the command that rewrites it, for the error.
func Check(t testing.TB, doc, name, want, how string) {
	t.Helper()
	data, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	begin, end := "<!-- "+name+":begin -->\n", "<!-- "+name+":end -->"
	i, j := strings.Index(string(data), begin), strings.Index(string(data), end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %s...%s section", doc, begin, end)
	}
	got := string(data[i+len(begin) : j])
	if got == want {
		return
	}
	if os.Getenv(UpdateEnv) == "1" {
		out := string(data[:i+len(begin)]) + want + string(data[j:])
		if err := os.WriteFile(doc, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s's %s section is stale (%s=1 %s rewrites it):\n--- have\n%s--- want\n%s", doc, name, UpdateEnv, how, got, want)
}
