// Package nvsentinel is the agent's reporter to NVIDIA NVSentinel (agent.reporters: [...,
// nvsentinel]; docs/nvsentinel.md): a report.Syncer around pkg/nvsentinel's Publisher, which
// maps every GPU condition to a health event and delivers it to the platform-connector's socket.
// What it adds to the library is what only the agent knows: which GPUs gpuhealth's own
// remediation is repairing, whose events then ask NVSentinel not to act
// (agent.nvsentinel.remediation: gpuhealth), and the Remediation condition the agent lays over a
// GPU under repair, sent in the GpuHealthRepair check.
//
// Delivery never holds up the agent: the Syncer runs on its own Writer, a send is bounded by a
// timeout, and a send that fails is the Publisher's to retry, so Sync never fails. NVSentinel
// being away is no reason for the agent not to be ready; gpuhealth_nvsentinel_sends_total and
// gpuhealth_nvsentinel_pending_events say how delivery goes. Between snapshots the Writer calls
// Sync again when the Publisher asks (Pacer): after a failed send's backoff, and every probe
// period, which is how a restarted platform-connector gets the whole state again.
package nvsentinel

import (
	"context"
	"os"
	"time"

	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
	"github.com/gpuhealth/gpuhealth/internal/report"
	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
	pub "github.com/gpuhealth/gpuhealth/pkg/nvsentinel"
	"github.com/gpuhealth/gpuhealth/pkg/nvsentinel/datamodels"
)

// Name is the reporter's name.
const Name = config.ReporterNVSentinel

// Options configure a Syncer.
type Options struct {
	// Config is agent.nvsentinel; empty fields take their defaults.
	Config config.NVSentinelConfig
	// RemediationEnabled: gpuhealth's own remediation runs (remediation.enabled).
	RemediationEnabled bool
	// Clock paces retries and probes (default: the real clock).
	Clock clock.Clock
	// Observer receives the sends, for metrics.
	Observer pub.Observer
	// CPUInfo is read to tell a virtual machine when Config.RebootAction is empty (default
	// /proc/cpuinfo).
	CPUInfo string
}

// Syncer sends the agent's snapshots to NVSentinel.
type Syncer struct {
	pub *pub.Publisher
}

var (
	_ report.Syncer  = (*Syncer)(nil)
	_ report.Starter = (*Syncer)(nil)
	_ report.Pacer   = (*Syncer)(nil)
)

// New returns a Syncer for node. It dials nothing until its first Sync.
func New(node string, opts Options) *Syncer {
	cfg := opts.Config.WithDefaults()
	m := pub.MapOptions{NodeName: node, RebootAction: rebootAction(cfg.RebootAction, opts.CPUInfo),
		Checks: map[health.ConditionType]string{remediation.ConditionRemediation: pub.CheckRepair}}
	if opts.RemediationEnabled && cfg.Remediation == config.NVSentinelRemediationGPUHealth {
		m.Repairing = Repairing
	}
	return &Syncer{pub: pub.NewPublisher(pub.Options{MapOptions: m, Socket: cfg.Socket, Clock: opts.Clock, Observer: opts.Observer})}
}

// Repairing reports whether gpuhealth's remediation is repairing the GPU d: its remediation
// condition says so (resetting, validating, on probation, waiting for another reset), or, before
// the repair begins, every fault of the GPU is one a reset clears, which remediation takes on
// (remediation.FactsOf). A GPU remediation gave up on (its condition recommends a reboot) is no
// longer: its events ask NVSentinel for the reboot.
func Repairing(d health.DeviceStatus) bool {
	for _, c := range d.Conditions {
		if c.Type == remediation.ConditionRemediation {
			return c.RecommendedAction != health.ActionRebootNode
		}
	}
	return remediation.FactsOf(d).NeedsReset
}

// rebootAction is the configured reboot action, or the detected one.
func rebootAction(configured, cpuinfo string) datamodels.RecommendedAction {
	switch configured {
	case config.NVSentinelRebootBareMetal:
		return datamodels.RecommendedAction_RESTART_BM
	case config.NVSentinelRebootVirtualMachine:
		return datamodels.RecommendedAction_RESTART_VM
	}
	if cpuinfo == "" {
		cpuinfo = "/proc/cpuinfo"
	}
	f, err := os.Open(cpuinfo)
	if err != nil {
		return datamodels.RecommendedAction_RESTART_BM
	}
	defer f.Close()
	return pub.RebootActionFor(f)
}

// Name implements report.Syncer.
func (s *Syncer) Name() string { return Name }

// Start implements report.Starter: the connection closes when the agent stops.
func (s *Syncer) Start(ctx context.Context, _ func()) error {
	context.AfterFunc(ctx, func() { _ = s.pub.Close() })
	return nil
}

// Sync implements report.Syncer: it records snap and sends what NVSentinel lacks. It writes
// nothing to the API server, and a failed send is the Publisher's to retry: it never fails.
func (s *Syncer) Sync(ctx context.Context, snap health.Snapshot) (int, error) {
	s.pub.Update(snap)
	_ = s.pub.Flush(ctx)
	return 0, nil
}

// NextSync implements report.Pacer: the retry after a failed send, or the next probe.
func (s *Syncer) NextSync() time.Time { return s.pub.NextAttempt() }
