package agentcmd

import (
	"context"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/cache/nodecache"
	"github.com/gpuhealth/gpuhealth/internal/cli/cmdutil"
	"github.com/gpuhealth/gpuhealth/internal/kube"
	"github.com/gpuhealth/gpuhealth/internal/nodegpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/kmsg"
	"github.com/gpuhealth/gpuhealth/pkg/gpurecord"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// Run starts the agent as o says (o has passed Validate) and runs it until ctx ends or a loop
// fails. The steps, in order: the config and the API client; the record of an earlier image's
// release of NVML; the Node cache and, with NVML, the GPU operator's pause labels; the wait for
// the driver and the backend; the GPUs missing from it; the kernel log; the GPU resetter; the
// node's boot time; the agent's loops; and, when the driver went away, the GPU operator paused
// GPU clients or the MIG layout changed, the re-execution of this process (driverlife.go).
func Run(ctx context.Context, o Options) error {
	s, err := configure(ctx, o)
	if err != nil {
		return err
	}
	s.away = driverAwayFromEnv(klog.FromContext(ctx))
	// The Node cache every reporter reads also carries the GPU operator's pause labels.
	s.nodes = nodecache.New(s.client, o.NodeName)
	cacheCtx, stopCache := context.WithCancel(ctx)
	defer func() {
		stopCache()
		s.nodes.Shutdown()
	}()
	if err := s.watchOperatorPause(cacheCtx); err != nil {
		return err
	}
	g, err := s.openGPUs(ctx)
	if err != nil {
		return err
	}
	rem, err := s.remediation(g.opened.Backend)
	if err != nil {
		g.release()
		return err
	}
	bootTime := readBootTime(ctx)
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	if s.pause != nil {
		go whenPaused(runCtx, s.pause, stopRun)
	}
	err = agent.Run(runCtx, agent.Options{
		NodeName: o.NodeName, Client: s.client, Backend: g.opened.Backend, Policy: s.policy, BootID: g.opened.BootID,
		BootTime: bootTime, Agent: s.agentCfg, MetricsAddress: o.MetricsAddress, KernelLog: g.kernelLog, Remediation: rem,
		Nodes: s.nodes, Missing: g.missing, StartEvents: g.events, Records: s.records, RepeatOffender: s.repeatOffender,
	})
	// Every loop has returned: NVML is shut down here, whatever comes next.
	g.release()
	if ctx.Err() != nil {
		return err
	}
	return reexecAfter(ctx, context.Cause(runCtx), err)
}

// start is what the agent's start-up found so far, for its next steps.
type start struct {
	o        Options
	cfg      *config.HealthConfig
	policy   *health.Policy
	agentCfg config.AgentConfig
	client   kube.Interface
	// away is since when and why an earlier image of this process released NVML (nil: it did
	// not).
	away  *driverAway
	nodes *nodecache.Cache
	// pause follows the GPU operator's pause labels (nil with the simulator).
	pause *nodegpu.OperatorPause
	// records are read, when the agent starts, for fleet.repeatOffender (nil without it).
	records        kube.GPURecordInterface
	repeatOffender gpurecord.RepeatOffenderRule
}

// configure loads the config file and makes the API client.
func configure(ctx context.Context, o Options) (*start, error) {
	cfg, policy, err := cmdutil.LoadConfig(o.Config)
	if err != nil {
		return nil, err
	}
	s := &start{o: o, cfg: cfg, policy: policy, agentCfg: cfg.AgentSection()}
	if o.Checkpoint != "" {
		s.agentCfg.CheckpointPath = o.Checkpoint
	}
	restConfig, err := cmdutil.ComponentConfig(o.Kubeconfig, "gpuhealth", agent.ClientQPS, agent.ClientBurst)
	if err != nil {
		return nil, cmdutil.BadInput(err)
	}
	if s.client, err = kube.NewForConfig(restConfig); err != nil {
		return nil, cmdutil.BadInput(err)
	}
	if r := cfg.Fleet.RepeatOffender; r != nil {
		s.repeatOffender = gpurecord.RepeatOffenderRule{Faults: r.Faults, Within: r.Window(), ReplaceGPU: r.ReplaceGPU}
		if s.records, err = kube.NewGPURecords(restConfig); err != nil {
			return nil, cmdutil.BadInput(err)
		}
	}
	return s, nil
}

// watchOperatorPause follows the GPU operator's pause labels through the Node cache and starts
// the cache, with NVML only: the simulator holds no file of a driver.
func (s *start) watchOperatorPause(ctx context.Context) error {
	if s.o.Backend != "nvml" {
		return nil
	}
	var err error
	if s.pause, err = nodegpu.WatchOperatorPause(s.nodes); err != nil {
		return err
	}
	// In the background: an API server that does not answer yet must not keep the agent from
	// serving /healthz while it waits for the driver (the pause is read live until the cache is
	// filled, and a Node that cannot be read pauses nothing).
	go func() {
		if err := s.nodes.Start(ctx); err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).Error(err, "Watching this node's GPU operator labels")
		}
	}()
	return nil
}

