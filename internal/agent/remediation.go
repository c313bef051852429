package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/internal/report/metrics"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// RemediationOptions turn on per-GPU remediation (docs/remediation.md).
type RemediationOptions struct {
	Config config.RemediationConfig
	// Resetter resets the backend's GPUs (the simulator itself, or the NVML backend's command).
	Resetter gpu.Resetter
	// Poll is how often a waiting repair asks again who holds its GPU (the sampling interval).
	Poll time.Duration
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
	// frees itself.
	hold := mc.ResetTimeout + mc.Probation + time.Minute
	ctrl, err := remediation.New(ctx, remediation.Options{
		NodeName: opts.NodeName, Config: mc, Poll: r.Poll, Clock: opts.Clock, Holders: holders,
		Slots:    remediation.NewBudget(opts.Client, cfg.Namespace, opts.NodeName, *cfg.MaxConcurrent, hold, opts.Clock),
		Resetter: r.Resetter, StatePath: statePath, BootID: opts.BootID, Recorder: w.recorder, NodeRef: w.nodeRef,
		Observer: m, Changed: w.fan.repairsChanged, Components: components, Pauser: pauser,
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
