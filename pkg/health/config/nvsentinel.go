package config

// NVSentinelConfig is `agent.nvsentinel`: the nvsentinel reporter (agent.reporters) sends every
// GPU fault to NVIDIA NVSentinel's platform-connector as a health event (docs/nvsentinel.md).
type NVSentinelConfig struct {
	// Socket is the platform-connector's Unix socket (default
	// /var/run/nvsentinel/nvsentinel.sock, where NVSentinel's chart puts it on the host).
	Socket string `yaml:"socket,omitempty" json:"socket,omitempty"`
	// Remediation says who repairs GPUs (default gpuhealth): gpuhealth (its own remediation,
	// where enabled; NVSentinel is asked not to drain or remediate what gpuhealth repairs) or
	// nvsentinel (gpuhealth only reports; remediation.enabled must be false).
	Remediation string `yaml:"remediation,omitempty" json:"remediation,omitempty"`
	// RebootAction is what a fault that needs a reboot asks of NVSentinel: RESTART_BM or
	// RESTART_VM. Empty: RESTART_VM when the CPU says it runs under a hypervisor, else RESTART_BM.
	RebootAction string `yaml:"rebootAction,omitempty" json:"rebootAction,omitempty"`
}

// Values of NVSentinelConfig's fields.
const (
	DefaultNVSentinelSocket         = "/var/run/nvsentinel/nvsentinel.sock"
	NVSentinelRemediationGPUHealth  = "gpuhealth"
	NVSentinelRemediationNVSentinel = "nvsentinel"
	NVSentinelRebootBareMetal       = "RESTART_BM"
	NVSentinelRebootVirtualMachine  = "RESTART_VM"
)

// WithDefaults returns a copy with defaults filled in.
func (n NVSentinelConfig) WithDefaults() NVSentinelConfig {
	if n.Socket == "" {
		n.Socket = DefaultNVSentinelSocket
	}
	if n.Remediation == "" {
		n.Remediation = NVSentinelRemediationGPUHealth
	}
	return n
}

func (n NVSentinelConfig) validate(bad func(path, format string, args ...any)) {
	if s := n.Socket; s != "" {
		validSocketPath("agent.nvsentinel.socket", s, DefaultNVSentinelSocket,
			" (NVSentinel's platform-connector listens on "+DefaultNVSentinelSocket+" on the host)", bad)
	}
	switch n.Remediation {
	case "", NVSentinelRemediationGPUHealth, NVSentinelRemediationNVSentinel:
	default:
		bad("agent.nvsentinel.remediation", "must be %s or %s (who repairs GPUs), got %q", NVSentinelRemediationGPUHealth, NVSentinelRemediationNVSentinel, n.Remediation)
	}
	switch n.RebootAction {
	case "", NVSentinelRebootBareMetal, NVSentinelRebootVirtualMachine:
	default:
		bad("agent.nvsentinel.rebootAction", "must be %s, %s or empty (detected), got %q", NVSentinelRebootBareMetal, NVSentinelRebootVirtualMachine, n.RebootAction)
	}
}

// validateRepairer refuses two repairers: with agent.nvsentinel.remediation nvsentinel,
// NVSentinel resets and reboots, and gpuhealth's own remediation would reset the same GPUs.
func (n NVSentinelConfig) validateRepairer(remediationEnabled bool, bad func(path, format string, args ...any)) {
	if n.Remediation == NVSentinelRemediationNVSentinel && remediationEnabled {
		bad("agent.nvsentinel.remediation", "is nvsentinel (NVSentinel repairs GPUs), but remediation.enabled is true: both would reset the same GPUs; set remediation.enabled: false, or agent.nvsentinel.remediation: gpuhealth")
	}
}
