package kmsg

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"
)

// ProbeReport is what Probe found in a kernel log: whether this process may read it, and what the
// NVIDIA driver logged there. `gpuhealth probe --kernel-log` prints it; run in the agent's
// container, it answers whether the agent's kernel-log source can work there.
type ProbeReport struct {
	Path     string `json:"path"`
	Readable bool   `json:"readable"`
	// Error is why the log could not be opened or read; Hint what usually causes it.
	Error string `json:"error,omitempty"`
	Hint  string `json:"hint,omitempty"`
	// Records is every record read; KernelRecords those the kernel wrote (the only ones the
	// source believes). Spoofed counts NVRM lines a process wrote.
	Records       uint64 `json:"records"`
	KernelRecords uint64 `json:"kernelRecords"`
	Spoofed       uint64 `json:"spoofed"`
	// Events are the NVRM lines of the kernel the source understands (XIDs, lost GPUs, failed
	// initialisations, identity lines), oldest first, at most MaxProbeEvents (the latest).
	Events []ProbeEvent `json:"events"`
	// Malformed and Overruns are the Reader's counts.
	Malformed uint64 `json:"malformed"`
	Overruns  uint64 `json:"overruns"`
}

// ProbeEvent is one NVRM event Probe found.
type ProbeEvent struct {
	Since    time.Duration `json:"sinceBoot"`
	Kind     string        `json:"kind"`
	PCIBusID string        `json:"pciBusID,omitempty"`
	Xid      int           `json:"xid,omitempty"`
	UUID     string        `json:"uuid,omitempty"`
	Message  string        `json:"message"`
}

// MaxProbeEvents bounds ProbeReport.Events.
const MaxProbeEvents = 1000

// probeIdle is how long Probe waits for another record before it takes the buffer as read.
const probeIdle = 200 * time.Millisecond

// Probe opens the kernel log at path (DevKmsg when empty), reads every record the kernel still
// holds, and reports. A log that cannot be opened is not an error: the report says why, so that
// the caller can print it; err is only ctx's.
func Probe(ctx context.Context, path string) (ProbeReport, error) {
	if path == "" {
		path = DevKmsg
	}
	r, err := Open(path)
	if err != nil {
		return ProbeReport{Path: path, Events: []ProbeEvent{}, Error: err.Error(), Hint: Hint(err)}, nil
	}
	defer r.Close()
	return probe(ctx, path, r)
}

func probe(ctx context.Context, path string, r *Reader) (ProbeReport, error) {
	rep := ProbeReport{Path: path, Events: []ProbeEvent{}}
	for {
		readCtx, cancel := context.WithTimeout(ctx, probeIdle)
		rec, err := r.Next(readCtx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				break // the buffer is read
			}
			rep.Error, rep.Hint = err.Error(), Hint(err)
			break
		}
		rep.Records++
		if rec.Facility != FacilityKernel {
			if strings.Contains(rec.Message, "NVRM:") { // as Source.Run counts them
				rep.Spoofed++
			}
			continue
		}
		rep.KernelRecords++
		ev, ok := ParseNVRM(rec.Message)
		if !ok {
			continue
		}
		rep.Events = append(rep.Events, ProbeEvent{Since: rec.Since, Kind: ev.Kind.String(), PCIBusID: ev.PCIBusID, Xid: ev.Xid, UUID: ev.UUID, Message: rec.Message})
		if len(rep.Events) > MaxProbeEvents {
			rep.Events = rep.Events[1:]
		}
	}
	rep.Readable = rep.Error == ""
	rep.Malformed, rep.Overruns = r.Malformed(), r.Overruns()
	return rep, nil
}

// Hint says what usually causes err, an error opening or reading the kernel log, and how to fix
// it; "" when it has nothing to add.
func Hint(err error) string {
	switch {
	case errors.Is(err, ErrRelayUnreachable):
		return "no kmsg relay listens there: in the chart it is the kmsg-relay container of the agent's pod " +
			"(kubectl logs ds/gpuhealth-agent -c kmsg-relay); elsewhere run `gpuhealth kmsg-relay --socket PATH` as root"
	case errors.Is(err, ErrRelayRefused):
		return "" // the relay's reason carries its own hint
	case errors.Is(err, syscall.ENOENT):
		return "no such file: in a container, mount the host's /dev/kmsg, or read it through `gpuhealth kmsg-relay` " +
			"(the chart's kmsg-relay container)"
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Sprintf("not permitted: reading %s needs CAP_SYSLOG where the sysctl kernel.dmesg_restrict is 1, "+
			"and in a container a device rule that allows char 1:11 (an unprivileged container's default rules do not; "+
			"the chart reads it in its privileged kmsg-relay container and hands the driver's lines to the unprivileged agent)", DevKmsg)
	}
	return ""
}
