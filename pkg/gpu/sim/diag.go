package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Active diagnostics of the simulated GPUs: what a `dcgmi diag` of a GPU finds. A GPU's
// diagnostic state is set by two scenario events and read by Backend.Diagnose and the simulated
// driver's dcgmi; nothing the passive checks sample depends on it, which is the point of a
// latent fault (NVSentinel issue #695: an idle GPU looks fine after a reset and fails under load).

// Event kinds of the diagnostic state.
const (
	// EventLatent gives the GPU a fault only an active diagnostic finds (LatentXID): no signal,
	// no NVML event, no reading changes; a reset does not cure it, only a `diag: pass` ends it.
	EventLatent EventKind = "latent"
	// EventDiag sets how the GPU's later diagnostics answer (Diag), until changed.
	EventDiag EventKind = "diag"
)

// DiagWord says how a GPU's diagnostic answers (a scenario's `diag` event).
type DiagWord string

// The words of a diag event.
const (
	// DiagPass: every test passes (exit 0); it also ends a latent fault.
	DiagPass DiagWord = "pass"
	// DiagFail: a hardware failure of severity ISOLATE (exit 205).
	DiagFail DiagWord = "fail"
	// DiagConfig: only a CONFIG finding, persistence mode off (DCGM 4.x exits 226; the GPU is
	// fine).
	DiagConfig DiagWord = "config"
	// DiagSkip: every test skipped (exit 0).
	DiagSkip DiagWord = "skip"
	// DiagHang: the diagnostic never returns until it is killed (or dcgmi's -t ends it).
	DiagHang DiagWord = "hang"
	// DiagUnreachable: the host engine does not answer (exit 235).
	DiagUnreachable DiagWord = "unreachable"
	// DiagBusy: the host engine answers that a diagnostic already runs (exit 217).
	DiagBusy DiagWord = "busy"
)

// DiagWords lists the words a diag event may give, in the order the docs list them.
var DiagWords = []DiagWord{DiagPass, DiagFail, DiagConfig, DiagSkip, DiagHang, DiagUnreachable, DiagBusy}

// DiagState is a GPU's diagnostic state: the word of its last diag event ("" is pass) and its
// latent fault (LatentXID; 0 is none).
type DiagState struct {
	Word      DiagWord `json:"word,omitempty"`
	LatentXID uint32   `json:"latentXID,omitempty"`
}

// Apply returns the state after a diag or latent event; other events leave it as it is. Resets
// and reboots change nothing: a latent fault is the hardware's, and the word is what the host
// engine answers until a scenario says otherwise.
func (s DiagState) Apply(ev Event) DiagState {
	switch ev.Kind {
	case EventLatent:
		s.LatentXID = ev.LatentXID
	case EventDiag:
		s.Word = ev.Diag
		if ev.Diag == DiagPass {
			s.LatentXID = 0 // the repair the diagnostic now confirms
		}
	}
	return s
}

type latentSpec struct {
	XID *uint32 `yaml:"xid"`
}

// diagEvent validates a latent or diag event. They are states, not faults that happen again: an
// afterReset one would mean nothing more than an at one (a latent fault survives every reset).
func diagEvent(spec eventSpec, ev *Event) error {
	if spec.AfterReset != nil {
		return fmt.Errorf("afterReset: %s is a state a reset does not change (a latent fault survives every reset); give it at", ev.Kind)
	}
	if spec.Repeat != nil {
		return fmt.Errorf("repeat: %s sets a state once", ev.Kind)
	}
	switch ev.Kind {
	case EventLatent:
		if spec.Latent.XID == nil {
			return errors.New("latent.xid: required (the XID the fault shows under load, such as 48)")
		}
		if *spec.Latent.XID == 0 {
			return errors.New("latent.xid: must be a positive XID number")
		}
		ev.LatentXID = *spec.Latent.XID
	case EventDiag:
		w := DiagWord(*spec.Diag)
		if !slices.Contains(DiagWords, w) {
			words := make([]string, len(DiagWords))
			for i, w := range DiagWords {
				words[i] = string(w)
			}
			return fmt.Errorf("diag: must be one of %s, got %q", strings.Join(words, ", "), *spec.Diag)
		}
		ev.Diag = w
	}
	return nil
}

// The sim backend's diagnostic: what Backend.Diagnose answers.
const (
	// DiagnoseLevel is the run level Backend.Diagnose runs (dcgmi diag -r 2: about two minutes
	// on a real GPU, the memory and PCIe tests under load).
	DiagnoseLevel = 2
	// SimDriverVersion is the driver version the sim backend's diagnostics report: the newest
	// profile of the simulated driver (the sim backend has no driver of its own).
	SimDriverVersion = "550.163.01"
)

// Diagnose runs the DCGM diagnostic of one GPU, as `dcgmi diag -r 2 -i gpu:<index> -j` on a
// DCGM 4.x host engine would (DCGM's GPU id is the GPU's index), and returns its output (the
// 4.x JSON document, or dcgmi's connection error) and exit code: DCGMDiag decides both from the
// GPU's diagnostic state. A GPU whose diag state is hang blocks until ctx ends and returns
// ctx.Err(). One diagnostic runs at a time, as one host engine runs one nvvs: a call while
// another runs answers as a busy host engine does. An unknown UUID (or a MIG instance's: DCGM
// tests whole GPUs) is an error. Safe for concurrent use with the backend's other methods.
func (b *Backend) Diagnose(ctx context.Context, uuid string) (output []byte, exitCode int, err error) {
	i := slices.IndexFunc(b.gpus, func(g *gpuState) bool { return !g.missing && strings.EqualFold(g.uuid, uuid) })
	if i < 0 {
		return nil, 0, fmt.Errorf("diagnose %s: no such GPU on simulated node %s", uuid, b.sc.Node)
	}
	run := DCGMRun{Version: DCGMVersion4, GPU: i, Level: DiagnoseLevel, JSON: true, Device: b.dcgmDevice(i), DriverVersion: SimDriverVersion}
	b.diagMu.Lock()
	run.State, run.Lost = b.diag[i], b.diagLost[i]
	busy := b.diagRunning
	if !busy {
		b.diagRunning = true
	}
	b.diagMu.Unlock()
	if busy {
		run.State.Word = DiagBusy
		out, code := DCGMDiag(run)
		return out, code, nil
	}
	defer func() {
		b.diagMu.Lock()
		b.diagRunning = false
		b.diagMu.Unlock()
	}()
	if run.State.Word == DiagHang && !run.Lost {
		<-ctx.Done()
		return nil, 0, ctx.Err()
	}
	out, code := DCGMDiag(run)
	return out, code, nil
}

// dcgmDevice describes GPU i as DCGM's entity list and discovery do.
func (b *Backend) dcgmDevice(i int) DCGMDevice {
	return DCGMDevice{Name: b.sc.Model, UUID: GPUUUID(b.sc.Node, i), PCIBusID: PCIBusID(i),
		Serial: b.sc.Serial(i), DeviceID: PCIDeviceID}
}

// setDiag applies a diag or latent event, and keeps whether each GPU is lost, which a diagnostic
// also needs: the Run loop owns the GPUs' readings, Diagnose reads only what diagMu guards.
func (b *Backend) setDiag(ev Event) {
	b.diagMu.Lock()
	defer b.diagMu.Unlock()
	switch ev.Kind {
	case EventLost:
		b.diagLost[ev.GPU] = true
	case EventReboot:
		clear(b.diagLost)
	default:
		b.diag[ev.GPU] = b.diag[ev.GPU].Apply(ev)
	}
}
