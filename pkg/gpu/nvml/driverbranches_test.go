package nvml

import (
	"debug/elf"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuhealth/gpuhealth/test/docsection"
)

// DriversEnv names the directory hack/nvidia-drivers.sh fills with NVIDIA's real libnvidia-ml of
// four driver branches (make unit and make e2e set it). Without it the tests of this file skip.
const DriversEnv = "GPUHEALTH_NVIDIA_DRIVERS"

// driverBranch is one real libnvidia-ml.so.1 and the functions it exports.
type driverBranch struct {
	version string
	library string
	exports map[string]bool
}

func realDrivers(t *testing.T) []driverBranch {
	t.Helper()
	dir := os.Getenv(DriversEnv)
	if dir == "" {
		t.Skipf("$%s is not set: run hack/nvidia-drivers.sh (make unit does)", DriversEnv)
	}
	data, err := os.ReadFile(filepath.Join(dir, "versions"))
	if err != nil {
		t.Fatalf("$%s: %v", DriversEnv, err)
	}
	var out []driverBranch
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		_, version, ok := strings.Cut(line, " ")
		if !ok {
			t.Fatalf("%s/versions: bad line %q", dir, line)
		}
		lib := filepath.Join(dir, version, LibraryName)
		out = append(out, driverBranch{version: version, library: lib, exports: exportedFunctions(t, lib)})
	}
	return out
}

// exportedFunctions reads a library's dynamic symbol table: the functions it defines, as
// `nm -D --defined-only` lists them.
func exportedFunctions(t *testing.T, path string) map[string]bool {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	syms, err := f.DynamicSymbols()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && elf.ST_TYPE(s.Info) == elf.STT_FUNC {
			out[s.Name] = true
		}
	}
	if len(out) < 100 {
		t.Fatalf("%s exports only %d functions: not NVIDIA's NVML library?", path, len(out))
	}
	return out
}

// nvmlCalls lists the go-nvml methods this package's code calls, found by reading its source:
// every selector whose name is a method of go-nvml's Interface, Device or EventSet, mapped to the C
// function go-nvml calls for it ("nvml" + Interface method, "nvmlDevice" + Device method,
// "nvmlEventSet" + EventSet method).
func nvmlCalls(t *testing.T) map[string]string {
	t.Helper()
	prefixes := map[reflect.Type]string{
		reflect.TypeFor[nvml.Interface](): "nvml",
		reflect.TypeFor[nvml.Device]():    "nvmlDevice",
		reflect.TypeFor[nvml.EventSet]():  "nvmlEventSet",
	}
	methods := map[string][]string{} // method name -> C functions
	for typ, prefix := range prefixes {
		for i := range typ.NumMethod() {
			name := typ.Method(i).Name
			methods[name] = append(methods[name], prefix+name)
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	calls := map[string]string{} // C function -> where first called
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if id, ok := sel.X.(*ast.Ident); ok && id.Name == "nvml" {
				return true // a package function such as nvml.New, not a library call
			}
			for _, c := range methods[sel.Sel.Name] {
				if _, seen := calls[c]; !seen {
					calls[c] = fset.Position(call.Pos()).String()
				}
			}
			return true
		})
	}
	return calls
}

// goNVMLOnly are methods that go-nvml answers without calling the library.
var goNVMLOnly = map[string]bool{"nvmlExtensions": true}

// Every NVML function the backend calls is either in every real driver branch or one of the
// optional functions Open looks up first (calling a missing one ends the process).
func TestEveryCalledFunctionIsInEveryBranchOrLookedUp(t *testing.T) {
	branches := realDrivers(t)
	optional := map[string]bool{}
	for _, s := range optionalSymbols() {
		optional[s] = true
	}
	calls := nvmlCalls(t)
	if len(calls) < 20 {
		t.Fatalf("found only %d NVML calls in the source: the scan is broken (%v)", len(calls), calls)
	}
	for _, b := range branches {
		for fn, where := range calls {
			if goNVMLOnly[fn] || optional[fn] {
				continue
			}
			// Interface and Device share some names (GetUUID on a Device, DeviceGetUUID on the
			// library): a name is fine when any of its C functions exists, versioned or not.
			if b.exports[fn] || b.exports[fn+"_v2"] || b.exports[fn+"_v3"] || !anyBranchHas(branches, fn) {
				continue
			}
			t.Errorf("driver %s lacks %s, called at %s without being looked up first", b.version, fn, where)
		}
	}
}

// anyBranchHas reports whether fn is a real NVML function at all (a method name shared with a
// non-NVML call, say an EventSet's Wait matched on a sync.WaitGroup, maps to nothing real).
func anyBranchHas(branches []driverBranch, fn string) bool {
	for _, b := range branches {
		if b.exports[fn] || b.exports[fn+"_v2"] || b.exports[fn+"_v3"] {
			return true
		}
	}
	return false
}