// gpus are the GPUs the agent watches: the backend, placeholders for the GPUs missing from it,
// and the kernel log read beside it.
type gpus struct {
	opened    nodegpu.Opened
	missing   []health.Device
	kernelLog *kmsg.Companion
	// events are what finding them has to tell on the Node: the GPUs left out of the inventory.
	events []agent.Event
}

// release closes the kernel log and the backend.
func (g gpus) release() {
	g.kernelLog.Close()
	g.opened.Close()
}

// openGPUs opens the backend, once NVML is there and the GPU operator lets GPU clients run
// (without NVML yet, the driver container still starting say, or while the operator pauses GPU
// clients, the agent waits), then finds the GPUs missing from it and those another driver holds
// (an Event for the agent to record), and opens the kernel log.
func (s *start) openGPUs(ctx context.Context) (gpus, error) {
	w := driverWait{node: s.o.NodeName, client: s.client, metricsAddress: s.o.MetricsAddress, pause: s.pause, away: s.away}
	opened, err := waitForDriver(ctx, w, func() (nodegpu.Opened, error) {
		return nodegpu.Open(ctx, nodegpu.Options{BackendFlags: s.o.BackendFlags, Node: s.o.NodeName, Config: s.cfg, NVML: &s.o.NVML})
	})
	if err != nil {
		return gpus{}, err
	}
	missing, leftOut := nodegpu.MissingGPUs(ctx, s.cfg.Inventory, s.o.Backend, opened.Backend)
	g := gpus{opened: opened, missing: missing}
	if len(leftOut) > 0 {
		g.events = append(g.events, agent.Event{Type: corev1.EventTypeNormal, Reason: nodegpu.EventGPUBoundToOtherDriver, Message: nodegpu.LeftOutMessage(leftOut)})
	}
	// The kernel log names GPUs by address: lines about a missing one are kept against it.
	g.kernelLog = nodegpu.OpenKernelLog(ctx, s.cfg, s.o.Backend, slices.Concat(opened.Backend.Devices(), g.missing), opened.BootID)
	return g, nil
}

// remediation readies the repairs the config turns on: the backend's GPU resetter, and the
// simulator's own test of its GPUs.
func (s *start) remediation(be nodegpu.ResettingBackend) (agent.RemediationOptions, error) {
	rem := agent.RemediationOptions{Config: s.cfg.Remediation, Poll: s.cfg.SampleEvery()}
	if !rem.Config.Enabled {
		return rem, nil
	}
	var err error
	if rem.Resetter, err = be.Resetter(rem.Config.WithDefaults().ResetCommand); err != nil {
		return rem, cmdutil.BadInput(fmt.Errorf("remediation.resetCommand: %w", err))
	}
	// The simulator tests its GPUs itself; real GPUs run the validation command.
	rem.Diagnoser, _ = be.(gpu.Diagnoser)
	return rem, nil
}

// readBootTime is when the node booted: zero, with an error logged, when it cannot be read.
func readBootTime(ctx context.Context) time.Time {
	bootTime, err := agent.ReadBootTime()
	if err != nil {
		klog.FromContext(ctx).Error(err, "No boot time: faults will not be restored from the node if the checkpoint is lost")
	}
	return bootTime
}
