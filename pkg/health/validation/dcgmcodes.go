package validation

import "strconv"

// dcgmi returns a dcgmReturn_t from main (dcgmi/main_dcgmi.cpp), which the shell sees modulo 256.
const (
	exitOK          = 0
	exitNVVSError   = 226 // DCGM_ST_NVVS_ERROR (-30): the diag ran and reported an error
	exitNVVSIsolate = 205 // DCGM_ST_NVVS_ISOLATE_ERROR (-51): an error of severity ISOLATE
)

// infraExits are exit codes that say the diag did not judge the GPU at all.
var infraExits = map[int]string{
	217: "a diagnostic is already running on the host engine", // DCGM_ST_DIAG_ALREADY_RUNNING
	235: "the connection to the host engine is not valid",     // DCGM_ST_CONNECTION_NOT_VALID
	203: "nvvs was killed by a signal",                        // DCGM_ST_NVVS_KILLED
	254: "dcgmi hit an exception",                             // -2, main's catch
}

// otherExits name a few more codes for messages; none of them is a test verdict.
var otherExits = map[int]string{
	255: "bad parameter",                          // DCGM_ST_BADPARAM
	253: "generic error",                          // DCGM_ST_GENERIC_ERROR
	250: "not supported",                          // DCGM_ST_NOT_SUPPORTED
	238: "GPU is lost",                            // DCGM_ST_GPU_IS_LOST
	237: "GPU requires a reset",                   // DCGM_ST_RESET_REQUIRED
	216: "the diag's JSON could not be parsed",    // DCGM_ST_DIAG_BAD_JSON
	215: "the diag could not be launched",         // DCGM_ST_DIAG_BAD_LAUNCH
	204: "the nvvs binary was not found",          // DCGM_ST_NVVS_BINARY_NOT_FOUND
	198: "no test available",                      // DCGM_ST_NVVS_NO_AVAILABLE_TEST
	202: "the host engine is paused",              // DCGM_ST_PAUSED
	200: "NVML is not loaded in the host engine",  // DCGM_ST_NVML_NOT_LOADED
	189: "GPUs are detached from the host engine", // DCGM_ST_GPUS_DETACHED
}

// severityNames follow dcgmErrorSeverity_t (dcgmlib/dcgm_errors.h).
var severityNames = map[int64]string{
	0: "NONE", 1: "MONITOR", 2: "ISOLATE", 3: "UNKNOWN", 4: "TRIAGE", 5: "CONFIG", 6: "RESET",
}

// notFaults are the severities under which a "Fail" is a finding, not a fault: MONITOR ("can
// perform workload, but needs to be monitored") and CONFIG (a setting, e.g. persistence mode
// off, DCGM error 29). dcgmi prints a WARN result as "Fail" in JSON, so severity is the only
// way to tell them apart.
var notFaults = map[int64]bool{1: true, 5: true}

func exitName(code int) string {
	if s, ok := otherExits[code]; ok {
		return " (" + s + ")"
	}
	return ""
}

func severityName(sev int64) string {
	if s, ok := severityNames[sev]; ok {
		return s
	}
	return strconv.FormatInt(sev, 10)
}
