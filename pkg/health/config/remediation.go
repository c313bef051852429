package config

import (
	"cmp"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health/validation"
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
	// Validation tests a repaired GPU actively before it goes back into service (off by
	// default: a repaired GPU returns after a passive probation).
	Validation ValidationConfig `yaml:"validation,omitempty" json:"validation,omitempty"`
}

// ValidationConfig is `remediation.validation`: after every successful reset (and after a
// reboot, or on request) the agent runs Command on the one GPU and returns it to service only on
// a pass read in Format; a failure is a failed repair attempt, and a run that gives no verdict
// keeps the GPU out and is retried (docs/remediation.md, "Verify before return").
type ValidationConfig struct {
	Enabled bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Command tests one GPU: {uuid}, {index}, {dcgmID} (DCGM's id of the GPU, from `dcgmi
	// discovery -l`), {pciBusID}, {node} and {hostIP} (the node's IP, $HOST_IP) are replaced in
	// every argument; it must name the GPU (default: dcgmi diag -r 2 -i gpu:{dcgmID} -j).
	Command []string `yaml:"command,omitempty" json:"command,omitempty"`
	// Format is how the verdict is read: dcgm (the JSON of dcgmi diag -j, DCGM 3.x and 4.x, and
	// its exit code; the default) or exitCode (0 passes, anything else fails).
	Format string `yaml:"format,omitempty" json:"format,omitempty"`
	// Timeout bounds one run; a run killed at it gives no verdict (default 15m).
	Timeout *Duration `yaml:"timeout,omitempty" json:"timeout,omitempty"`
	// AfterReboot validates, after a reboot, every GPU that was Unhealthy, given up on or to be
	// replaced before it, before it is offered again (default true).
	AfterReboot *bool `yaml:"afterReboot,omitempty" json:"afterReboot,omitempty"`
	// Probation is how long a GPU that passed stays on probation before it goes back into
	// service (default: remediation.probation; 0s skips it).
	Probation *Duration `yaml:"probation,omitempty" json:"probation,omitempty"`
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
	// DefaultValidationTimeout bounds one validation run: DCGM's level 2 takes about 2 minutes,
	// level 3 about 15.
	DefaultValidationTimeout = 15 * time.Minute
	MaxValidationTimeout     = 24 * time.Hour
	// HostIPPlaceholder is replaced by the node's IP ($HOST_IP, the downward API's
	// status.hostIP) in the validation command: the GPU operator's DCGM host engine listens
	// there (port 5555).
	HostIPPlaceholder = "{hostIP}"
)

// DefaultValidationCommand is DCGM's level-2 diagnostic (about 2 minutes) of one GPU, with JSON
// output, on the local host engine.
func DefaultValidationCommand() []string {
	return []string{"dcgmi", "diag", "-r", "2", "-i", "gpu:" + validation.PlaceholderDCGMID, "-j"}
}

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
	r.Validation = r.Validation.withDefaults(time.Duration(*r.Probation))
	return r
}

func (v ValidationConfig) withDefaults(probation time.Duration) ValidationConfig {
	if len(v.Command) == 0 {
		v.Command = DefaultValidationCommand()
	}
	v.Command = slices.Clone(v.Command)
	v.Format = cmp.Or(v.Format, string(validation.FormatDCGM))
	if v.Timeout == nil {
		d := Duration(DefaultValidationTimeout)
		v.Timeout = &d
	}
	if v.AfterReboot == nil {
		on := true
		v.AfterReboot = &on
	}
	if v.Probation == nil {
		d := Duration(probation)
		v.Probation = &d
	}
	return v
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
	r.Validation.validate(r.Enabled, bad)
}

func (v ValidationConfig) validate(remediation bool, bad func(path, format string, args ...any)) {
	if v.Enabled && !remediation {
		bad("remediation.validation.enabled", "validation is a step of remediation: set remediation.enabled: true as well")
	}
	if v.Command != nil {
		switch {
		case len(v.Command) == 0 || strings.TrimSpace(v.Command[0]) == "":
			bad("remediation.validation.command", "must start with the program to run")
		case !validation.NamesGPU(v.Command):
			bad("remediation.validation.command", "must name the GPU: put %s, %s, %s or %s in an argument (dcgmi diag takes -i gpu:%s)",
				validation.PlaceholderDCGMID, validation.PlaceholderUUID, validation.PlaceholderIndex, validation.PlaceholderPCIBusID, validation.PlaceholderDCGMID)
		}
	}
	if v.Format != "" {
		if _, err := validation.ParseFormat(v.Format); err != nil {
			bad("remediation.validation.format", "%v", err)
		}
	}
	if d := v.Timeout; d != nil && (time.Duration(*d) < time.Second || time.Duration(*d) > MaxValidationTimeout) {
		bad("remediation.validation.timeout", "must be between 1s and %v, got %v", MaxValidationTimeout, time.Duration(*d))
	}
	if d := v.Probation; d != nil && time.Duration(*d) < 0 {
		bad("remediation.validation.probation", "must not be negative, got %v", time.Duration(*d))
	}
}
