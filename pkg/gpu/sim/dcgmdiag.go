package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// What `dcgmi diag` prints, and its exit status, for one simulated GPU: DCGM 4.x's -j document
// (dcgmi/Diag.cpp HelperJsonBuildOutput, nvvs/include/NvvsJsonStrings.h, v4.0.0 to v4.6.0), 3.x's
// (v3.3.9), the text table without -j, and the runtime_error document of a run that could not
// complete. It is written from DCGM's source, not from any reader of it: a reader that meets this
// output meets DCGM's. The tests a level runs are those of nvvs's FillTestVectors (EUD and
// nvbandwidth left out), the errors are dcgm_errors.h's (code, severity, category and the
// message with its next step, as DcgmError::SetFullError joins them), and the exit status is
// GetFailureResult's.

// DCGM versions the simulated dcgmi speaks; a version's major number picks the JSON shape.
const (
	DCGMVersion4 = "4.2.3"
	DCGMVersion3 = "3.3.9"
)

// Exit statuses of dcgmi: its main returns a dcgmReturn_t (dcgm_structs.h), which the shell sees
// modulo 256.
const (
	DCGMExitOK             = 0
	DCGMExitKilled         = 203 // DCGM_ST_NVVS_KILLED (-53): nvvs was killed, as dcgmi's -t has it killed
	DCGMExitIsolate        = 205 // DCGM_ST_NVVS_ISOLATE_ERROR (-51): an error of severity ISOLATE
	DCGMExitAlreadyRunning = 217 // DCGM_ST_DIAG_ALREADY_RUNNING (-39): one diagnostic per host engine
	DCGMExitNVVSError      = 226 // DCGM_ST_NVVS_ERROR (-30): it ran and reported an error
	DCGMExitConnection     = 235 // DCGM_ST_CONNECTION_NOT_VALID (-21): no host engine answered
	DCGMExitGPULost        = 238 // DCGM_ST_GPU_IS_LOST (-18)
	DCGMExitUsage          = 254 // -2: the command line did not parse (main's exception path)
	DCGMExitBadParam       = 255 // DCGM_ST_BADPARAM (-1)
)

// PCIDeviceID is a simulated GPU's PCI device ID as DCGM prints it (H100 SXM5 80GB). Its serial
// is Scenario.Serial, what the simulated driver's NVML answers.
const PCIDeviceID = "2330"

// DCGMDevice is what DCGM knows of a GPU beyond its id: discovery's name, bus ID and UUID, and
// the serial and PCI device ID of a diagnostic's entity list.
type DCGMDevice struct {
	Name     string `json:"name"`
	UUID     string `json:"uuid"`
	PCIBusID string `json:"pciBusID"`
	Serial   string `json:"serial"`
	DeviceID string `json:"deviceID"`
}

// DCGMRun is one `dcgmi diag` of one GPU as the simulated host engine ran it.
type DCGMRun struct {
	// Version is DCGM's ("4.2.3"): 3.x gives 3.x's document, anything else 4.x's.
	Version string
	// GPU is DCGM's GPU id: the GPU's index in the simulation.
	GPU int
	// Entities is the -i argument as given ("gpu:2"); "" is the GPU id. Errors quote it.
	Entities string
	// Host is --host as given ("" is localhost); the connection error names it.
	Host  string
	Level int // 1 to 4 (dcgmi diag -r)
	JSON  bool
	State DiagState
	// Lost: the GPU fell off the bus; NoSuchGPU: DCGM has no GPU of that id. Either run fails
	// before any test.
	Lost, NoSuchGPU bool
	Device          DCGMDevice
	DriverVersion   string
}

// DCGMDiag returns what dcgmi prints on stdout for the run and its exit status. The GPU's
// diagnostic state decides: pass, fail, config and skip (and a latent fault) give the document
// of a run that completed; busy the host engine's DIAG_ALREADY_RUNNING; unreachable dcgmi's
// connection error; hang what dcgmi prints when its -t timeout had the hanging nvvs killed (a
// caller without a timeout waits instead).
func DCGMDiag(r DCGMRun) (stdout []byte, exitCode int) {
	switch {
	case r.State.Word == DiagUnreachable:
		host := r.Host
		if host == "" {
			host = "localhost"
		}
		// Command::Connect and DoExecuteConnectionFailure (dcgmi/Command.cpp).
		return []byte("Error: unable to establish a connection to the specified host: " + host + "\n" +
			"Error: Unable to connect to host engine. " + dcgmErrorString(stConnectionNotValid) + ".\n"), DCGMExitConnection
	case r.NoSuchGPU:
		return r.runtimeError(stBadParam)
	case r.Lost:
		return r.runtimeError(stGPUIsLost)
	case r.State.Word == DiagBusy:
		return r.runtimeError(stDiagAlreadyRunning)
	case r.State.Word == DiagHang:
		return r.runtimeError(stNVVSKilled)
	}
	tests := r.tests()
	code := failureResult4(tests)
	if r.major() == 3 {
		code = failureResult3(tests)
	}
	switch {
	case r.JSON && r.major() == 3:
		return styled(r.json3(tests)), code
	case r.JSON:
		return styled(r.json4(tests)), code
	default:
		return r.text(tests), code
	}
}

