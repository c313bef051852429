package validation

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// FuzzReadDCGM: whatever the output and exit code, ReadDCGM returns one of the three results
// with a bounded, valid message, and never Passed unless the output contains a "Pass".
func FuzzReadDCGM(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "dcgm*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		for _, exit := range []int{0, 226, 205} {
			f.Add(b, exit, 2)
		}
	}
	f.Add([]byte(`{"iterations":[{"DCGM Diagnostic":{}}]}`), 0, 0)
	f.Add([]byte("{\n{\n{\"DCGM GPU Diagnostic\":{\"test_categories\":[{\"tests\":[{\"results\":[{\"gpu_id\":\"0\",\"status\":\"Pass\"}]}]}]}}"), 0, 0)
	f.Fuzz(func(t *testing.T, out []byte, exit, gpu int) {
		v := ReadDCGM(out, exit, Target{DCGMID: gpu})
		switch v.Result {
		case Passed:
			if !bytes.Contains(out, []byte("Pass")) {
				t.Fatalf("Passed without a Pass in the output: %s", v.Message)
			}
		case Failed, Error:
		default:
			t.Fatalf("unknown Result %q", v.Result)
		}
		if v.Message == "" || len(v.Message) > maxMessage || !utf8.ValidString(v.Message) {
			t.Fatalf("bad Message (%d bytes): %q", len(v.Message), v.Message)
		}
	})
}
