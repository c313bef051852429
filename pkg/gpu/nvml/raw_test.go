package nvml_test

import (
	"strings"
	"testing"

	gpunvml "github.com/gpuhealth/gpuhealth/pkg/gpu/nvml"
)

// findCalls returns the raw calls of gpu (-1: library-wide) to call.
func findCalls(calls []gpunvml.RawCall, gpu int, call string) []gpunvml.RawCall {
	var out []gpunvml.RawCall
	for _, c := range calls {
		if c.Call != call {
			continue
		}
		if (gpu < 0 && c.GPU == nil) || (c.GPU != nil && *c.GPU == gpu) {
			out = append(out, c)
		}
	}
	return out
}

func TestRawCallsRecordEveryAnswerAndNeverCallAMissingFunction(t *testing.T) {
	f := newFixture(t)
	// A driver before 535: the clock-event function is missing, the older throttle one is there.
	f.missing["nvmlDeviceGetCurrentClocksEventReasons"] = true
	f.update(1, func(st *gpuState) { st.unsupported[gpunvml.ReadingRemappedRows] = true })
	calls := f.open().RawCalls()

	lookups := map[string]string{}
	for _, c := range findCalls(calls, -1, "LookupSymbol") {
		lookups[c.Args] = c.Return
	}
	if got := lookups["nvmlDeviceGetCurrentClocksEventReasons"]; got != "missing" {
		t.Errorf("lookup of the missing function = %q, want missing", got)
	}
	if got := lookups["nvmlDeviceGetRemappedRows"]; got != "present" {
		t.Errorf("lookup of nvmlDeviceGetRemappedRows = %q, want present", got)
	}
	for i := range f.srv.Devices {
		if n := len(findCalls(calls, i, "nvmlDeviceGetCurrentClocksEventReasons")); n != 0 {
			t.Errorf("GPU %d: the missing function was called %d times", i, n)
		}
		if n := len(findCalls(calls, i, "nvmlDeviceGetCurrentClocksThrottleReasons")); n != 1 {
			t.Errorf("GPU %d: the throttle-reasons fallback was called %d times, want 1", i, n)
		}
		if c := findCalls(calls, i, "nvmlDeviceGetUUID"); len(c) != 1 || c[0].Value != f.uuid(i) {
			t.Errorf("GPU %d: GetUUID = %+v, want the fixture's UUID", i, c)
		}
		// Two active links, then the first link past them answers INVALID_ARGUMENT and ends the scan.
		links := findCalls(calls, i, "nvmlDeviceGetNvLinkState")
		if len(links) != 3 || !strings.Contains(links[2].Return, "(2)") {
			t.Errorf("GPU %d: NVLink states %+v, want links 0 and 1 then INVALID_ARGUMENT (2)", i, links)
		}
	}
	rows := findCalls(calls, 1, "nvmlDeviceGetRemappedRows")
	if len(rows) != 1 || !strings.Contains(rows[0].Return, "NOT_SUPPORTED") || !strings.HasSuffix(rows[0].Return, "(3)") || rows[0].Value != nil {
		t.Errorf("GPU 1 remapped rows = %+v, want NOT_SUPPORTED (3) and no value", rows)
	}
	var slowdown any
	for _, c := range findCalls(calls, 0, "nvmlDeviceGetTemperatureThreshold") {
		if c.Args == "slowdown" {
			slowdown = c.Value
		}
	}
	if slowdown != uint32(87) {
		t.Errorf("GPU 0 slowdown threshold = %v, want 87", slowdown)
	}
	if ecc := findCalls(calls, 0, "nvmlDeviceGetTotalEccErrors"); len(ecc) != 2 {
		t.Errorf("GPU 0 ECC totals: %d calls, want 2 (corrected and uncorrected, volatile, as the backend reads them)", len(ecc))
	}
	if rec := findCalls(calls, 0, "nvmlDeviceGetFieldValues"); len(rec) != 2 || !strings.Contains(rec[0].Args, "230") || !strings.Contains(rec[1].Args, "213 and 214") {
		t.Errorf("GPU 0 field values: %+v, want the recovery action (230) and the NVLink recovery counts (213, 214)", rec)
	}
	wait := findCalls(calls, -1, "nvmlEventSetWait")
	if len(wait) != 1 || !strings.Contains(wait[0].Return, "TIMEOUT") {
		t.Errorf("event wait = %+v, want one ERROR_TIMEOUT", wait)
	}
	if f.creates.Load() != f.frees.Load() {
		t.Errorf("event sets created %d, freed %d", f.creates.Load(), f.frees.Load())
	}
}

func TestRawCallsOfALostGPU(t *testing.T) {
	f := newFixture(t)
	b := f.open()
	f.update(0, func(st *gpuState) { st.lost = true })
	calls := b.RawCalls()
	temp := findCalls(calls, 0, "nvmlDeviceGetTemperature")
	if len(temp) != 1 || !strings.Contains(temp[0].Return, "GPU_IS_LOST") || temp[0].Value != nil {
		t.Errorf("temperature of a lost GPU = %+v, want GPU_IS_LOST and no value", temp)
	}
}
