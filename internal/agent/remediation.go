package agent

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/record"

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
// nothing when remediation is off. changed is called when the repair states change.
func newRemediation(ctx context.Context, opts Options, agentCfg config.AgentConfig, caches sharedCaches, reg prometheus.Registerer,
	recorder record.EventRecorder, nodeRef *corev1.ObjectReference, wopts report.WriterOptions, changed func(),
) (*remediation.Controller, *report.Writer, error) {
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
	statePath := ""
	if cp := agentCfg.CheckpointPath; cp != "" && cp != "-" {
		statePath = filepath.Join(filepath.Dir(cp), remediation.StateFileName)
	}
	m := metrics.NewRemediation(opts.NodeName)
	if err := m.Register(reg); err != nil {
		return nil, nil, fmt.Errorf("agent: register remediation metrics: %w", err)
	}
	// A slot is held from the reset to the end of probation; past that (an agent that died) it
	// frees itself.
	hold := mc.ResetTimeout + mc.Probation + time.Minute
	ctrl, err := remediation.New(ctx, remediation.Options{
		NodeName: opts.NodeName, Config: mc, Poll: r.Poll, Clock: opts.Clock, Holders: holders,
		Slots:    remediation.NewBudget(opts.Client, cfg.Namespace, opts.NodeName, *cfg.MaxConcurrent, hold, opts.Clock),
		Resetter: r.Resetter, StatePath: statePath, BootID: opts.BootID, Recorder: recorder, NodeRef: nodeRef,
		Observer: m, Changed: changed,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	w := report.NewWriter(remediation.NewAnnotationSyncer(opts.Client, caches.nodes, ctrl.States, mc.MaxAttempts), wopts)
	return ctrl, w, nil
}
