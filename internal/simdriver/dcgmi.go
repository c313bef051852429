package simdriver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// The simulated driver's dcgmi: NVIDIA's DCGM command line as far as validating a GPU needs it,
// `dcgmi diag` of one GPU and `dcgmi discovery -l`, answering from the simulator of a driver
// root. It parses dcgmi's own diag options (dcgmi/CommandLineParser.cpp: 4.x's -i/--entity-id
// and deprecated --gpuList, 3.x's -i/--gpuList), asks the simulator, prints what DCGM would and
// exits with DCGM's status (pkg/gpu/sim's DCGMDiag). Every call is appended to the driver root's
// DCGMICallsLog, so a test can tell which GPUs were ever asked for.

// DCGMICallsLog is the file in the driver root that gets one line per dcgmi call: the time
// (RFC 3339, UTC) and the command line, "dcgmi diag -r 2 -i gpu:2 -j".
const DCGMICallsLog = "dcgmi-calls.log"

// DCGMIPath is where Serve installs its dcgmi in the driver root.
const DCGMIPath = "usr/bin/dcgmi"

// dcgmiExitInterrupted is dcgmi's status when a signal ends it (its sig_handler: 128 + the
// signal), here SIGTERM's: the context ends on SIGINT or SIGTERM alike.
const dcgmiExitInterrupted = 128 + 15

const dcgmiUsage = `Usage: dcgmi --driver-root DIR [--dcgm-version 4.2.3|3.3.9] SUBSYSTEM ...
  dcgmi diag -r 1|2|3|4 -i gpu:ID|ID [-j] [-t SECONDS] [--host HOST] [...]
  dcgmi discovery -l
The gpuhealth simulated driver's dcgmi: a DCGM diagnostic of one simulated GPU, answered by the
simulator serving DIR (docs/nvml.md, "The simulated driver").
`

// DCGMI runs the simulated dcgmi with args (what follows `gpuhealth sim-driver dcgmi`:
// --driver-root DIR, optionally --dcgm-version V, then dcgmi's own subsystem and options), and
// returns its exit status.
func DCGMI(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help") {
		fmt.Fprint(stdout, dcgmiUsage)
		return sim.DCGMExitOK
	}
	root, version := "", sim.DCGMVersion4
	for len(args) > 0 && strings.HasPrefix(args[0], "--") {
		name, value, inline := strings.Cut(args[0], "=")
		if name != "--driver-root" && name != "--dcgm-version" {
			break
		}
		if !inline {
			if len(args) < 2 {
				fmt.Fprintf(stderr, "Error: %s needs a value.\n", name)
				return sim.DCGMExitUsage
			}
			value, args = args[1], args[1:]
		}
		args = args[1:]
		if name == "--driver-root" {
			root = value
		} else {
			version = value
		}
	}
	if root == "" {
		fmt.Fprint(stderr, "Error: --driver-root is required.\n"+dcgmiUsage)
		return sim.DCGMExitUsage
	}
	if !strings.HasPrefix(version, "3.") && !strings.HasPrefix(version, "4.") {
		fmt.Fprintf(stderr, "Error: --dcgm-version %q: the simulated dcgmi speaks DCGM 3.x and 4.x (%s, %s).\n", version, sim.DCGMVersion3, sim.DCGMVersion4)
		return sim.DCGMExitUsage
	}
	logDCGMICall(root, args, stderr)
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, dcgmiUsage)
		return sim.DCGMExitOK
	}
	socket := findSocket(root)
	switch args[0] {
	case "diag":
		return dcgmiDiag(ctx, socket, version, args[1:], stdout, stderr)
	case "discovery":
		return dcgmiDiscovery(ctx, socket, args[1:], stdout, stderr)
	}
	// ProcessCommandLine's answer to a subsystem it does not know (the simulated dcgmi knows two).
	fmt.Fprint(stdout, "ERROR: Invalid subsystem.\n\n"+dcgmiUsage)
	return sim.DCGMExitBadParam
}

