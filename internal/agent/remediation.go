package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
)

// RemediationOptions turn on per-GPU remediation (docs/remediation.md).
type RemediationOptions struct {
	Config config.RemediationConfig
	// Resetter resets the backend's GPUs (the simulator itself, or the NVML backend's command).
	Resetter gpu.Resetter
	// Poll is how often a waiting repair asks again who holds its GPU (the sampling interval).
	Poll time.Duration
	// Diagnoser tests the backend's GPUs itself (the simulator); nil: the validation command
	// runs (remediation.validation.command), as on real GPUs.
	Diagnoser gpu.Diagnoser
}

// newRemediation builds the remediation controller and the writer of its Node annotation, or
// nothing when remediation is off. The fan-out hears when the repair states change.
func (w *wiring) newRemediation(ctx context.Context) (*remediation.Controller, *report.Writer, error) {
	opts, agentCfg, caches := w.opts, w.cfg, w.caches
	r := opts.Remediation
	if !r.Config.Enabled {
		return nil, nil, nil
	}
	if r.Resetter == nil {
		return nil, nil, errors.New("agent: remediation is enabled but the backend cannot reset GPUs")
	}
	cfg := r.Config.WithDefaults()
	mc := remediation.Config{
		MaxAttempts: *cfg.MaxAttempts, Probation: time.Duration(*cfg.Probation), Window: time.Duration(*cfg.Window),
		ResetTimeout: time.Duration(*cfg.ResetTimeout), Recheck: r.Poll,
	}
	if cfg.EvictAfter != nil {
		mc.EvictAfter = time.Duration(*cfg.EvictAfter)
	}
	val := cfg.Validation
	var validator remediation.Validator
	if val.Enabled {
		v, by, err := newValidator(val, r.Diagnoser, opts.NodeName)
		if err != nil {
			return nil, nil, fmt.Errorf("agent: %w", err)
		}
		validator, mc.ValidatedBy = v, by
		mc.Validate, mc.ValidationProbation = true, time.Duration(*val.Probation)
	}
	holders := remediation.AllHolders{
		remediation.Claims{Client: opts.Client, NodeName: opts.NodeName, Driver: agentCfg.DriverName, Devices: caches.devices},
		remediation.OperatorMaintenance{Node: caches.nodes},
	}
	if cfg.PodResourcesSocket != "-" {
		holders = append(holders, remediation.PodResources{Socket: cfg.PodResourcesSocket})
	}
	statePath, recordPath := "", ""
	if cp := agentCfg.CheckpointPath; cp != "" && cp != "-" {
		statePath = filepath.Join(filepath.Dir(cp), remediation.StateFileName)
		recordPath = filepath.Join(filepath.Dir(cp), remediation.ComponentRecordFileName)
	}
	// The GPU operator's components hold the GPUs: they are always looked for (a GPU they hold
	// waits, saying so), and paused for a reset when the user allows it.
	components := remediation.Components{Client: opts.Client, NodeName: opts.NodeName, Self: selfPod()}
	mc.PauseComponents = cfg.PauseOperatorComponents
	pauser, err := remediation.NewComponentPauser(opts.Client, opts.NodeName, recordPath)
	if err != nil {
		// An unreadable record: what it held cannot be restored; the labels stay as they are.
		klog.FromContext(ctx).Error(err, "Ignoring the record of the GPU operator's paused components", "path", recordPath)
		pauser, _ = remediation.NewComponentPauser(opts.Client, opts.NodeName, "")
	}
	m := metrics.NewRemediation(opts.NodeName)
	if err := m.Register(opts.Registry); err != nil {
		return nil, nil, fmt.Errorf("agent: register remediation metrics: %w", err)
	}
	// A slot is held from the reset to the end of probation; past that (an agent that died) it
	// frees itself. A validation confirms (or takes again) the slot before each run.
	hold := mc.ResetTimeout + mc.Probation + time.Minute
	if mc.Validate {
		// Each run confirms or takes the slot again, so a long timeout needs no longer hold
		// than the admission policy allows a slot.
		hold = min(hold+time.Duration(*val.Timeout)+mc.ValidationProbation, breaker.MaxSlotDuration)
	}
	ctrl, err := remediation.New(ctx, remediation.Options{
		NodeName: opts.NodeName, Config: mc, Poll: r.Poll, Clock: opts.Clock, Holders: holders,
		Slots:    remediation.NewBudget(opts.Client, cfg.Namespace, opts.NodeName, *cfg.MaxConcurrent, hold, opts.Clock),
		Resetter: r.Resetter, StatePath: statePath, BootID: opts.BootID, Recorder: w.recorder, NodeRef: w.nodeRef,
		Observer: m, Changed: w.fan.repairsChanged, Components: components, Pauser: pauser,
		Validator: validator, ValidationTimeout: time.Duration(*val.Timeout), Validated: w.monitor.RecordValidation,
		ValidateAfterReboot: w.monitor.Tracker().RebootRepaired(), AfterReboot: *val.AfterReboot,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	return ctrl, report.NewWriter(remediation.NewAnnotationSyncer(opts.Client, caches.nodes, ctrl.States, mc.MaxAttempts), w.writerOptions), nil
}

// selfPod is this agent's pod, "namespace/name", from the downward API ($POD_NAMESPACE,
// $POD_NAME); "" outside a pod.
func selfPod() string {
	ns, name := os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")
	if ns == "" || name == "" {
		return ""
	}
	return ns + "/" + name
}

// newValidator returns what tests a repaired GPU, and what the GPU's history says tested it: the
// backend's own diagnostic (the simulator), or the configured command, whose {hostIP} is the
// node's IP ($HOST_IP, from the downward API).
func newValidator(cfg config.ValidationConfig, diagnoser gpu.Diagnoser, node string) (remediation.Validator, string, error) {
	if diagnoser != nil {
		return diagnoserValidator{diagnoser}, string(validation.FormatDCGM) + ": simulated dcgmi diag", nil
	}
	format, err := validation.ParseFormat(cfg.Format)
	if err != nil {
		return nil, "", fmt.Errorf("remediation.validation.format: %w", err)
	}
	argv := slices.Clone(cfg.Command)
	for i, a := range argv {
		if !strings.Contains(a, config.HostIPPlaceholder) {
			continue
		}
		ip := os.Getenv("HOST_IP")
		if ip == "" {
			return nil, "", fmt.Errorf("remediation.validation.command uses %s but $HOST_IP is not set (the chart sets it from status.hostIP)", config.HostIPPlaceholder)
		}
		argv[i] = strings.ReplaceAll(a, config.HostIPPlaceholder, ip)
	}
	// What tests, for the GPU's history: the program that runs the test ("dcgm: dcgmi diag"),
	// not a loader it may run through.
	prog := filepath.Base(argv[0])
	if i := slices.Index(argv, "diag"); i > 0 {
		prog = filepath.Base(argv[i-1]) + " diag"
	}
	by := string(format) + ": " + prog
	return commandValidator{cmd: validation.Command{Argv: argv, Format: format, Timeout: time.Duration(*cfg.Timeout)}, node: node}, by, nil
}

// commandValidator runs the validation command on the node (NVML backend).
type commandValidator struct {
	cmd  validation.Command
	node string
}

func (c commandValidator) Validate(ctx context.Context, dev health.Device) validation.Verdict {
	return c.cmd.Run(ctx, dev, c.node)
}

// diagnoserValidator reads the simulated GPUs' diagnostic as DCGM's: DCGM's GPU id is the
// simulated GPU's index.
type diagnoserValidator struct{ d gpu.Diagnoser }

func (v diagnoserValidator) Validate(ctx context.Context, dev health.Device) validation.Verdict {
	out, code, err := v.d.Diagnose(ctx, dev.UUID)
	if err != nil {
		return validation.Verdict{Result: validation.Error, Message: "the diagnostic did not run: " + err.Error()}
	}
	return validation.ReadDCGM(out, code, validation.Target{DCGMID: dev.Index})
}