func (r DCGMRun) major() int {
	if strings.HasPrefix(r.Version, "3.") {
		return 3
	}
	return 4
}

func (r DCGMRun) entities() string {
	if r.Entities != "" {
		return r.Entities
	}
	if r.major() == 3 {
		return strconv.Itoa(r.GPU)
	}
	return "gpu:" + strconv.Itoa(r.GPU)
}

// dcgmReturn_t values (dcgm_structs.h) and their errorString texts (dcgm_errors.c).
const (
	stBadParam           = -1
	stGPUIsLost          = -18
	stConnectionNotValid = -21
	stDiagAlreadyRunning = -39
	stNVVSKilled         = -53
)

func dcgmErrorString(st int) string {
	switch st {
	case stBadParam:
		return "Bad parameter passed to function"
	case stGPUIsLost:
		return "GPU is lost"
	case stConnectionNotValid:
		return "Host engine connection invalid/disconnected"
	case stDiagAlreadyRunning:
		return "A diag instance is already running, cannot run a new diag until the current one finishes"
	case stNVVSKilled:
		return "The DCGM diagnostic was killed by a signal"
	}
	return "Unknown error"
}

// runtimeError is what RunDiagOnce prints when the host engine answers the run with status st.
// 4.x's message quotes the -i argument and then the response's system error, which the
// simulated engine gives as the status's errorString; 3.x's names the group
// (DCGM_GROUP_ALL_GPUS when -i is used) and the errorString.
func (r DCGMRun) runtimeError(st int) ([]byte, int) {
	msg := fmt.Sprintf("Error: Unable to complete diagnostic for entities %s. Return: (%d) \n%s", r.entities(), st, dcgmErrorString(st))
	if r.major() == 3 {
		msg = fmt.Sprintf("Error: Unable to complete diagnostic for group %d. Return: (%d) %s.", 0x7fffffff, st, dcgmErrorString(st))
	}
	return DCGMRuntimeError(r.Version, r.JSON, msg), st & 0xff
}

// DCGMRuntimeError is what dcgmi diag prints for a run that could not start or complete
// (HelperDisplayFailureMessage): with -j {"DCGM Diagnostic": {"runtime_error": msg, "version"}}
// ("DCGM GPU Diagnostic" in 3.x) followed by an empty line, as dcgmi adds std::endl to
// toStyledString's newline; without -j the message alone.
func DCGMRuntimeError(version string, json bool, msg string) []byte {
	if !json {
		return []byte(msg + "\n")
	}
	name := "DCGM Diagnostic"
	if strings.HasPrefix(version, "3.") {
		name = "DCGM GPU Diagnostic"
	}
	return append(styled(jobj{name: jobj{"version": version, "runtime_error": msg}}), '\n')
}

// Severities (dcgmErrorSeverity_t) and categories (dcgmErrorCategory_t) of dcgm_errors.h.
const (
	sevIsolate = 2
	sevTriage  = 4
	sevConfig  = 5

	catSoftwareXID   = 5
	catSoftwareOther = 8
	catHardwareMem   = 10
)

// dcgmError is one error of a test on the GPU: dcgm_errors.h's code, severity and category, the
// full message, and for the software test the subtest that found it (3.x shows each subtest as
// a test of its own).
type dcgmError struct {
	msg                      string
	code, severity, category int
	subtest                  string
}

// Results, as dcgmDiagResult_t has them; warn is printed "Fail" in JSON.
const (
	resPass = "Pass"
	resSkip = "Skip"
	resWarn = "Warn"
	resFail = "Fail"
)

type dcgmTest struct {
	plugin
	result string
	errs   []dcgmError
}

// plugin is one nvvs test: its 4.x name (the plugin's), its 3.x JSON and text names, its
// category and the lowest run level that runs it.
type plugin struct {
	name, name3, text3, category string
	level                        int
}

// plugins are the tests by run level (nvvs FillTestVectors: medium adds memory and pcie, long
// diagnostic and the stress tests, xlong memtest and pulse_test), in 4.x's category order.
var plugins = []plugin{
	{"software", "", "", "Deployment", 1},
	{"memory", "GPU Memory", "GPU Memory", "Hardware", 2},
	{"diagnostic", "Diagnostic", "diagnostic", "Hardware", 3},
	{"pulse_test", "Pulse Test", "pulse_test", "Hardware", 4},
	{"pcie", "PCIe", "pcie", "Integration", 2},
	{"targeted_stress", "Targeted Stress", "targeted_stress", "Stress", 3},
	{"targeted_power", "Targeted Power", "targeted_power", "Stress", 3},
	{"memory_bandwidth", "Memory Bandwidth", "memory_bandwidth", "Stress", 3},
	{"memtest", "Memtest", "memtest", "Stress", 4},
}

