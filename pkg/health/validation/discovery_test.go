package validation

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const discoveryTable = `2 GPUs found.
+--------+----------------------------------------------------------------------+
| GPU ID | Device Information                                                   |
+--------+----------------------------------------------------------------------+
| 0      | Name: NVIDIA H100 80GB HBM3                                          |
|        | PCI Bus ID: 00000000:18:00.0                                         |
|        | Device UUID: GPU-aaaa-0000                                           |
+--------+----------------------------------------------------------------------+
| 5      | Name: NVIDIA H100 80GB HBM3                                          |
|        | PCI Bus ID: 00000000:41:00.0                                         |
|        | Device UUID: GPU-2a3b                                                |
+--------+----------------------------------------------------------------------+
4 NvSwitches found.
+-----------+
| Switch ID |
+-----------+
| 0         |
+-----------+
`

func TestParseDCGMDiscovery(t *testing.T) {
	ids, err := ParseDCGMDiscovery([]byte(discoveryTable))
	if err != nil || len(ids) != 2 || ids["GPU-AAAA-0000"] != 0 || ids["GPU-2A3B"] != 5 {
		t.Fatalf("ParseDCGMDiscovery = %v, %v", ids, err)
	}
	for _, tc := range []struct{ name, out, want string }{
		{"empty", "", "lists no GPU"},
		{"an error", "Error: unable to establish a connection to the specified host: localhost\n", "lists no GPU"},
		{"a UUID twice", discoveryTable + "| 7      | Device UUID: GPU-2a3b |\n", "twice"},
		{"a UUID before any id", "|        | Device UUID: GPU-1 |\n", "before any GPU ID"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseDCGMDiscovery([]byte(tc.out)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// fakeDCGMI writes an executable dcgmi that answers discovery with discoveryTable (GPU-2a3b is
// DCGM's GPU 5, NVML's index 2) and diag with body.
func fakeDCGMI(t *testing.T, diag string) string {
	t.Helper()
	dir := t.TempDir()
	pass, err := os.ReadFile("testdata/dcgm4-pass.json")
	if err != nil {
		t.Fatal(err)
	}
	// The pass document of DCGM's GPU 2, made GPU 5's.
	doc := filepath.Join(dir, "pass5.json")
	if err := os.WriteFile(doc, []byte(strings.ReplaceAll(string(pass), `"entity_id" : 2`, `"entity_id" : 5`)), 0o644); err != nil {
		t.Fatal(err)
	}
	table := filepath.Join(dir, "table.txt")
	if err := os.WriteFile(table, []byte(discoveryTable), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "dcgmi")
	body := "#!/bin/sh\necho \"$*\" >> " + dir + "/calls\ncase \"$1\" in\ndiscovery) cat " + table + ";;\ndiag) " + strings.ReplaceAll(diag, "DOC", doc) + ";;\nesac\n"
	if err := os.WriteFile(bin, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return bin
}

func TestCommandMapsTheGPUToDCGMsID(t *testing.T) {
	bin := fakeDCGMI(t, `[ "$5" = "gpu:5" ] || exit 99; cat DOC`)
	cmd := Command{Argv: []string{bin, "diag", "-r", "2", "-i", "gpu:{dcgmID}", "-j", "--host", "{node}:5555"}, Format: FormatDCGM, Timeout: time.Minute}
	if v := cmd.Run(t.Context(), gpu2, "node-a"); v.Result != Passed {
		t.Fatalf("verdict %+v, want a pass of DCGM's GPU 5", v)
	}
	calls, _ := os.ReadFile(filepath.Join(filepath.Dir(bin), "calls"))
	if want := "discovery -l --host node-a:5555\ndiag -r 2 -i gpu:5 -j --host node-a:5555\n"; string(calls) != want {
		t.Errorf("calls:\n%s\nwant:\n%s", calls, want)
	}
	// The same document read as NVML's index 2 has no result for the GPU: never a pass.
	byIndex := Command{Argv: []string{bin, "diag", "-i", "gpu:{index}"}, Format: FormatDCGM, Timeout: time.Minute}
	if v := byIndex.Run(t.Context(), gpu2, "node-a"); v.Result == Passed {
		t.Fatalf("read as index 2: %+v", v)
	}
	// A GPU the host engine does not list: no verdict.
	other := gpu2
	other.UUID = "GPU-ffff"
	if v := cmd.Run(t.Context(), other, "node-a"); v.Result != Error || !strings.Contains(v.Message, "does not list GPU GPU-ffff") {
		t.Fatalf("unlisted GPU: %+v", v)
	}
}