// logDCGMICall appends the call to the driver root's calls log. A log that cannot be written is
// said on stderr and does not stop the call.
func logDCGMICall(root string, args []string, stderr io.Writer) {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = shellQuote(a)
	}
	line := time.Now().UTC().Format(time.RFC3339Nano) + " dcgmi " + strings.Join(quoted, " ") + "\n"
	f, err := os.OpenFile(filepath.Join(root, DCGMICallsLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err == nil {
		_, err = f.WriteString(line) // one write of a short line: lines of concurrent calls do not mix
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintf(stderr, "gpuhealth simulated dcgmi: the calls log: %v\n", err)
	}
}

func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-:,./=@%+") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// dcgmiDiag runs `dcgmi diag`.
func dcgmiDiag(ctx context.Context, socket, version string, args []string, stdout, stderr io.Writer) int {
	major := 4
	if strings.HasPrefix(version, "3.") {
		major = 3
	}
	got, uerr := parseOpts(diagOpts(major), args)
	if uerr != nil {
		return uerr.print(stderr)
	}
	if _, ok := got["help"]; ok {
		fmt.Fprint(stdout, dcgmiUsage)
		return sim.DCGMExitOK
	}
	run := sim.DCGMRun{Version: version, Host: optValue(got, "host", ""), JSON: len(got["json"]) > 0}
	level, timeout, uerr := diagLevelAndTimeout(got, major)
	if uerr != nil {
		return uerr.print(stderr)
	}
	run.Level = level
	entityOpt := "entity-id"
	if major == 3 {
		entityOpt = "gpuList"
	}
	entities, uerr := diagEntities(got, major, entityOpt)
	if uerr != nil {
		return uerr.print(stderr)
	}
	run.Entities = entities
	// The entity list is parsed once connected (RunDiagOnce), so a host engine that does not
	// answer is what a bad list meets first.
	gpu, msg := parseEntity(ctx, socket, entities, major)
	if msg != "" {
		if err := ask(ctx, socket, &request{Op: opDiscovery}, nil, &discoveryReply{}); err != nil {
			return dcgmiUnreachable(ctx, run, err, stdout)
		}
		fmt.Fprint(stdout, string(sim.DCGMRuntimeError(version, run.JSON, msg)))
		return sim.DCGMExitBadParam
	}
	run.GPU = gpu
	cmdline := "dcgmi diag " + strings.Join(args, " ")
	var reply diagReply
	if err := ask(ctx, socket, &request{Op: opDiag, Dev: uint32(gpu), A: uint32(level), B: timeout}, []byte(cmdline), &reply); err != nil {
		return dcgmiUnreachable(ctx, run, err, stdout)
	}
	run.State, run.Lost, run.Device, run.DriverVersion = reply.State, reply.Lost, reply.Device, reply.DriverVersion
	switch reply.Outcome {
	case diagBusy:
		run.State, run.Lost = sim.DiagState{Word: sim.DiagBusy}, false
	case diagKilled:
		run.State = sim.DiagState{Word: sim.DiagHang}
	case diagNoGPU:
		run.NoSuchGPU = true
	}
	out, code := sim.DCGMDiag(run)
	_, _ = stdout.Write(out)
	return code
}

// dcgmiUnreachable answers a request the simulator did not: dcgmi's connection error, or the
// status of a dcgmi a signal ended.
func dcgmiUnreachable(ctx context.Context, run sim.DCGMRun, err error, stdout io.Writer) int {
	if ctx.Err() != nil && !errors.Is(err, errUnreachable) {
		return dcgmiExitInterrupted
	}
	run.State = sim.DiagState{Word: sim.DiagUnreachable}
	out, code := sim.DCGMDiag(run)
	_, _ = stdout.Write(out)
	return code
}

// dcgmiDiscovery runs `dcgmi discovery -l` (Query::DisplayDiscoveredDevices): the GPUs by DCGM
// id with name, PCI bus ID and UUID, then no NvSwitch, no ConnectX and no CPU.
func dcgmiDiscovery(ctx context.Context, socket string, args []string, stdout, stderr io.Writer) int {
	got, uerr := parseOpts([]dcgmiOpt{{"l", "list", false}, {"", "host", true}, {"h", "help", false}}, args)
	if uerr != nil {
		return uerr.print(stderr)
	}
	if _, ok := got["help"]; ok || len(got["list"]) == 0 {
		fmt.Fprint(stdout, dcgmiUsage)
		return sim.DCGMExitOK
	}
	var d discoveryReply
	if err := ask(ctx, socket, &request{Op: opDiscovery}, nil, &d); err != nil {
		return dcgmiUnreachable(ctx, sim.DCGMRun{Host: optValue(got, "host", "")}, err, stdout)
	}
	var b strings.Builder
	plural := func(n int, one, many string) string {
		if n == 1 {
			return one
		}
		return many
	}
	fmt.Fprintf(&b, "%d %s found.\n", len(d.GPUs), plural(len(d.GPUs), "GPU", "GPUs"))
	columns(&b, []int{8, 70}, []string{"GPU ID", "Device Information"}, func(row func(...string)) {
		for i, g := range d.GPUs {
			if i > 0 {
				row() // a line between GPUs (DCGMI_OUTPUT_OPTIONS_SEPARATE_SECTIONS)
			}
			row(strconv.Itoa(i), "Name: "+g.Name)
			row("", "PCI Bus ID: "+g.PCIBusID)
			row("", "Device UUID: "+g.UUID)
		}
	})
	b.WriteString("0 NvSwitches found.\n")
	columns(&b, []int{11}, []string{"Switch ID"}, func(func(...string)) {})
	b.WriteString("0 ConnectX found.\n")
	columns(&b, []int{10}, []string{"ConnectX"}, func(func(...string)) {})
	b.WriteString("0 CPUs found.\n")
	columns(&b, []int{8, 70}, []string{"CPU ID", "Device Information"}, func(func(...string)) {})
	fmt.Fprint(stdout, b.String())
	return sim.DCGMExitOK
}

// columns writes a DcgmiOutputColumns table: a line, the labels, a line, the rows (row() with no
// cells draws a line), a line.
func columns(b *strings.Builder, widths []int, labels []string, rows func(row func(...string))) {
	line := "+"
	for _, w := range widths {
		line += strings.Repeat("-", w) + "+"
	}
	line += "\n"
	row := func(cells ...string) {
		if len(cells) == 0 {
			b.WriteString(line)
			return
		}
		for i, w := range widths {
			sep := " | "
			if i == 0 {
				sep = "| "
			}
			fmt.Fprintf(b, "%s%-*s", sep, w-2, cells[i])
		}
		b.WriteString(" |\n")
	}
	b.WriteString(line)
	row(labels...)
	b.WriteString(line)
	rows(row)
	b.WriteString(line)
}
