package config

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"time"
)

// RemediationConfig is the top-level `remediation` section: the agent resets a GPU whose faults a
// GPU reset clears, once nothing holds it, within a cluster-wide budget, verifies it over a
// probation period and gives up after MaxAttempts (see docs/remediation.md). Off by default.
type RemediationConfig struct {
	Enabled bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// MaxAttempts is how many resets within Window a GPU gets before remediation gives up on it
	// (default 3).
	MaxAttempts *int `yaml:"maxAttempts,omitempty" json:"maxAttempts,omitempty"`
	// Probation is how long a reset GPU must stay free of reset-class faults before it goes back
	// into service (default 5m).
	Probation *Duration `yaml:"probation,omitempty" json:"probation,omitempty"`
	// Window is how long a reset counts as an attempt: the same GPU failing again within it
	// counts against MaxAttempts (default 1h).
	Window *Duration `yaml:"window,omitempty" json:"window,omitempty"`
	// EvictAfter, when set, asks for eviction of the pods still holding a GPU that waits for a
	// reset after this grace period, through the DeviceTaintRule's NoExecute effect (needs
	// agent.noExecute). Unset: wait for the pods to end by themselves.
	EvictAfter *Duration `yaml:"evictAfter,omitempty" json:"evictAfter,omitempty"`
	// ResetTimeout bounds a reset: the command must finish and the backend must report the
	// reset within it (default 2m).
	ResetTimeout *Duration `yaml:"resetTimeout,omitempty" json:"resetTimeout,omitempty"`
	// ResetCommand resets one GPU on the NVML backend; "{uuid}" in an argument is replaced by the
	// GPU's UUID (default: nvidia-smi --gpu-reset -i {uuid}).
	ResetCommand []string `yaml:"resetCommand,omitempty" json:"resetCommand,omitempty"`
	// MaxConcurrent is how many GPUs may be in remediation at once, cluster-wide (default 1).
	MaxConcurrent *int `yaml:"maxConcurrent,omitempty" json:"maxConcurrent,omitempty"`
	// Namespace of the remediation slot Leases (default: $POD_NAMESPACE, else gpuhealth-system).
	Namespace string `yaml:"namespace,omitempty" json:"namespace,omitempty"`
	// PodResourcesSocket is the kubelet's pod-resources socket, asked which pods hold a GPU
	// through a device plugin; "-" skips it (DRA-only nodes).
	PodResourcesSocket string `yaml:"podResourcesSocket,omitempty" json:"podResourcesSocket,omitempty"`
	// PauseOperatorComponents lets remediation pause NVIDIA's GPU operator's components on the
	// node (DCGM, dcgm-exporter, GPU feature discovery, its device plugin: the pods whose
	// nodeSelector has a nvidia.com/gpu.deploy.* label) for a reset, as the operator's own
	// managers do, and restore them after it. Off: a GPU they hold waits, saying so.
	PauseOperatorComponents bool `yaml:"pauseOperatorComponents,omitempty" json:"pauseOperatorComponents,omitempty"`
}

// Remediation defaults and limits.
const (
	DefaultRemediationAttempts   = 3
	DefaultRemediationProbation  = 5 * time.Minute
	DefaultRemediationWindow     = time.Hour
	DefaultRemediationTimeout    = 2 * time.Minute
	DefaultRemediationConcurrent = 1
	DefaultPodResourcesSocket    = "/var/lib/kubelet/pod-resources/kubelet.sock"
	// UUIDPlaceholder is replaced by the GPU's UUID in ResetCommand.
	UUIDPlaceholder       = "{uuid}"
	MaxRemediationAttempt = 100
	MaxConcurrentResets   = 10_000
)

// DefaultResetCommand is what NVIDIA documents for resetting one GPU.
func DefaultResetCommand() []string {
	return []string{"nvidia-smi", "--gpu-reset", "-i", UUIDPlaceholder}
}

// WithDefaults returns a copy with defaults filled in.
func (r RemediationConfig) WithDefaults() RemediationConfig {
	defInt := func(p **int, v int) {
		if *p == nil {
			*p = &v
		}
	}
	defDur := func(p **Duration, v time.Duration) {
		if *p == nil {
			d := Duration(v)
			*p = &d
		}
	}
	defInt(&r.MaxAttempts, DefaultRemediationAttempts)
	defInt(&r.MaxConcurrent, DefaultRemediationConcurrent)
	defDur(&r.Probation, DefaultRemediationProbation)
	defDur(&r.Window, DefaultRemediationWindow)
	defDur(&r.ResetTimeout, DefaultRemediationTimeout)
	if len(r.ResetCommand) == 0 {
		r.ResetCommand = DefaultResetCommand()
	}
	r.ResetCommand = slices.Clone(r.ResetCommand)
	r.Namespace = cmp.Or(r.Namespace, os.Getenv("POD_NAMESPACE"), DefaultBreakerNamespace)
	r.PodResourcesSocket = cmp.Or(r.PodResourcesSocket, DefaultPodResourcesSocket)
	return r
}

func (r RemediationConfig) validate(noExecute bool, bad func(path, format string, args ...any)) {
	if v := r.MaxAttempts; v != nil && (*v < 1 || *v > MaxRemediationAttempt) {
		bad("remediation.maxAttempts", "must be between 1 and %d, got %d", MaxRemediationAttempt, *v)
	}
	if v := r.MaxConcurrent; v != nil && (*v < 1 || *v > MaxConcurrentResets) {
		bad("remediation.maxConcurrent", "must be between 1 and %d, got %d", MaxConcurrentResets, *v)
	}
	positiveDur := func(path string, d *Duration, least time.Duration) {
		if d != nil && time.Duration(*d) < least {
			bad(path, "must be at least %v, got %v", least, time.Duration(*d))
		}
	}
	positiveDur("remediation.probation", r.Probation, time.Second)
	positiveDur("remediation.window", r.Window, time.Second)
	positiveDur("remediation.resetTimeout", r.ResetTimeout, time.Second)
	positiveDur("remediation.evictAfter", r.EvictAfter, 0)
	d := r.WithDefaults()
	if time.Duration(*d.Window) < time.Duration(*d.Probation) {
		bad("remediation.window", "must be at least the probation (%v), got %v", time.Duration(*d.Probation), time.Duration(*d.Window))
	}
	if r.EvictAfter != nil && !noExecute {
		bad("remediation.evictAfter", "evicts through the NoExecute taint: set agent.noExecute: true as well")
	}
	if r.ResetCommand != nil {
		switch {
		case len(r.ResetCommand) == 0 || strings.TrimSpace(r.ResetCommand[0]) == "":
			bad("remediation.resetCommand", "must start with the program to run")
		case !slices.ContainsFunc(r.ResetCommand, func(a string) bool { return strings.Contains(a, UUIDPlaceholder) }):
			bad("remediation.resetCommand", "must name the GPU: put %s in an argument", UUIDPlaceholder)
		}
	}
}