// softwareSubtests are the software test's checks as 3.x shows them (Diag.cpp levelOneTests,
// without the CUDA runtime check no run makes).
var softwareSubtests = []string{"Denylist", "NVML Library", "CUDA Main Library", "Permissions and OS Blocks", "Persistence Mode",
	"Environment Variables", "Page Retirement/Row Remap", "Graphics Processes", "Inforom"}

// tests runs the level's tests on the GPU's state. A latent fault shows only under load: the
// memory test (level 2) and the diagnostic (level 3) find it, the software checks of level 1
// do not. fail fails the memory test, or at level 1 the software check of the row remapper.
func (r DCGMRun) tests() []dcgmTest {
	g, st := r.GPU, r.State
	var out []dcgmTest
	for _, p := range plugins {
		if p.level > max(r.Level, 1) {
			continue
		}
		t := dcgmTest{plugin: p, result: resPass}
		switch {
		case st.Word == DiagSkip:
			t.result = resSkip
		case p.name == "software" && st.Word == DiagConfig:
			t.result = resWarn // the plugin's SetResult(NVVS_RESULT_WARN)
			t.errs = []dcgmError{{fmt.Sprintf("Persistence mode for GPU %d is disabled. Enable persistence mode by running \"nvidia-smi -i <gpuId> -pm 1 \" as root.", g),
				29, sevConfig, catSoftwareOther, "Persistence Mode"}}
		case p.name == "software" && st.Word == DiagFail && r.Level <= 1:
			t.result = resFail
			t.errs = []dcgmError{{fmt.Sprintf("GPU %d had uncorrectable memory errors and row remapping failed. Run a field diagnostic on the GPU.", g),
				80, sevIsolate, catHardwareMem, "Page Retirement/Row Remap"}}
		case (p.name == "memory" || p.name == "diagnostic") && st.LatentXID != 0:
			t.result, t.errs = resFail, latentErrors(st.LatentXID, g)
		case p.name == "memory" && st.Word == DiagFail:
			t.result = resFail
			t.errs = []dcgmError{{fmt.Sprintf("A memory mismatch was detected on GPU %d, but no error was reported by CUDA or NVML. Run a field diagnostic on the GPU.", g),
				58, sevIsolate, catHardwareMem, ""}}
		}
		out = append(out, t)
	}
	return out
}

// latentErrors are what nvvs's DcgmRecorder reports of an XID seen while a test ran: the XID
// (DCGM_FR_XID_ERROR, severity TRIAGE), after the field it raised: XID 48, a double-bit ECC
// error, raises the volatile DBE total (DCGM_FR_DBE_VIOLATION, ISOLATE); XID 95 has a message of
// its own (DCGM_FR_UNCONTAINED_ERROR, ISOLATE).
func latentErrors(xid uint32, g int) []dcgmError {
	xidErr := dcgmError{fmt.Sprintf("Detected XID %d for GPU %d Please consult the documentation for details of this XID.", xid, g), 101, sevTriage, catSoftwareXID, ""}
	switch xid {
	case 48:
		return []dcgmError{{fmt.Sprintf("Detected 1 ecc_dbe_volatile_total for GPU %d Run a field diagnostic on the GPU.", g), 103, sevIsolate, catHardwareMem, ""}, xidErr}
	case 95:
		return []dcgmError{{"GPU had an uncontained error (XID 95) Drain the GPU and reset it or reboot the node.", 81, sevIsolate, catSoftwareXID, ""}}
	}
	return []dcgmError{xidErr}
}

// failureResult4 is 4.x's GetFailureResult: an error of a software test or on a GPU (all of
// these are) makes NVVS_ERROR, whatever the result that carries it, and one of severity
// ISOLATE makes NVVS_ISOLATE_ERROR.
func failureResult4(tests []dcgmTest) int {
	code := DCGMExitOK
	for _, t := range tests {
		for _, e := range t.errs {
			if e.severity == sevIsolate {
				return DCGMExitIsolate
			}
			code = DCGMExitNVVSError
		}
	}
	return code
}

// failureResult3 is 3.x's: only results that failed count (a warning, such as persistence mode
// off, is printed "Fail" in JSON and exits 0), each failed one NVVS_ERROR at least, ISOLATE if
// one of its errors is.
func failureResult3(tests []dcgmTest) int {
	code := DCGMExitOK
	for _, t := range tests {
		if t.result != resFail {
			continue
		}
		for _, e := range t.errs {
			if e.severity == sevIsolate {
				return DCGMExitIsolate
			}
		}
		code = DCGMExitNVVSError
	}
	return code
}