// What each driver branch lets the backend do, from the real libraries' export tables: the
// readings Open reports unmonitored on a branch are exactly those whose every NVML function the
// branch lacks, and events work on every branch. The table is docs/nvml.md's.
func TestDriverBranchesTable(t *testing.T) {
	branches := realDrivers(t)
	// Independent of readingFuncs: the NVML functions behind each reading, per NVIDIA's nvml.h.
	wantFuncs := map[string][]string{
		ReadingECC:            {"nvmlDeviceGetTotalEccErrors"},
		ReadingRemappedRows:   {"nvmlDeviceGetRemappedRows"},
		ReadingRetiredPages:   {"nvmlDeviceGetRetiredPagesPendingStatus"},
		ReadingTemperature:    {"nvmlDeviceGetTemperature"},
		ReadingPower:          {"nvmlDeviceGetPowerUsage"},
		ReadingClockEvents:    {"nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"},
		ReadingPCIeReplays:    {"nvmlDeviceGetPcieReplayCounter"},
		ReadingNVLink:         {"nvmlDeviceGetNvLinkState"},
		ReadingRecoveryAction: {"nvmlDeviceGetFieldValues"},

		ReadingRowRemapHistogram: {"nvmlDeviceGetRowRemapperHistogram"},
		ReadingSRAM:              {"nvmlDeviceGetSramEccErrorStatus"},
		ReadingPCIeLink:          {"nvmlDeviceGetCurrPcieLinkWidth"},
		ReadingFabric:            {"nvmlDeviceGetGpuFabricInfoV", "nvmlDeviceGetGpuFabricInfo"},
		ReadingNVLinkRecoveries:  {"nvmlDeviceGetFieldValues"},
	}
	rows := map[string][]string{}
	var readings, parts []string
	for _, f := range readingFuncs {
		readings = append(readings, f.reading)
	}
	for _, b := range branches {
		lib := &mock.Interface{ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
				if b.exports[name] {
					return nil
				}
				return errors.New("not exported")
			}}
		}}
		sym := lookupSymbols(lib)
		off := sym.readingsOff()
		for _, reading := range readings {
			funcs, ok := wantFuncs[reading]
			if !ok {
				t.Fatalf("reading %q has no entry in this test's table: add its NVML functions", reading)
			}
			has := slices.ContainsFunc(funcs, func(f string) bool { return b.exports[f] })
			if _, isOff := off[reading]; isOff == has {
				t.Errorf("driver %s, reading %s: backend off=%v, but the library has %v: %v", b.version, reading, isOff, funcs, has)
			}
			cell := "yes"
			switch {
			case !has:
				cell = "no (lacks " + strings.Join(funcs, ", ") + ")"
			case !b.exports[funcs[0]]:
				cell = "yes, through " + firstPresent(funcs, b.exports)
			}
			rows[reading] = append(rows[reading], cell)
		}
		if why := sym.eventsMissing(); why != "" {
			t.Errorf("driver %s: events cannot be watched: %s", b.version, why)
		}
		for _, part := range []struct{ row, fn string }{
			{"events (XID, ECC, GPU unavailable)", "nvmlEventSetWait_v2"},
			{"NVLink error counters", symNvLinkErrorCounter},
			{"temperature thresholds", symTemperatureThreshold},
			{"MIG instances", symMigDeviceHandleByIndex},
		} {
			cell := "yes"
			if !b.exports[part.fn] {
				cell = "no (lacks " + part.fn + ")"
				if part.fn == "nvmlEventSetWait_v2" && b.exports[symEventSetWait] {
					cell = "yes, through " + symEventSetWait
				}
			}
			if !slices.Contains(parts, part.row) {
				parts = append(parts, part.row)
			}
			rows[part.row] = append(rows[part.row], cell)
		}
	}
	var md strings.Builder
	md.WriteString("| reading / check |")
	for _, b := range branches {
		fmt.Fprintf(&md, " %s (%d functions) |", b.version, len(b.exports))
	}
	md.WriteString("\n|---|" + strings.Repeat("---|", len(branches)) + "\n")
	for _, r := range append(readings, parts...) {
		fmt.Fprintf(&md, "| %s | %s |\n", r, strings.Join(rows[r], " | "))
	}
	docsection.Check(t, "../../../docs/nvml.md", "driver-branches", md.String(), "go test ./pkg/gpu/nvml")
}

func firstPresent(funcs []string, exports map[string]bool) string {
	for _, f := range funcs {
		if exports[f] {
			return f
		}
	}
	return ""
}
