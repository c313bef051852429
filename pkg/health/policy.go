package health

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// XIDRule is what the Tracker does when it sees one XID.
type XIDRule struct {
	// Severity of the condition the XID raises. Healthy means the XID is counted and visible
	// but changes nothing (application errors).
	Severity Severity
	ClearsOn ClearsOn
	Evict    bool
	Action   Action
	// FollowRecoveryAction means the XID itself raises no condition: the backend reads NVML's
	// GPU recovery action when it sees the XID, and the RecoveryAction check decides.
	FollowRecoveryAction bool
	// Description is the catalog's short name for the XID, used in condition messages.
	Description string
}

// ThresholdCheck configures a polled check that compares a reading or a rate with a limit.
type ThresholdCheck struct {
	Enabled bool
	// RecoverySamples is how many consecutive in-range samples clear the condition.
	RecoverySamples int
}

// Policy is the data that decides what signals mean. Build one with DefaultPolicy or
// DevicePluginPolicy, then adjust fields (the config package does this from a file). A Policy
// must not be changed while a Tracker uses it.
type Policy struct {
	// Name is the profile the policy came from, for messages.
	Name string
	// XIDs maps each known XID to its rule.
	XIDs map[uint32]XIDRule
	// UnknownXID applies to XIDs missing from XIDs.
	UnknownXID XIDRule
	// Lost applies when a GPU is lost (fell off the bus, GPU_IS_LOST).
	Lost XIDRule
	// ResetRequired applies when the driver says the GPU needs a reset before it can be used
	// again (NVML's ERROR_RESET_REQUIRED). A rule with Severity Healthy raises nothing.
	ResetRequired XIDRule

	// QuietPeriod ends conditions that clear on ClearsOnQuietPeriod: once this long has
	// passed since the condition's signal was last seen, the condition clears.
	QuietPeriod time.Duration

	ECC struct {
		Enabled bool
		// CorrectedStormPerMinute is the corrected (single-bit) volatile error rate above which
		// the GPU is Degraded until QuietPeriod passes without a storm.
		CorrectedStormPerMinute float64
	}
	RowRemap     struct{ Enabled bool }
	RetiredPages struct{ Enabled bool }
	Thermal      struct {
		ThresholdCheck
		// SlowdownC and ShutdownC override the device's own thresholds when non-zero; when
		// both are zero and the device reports none, DefaultSlowdownC and DefaultShutdownC apply.
		SlowdownC, ShutdownC int64
	}
	ClockEvents struct {
		ThresholdCheck
		// Reasons lists the clock-event reasons that make a GPU Degraded.
		Reasons ClockEventReasons
	}
	PCIeReplays struct {
		ThresholdCheck
		PerMinute float64
	}
	NVLink struct {
		ThresholdCheck
		// ErrorsPerMinute is the error rate, per link, above which the GPU is Degraded. A link
		// that is down makes the GPU Unhealthy regardless.
		ErrorsPerMinute float64
	}
	RecoveryAction struct{ Enabled bool }

	// Fabric judges the NVLink fabric registration: a failed one is Unhealthy, a degraded
	// fabric or one still registering RegistrationTimeout after the first reading Degraded.
	Fabric struct {
		Enabled             bool
		RegistrationTimeout time.Duration
	}
	// Early warnings: Degraded, to replace the GPU soon or inspect it, never Unhealthy.
	RowRemapHistogram struct{ Enabled bool }
	SRAM              struct{ Enabled bool }
	PCIeLink          struct {
		ThresholdCheck
		// Generation also judges the link's generation; off by default, since GPUs train
		// down to a lower generation when idle to save power.
		Generation bool
	}
	NVLinkRecoveries struct {
		Enabled bool
		// PerHour is the rise of a link's lifetime recovery count, per hour, at which it is
		// Degraded (links that keep recovering fail days later).
		PerHour float64
	}

	// Repeats judge XIDs by how often they come back (see RepeatRule); DefaultRepeatRules
	// lists the defaults.
	Repeats []RepeatRule
	// RootCauseWindow is how recent another GPU's own XID fault must be for an XID the driver
	// says an earlier XID caused to be attributed to it (XIDCausedByPrevious).
	RootCauseWindow time.Duration
	// Escalation raises ConditionReplaceGPU on a GPU whose faults keep returning after repairs.
	Escalation EscalationPolicy
}

// Defaults for the polled checks, used by DefaultPolicy.
const (
	DefaultSlowdownC               = 90
	DefaultShutdownC               = 95
	DefaultRecoverySamples         = 3
	DefaultCorrectedStormPerMinute = 1000
	DefaultQuietPeriod             = 10 * time.Minute
	DefaultPCIeReplaysPerMinute    = 60
	DefaultNVLinkErrorsPerMinute   = 60
	DefaultRootCauseWindow         = 5 * time.Minute
	DefaultFabricTimeout           = 10 * time.Minute
	DefaultNVLinkRecoveriesPerHour = 3
)

// DefaultPolicy follows NVIDIA's XID catalog and turns on every polled check.
func DefaultPolicy() *Policy {
	p := &Policy{
		Name:       "default",
		XIDs:       XIDTable(),
		UnknownXID: XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnGPUReset, Action: ActionResetGPU, Description: "unknown XID"},
		Lost:       XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnNodeReboot, Evict: true, Action: ActionRebootNode, Description: "GPU is lost"},
		ResetRequired: XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnGPUReset, Action: ActionResetGPU,
			Description: "GPU requires a reset before it can be used again"},
	}
	p.ECC.Enabled = true
	p.ECC.CorrectedStormPerMinute = DefaultCorrectedStormPerMinute
	p.QuietPeriod = DefaultQuietPeriod
	p.RowRemap.Enabled = true
	p.RetiredPages.Enabled = true
	p.Thermal.ThresholdCheck = ThresholdCheck{Enabled: true, RecoverySamples: DefaultRecoverySamples}
	p.ClockEvents.ThresholdCheck = ThresholdCheck{Enabled: true, RecoverySamples: DefaultRecoverySamples}
	p.ClockEvents.Reasons = ClockEventHWSlowdown | ClockEventHWThermalSlowdown | ClockEventHWPowerBrake
	p.PCIeReplays.ThresholdCheck = ThresholdCheck{Enabled: true, RecoverySamples: DefaultRecoverySamples}
	p.PCIeReplays.PerMinute = DefaultPCIeReplaysPerMinute
	p.NVLink.ThresholdCheck = ThresholdCheck{Enabled: true, RecoverySamples: DefaultRecoverySamples}
	p.NVLink.ErrorsPerMinute = DefaultNVLinkErrorsPerMinute
	p.RecoveryAction.Enabled = true
	p.Fabric.Enabled, p.Fabric.RegistrationTimeout = true, DefaultFabricTimeout
	p.RowRemapHistogram.Enabled = true
	p.SRAM.Enabled = true
	p.PCIeLink.ThresholdCheck = ThresholdCheck{Enabled: true, RecoverySamples: DefaultRecoverySamples}
	p.NVLinkRecoveries.Enabled, p.NVLinkRecoveries.PerHour = true, DefaultNVLinkRecoveriesPerHour
	p.Repeats = DefaultRepeatRules()
	p.RootCauseWindow = DefaultRootCauseWindow
	p.Escalation = EscalationPolicy{Enabled: true, Returns: DefaultEscalationReturns, Window: DefaultEscalationWindow}
	return p
}

// DevicePluginIgnoredXIDs are the XIDs the NVIDIA device plugin skips.
var devicePluginIgnoredXIDs = []uint32{13, 31, 43, 45, 68, 109}

// DevicePluginPolicy reproduces the NVIDIA device plugin's health check: XIDs 13, 31, 43, 45,
// 68 and 109 are ignored, every other XID makes the GPU Unhealthy and nothing clears it, a lost
// GPU (or one the driver says needs a reset) is Unhealthy, and no polled check runs.
func DevicePluginPolicy() *Policy {
	p := &Policy{
		Name:       "device-plugin",
		XIDs:       map[uint32]XIDRule{},
		UnknownXID: XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnAdmin, Action: ActionInspect, Description: "critical XID"},
		Lost:       XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnAdmin, Action: ActionInspect, Description: "GPU is lost"},
		ResetRequired: XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnAdmin, Action: ActionInspect,
			Description: "GPU requires a reset before it can be used again"},
		// Nothing in this profile clears on a quiet period; the value only has to be valid.
		QuietPeriod: DefaultQuietPeriod,
		// The device plugin has no repeat rules; a root cause still needs a window.
		RootCauseWindow: DefaultRootCauseWindow,
		// Off, as in the device plugin, with the defaults for a config that turns it on.
		Escalation: EscalationPolicy{Returns: DefaultEscalationReturns, Window: DefaultEscalationWindow},
	}
	// Every polled check is off, but with the default thresholds, so that a config that turns
	// one on gets a working check rather than zero limits that fire on the first reading.
	def := DefaultPolicy()
	p.ECC.CorrectedStormPerMinute = def.ECC.CorrectedStormPerMinute
	p.Thermal.RecoverySamples = def.Thermal.RecoverySamples
	p.ClockEvents.RecoverySamples, p.ClockEvents.Reasons = def.ClockEvents.RecoverySamples, def.ClockEvents.Reasons
	p.PCIeReplays.RecoverySamples, p.PCIeReplays.PerMinute = def.PCIeReplays.RecoverySamples, def.PCIeReplays.PerMinute
	p.NVLink.RecoverySamples, p.NVLink.ErrorsPerMinute = def.NVLink.RecoverySamples, def.NVLink.ErrorsPerMinute
	p.Fabric.RegistrationTimeout = def.Fabric.RegistrationTimeout
	p.PCIeLink.RecoverySamples = def.PCIeLink.RecoverySamples
	p.NVLinkRecoveries.PerHour = def.NVLinkRecoveries.PerHour
	catalog := XIDTable()
	for _, xid := range devicePluginIgnoredXIDs {
		rule := catalog[xid]
		p.XIDs[xid] = XIDRule{Severity: Healthy, ClearsOn: ClearsOnAdmin, Action: ActionNone, Description: rule.Description}
	}
	for xid, rule := range catalog {
		if _, ignored := p.XIDs[xid]; !ignored {
			p.XIDs[xid] = XIDRule{Severity: Unhealthy, ClearsOn: ClearsOnAdmin, Action: ActionInspect, Description: rule.Description}
		}
	}
	return p
}

// Profiles lists the built-in policies by name.
func Profiles() []string { return []string{"default", "device-plugin"} }

// PolicyForProfile returns a fresh copy of a built-in policy.
func PolicyForProfile(name string) (*Policy, error) {
	switch name {
	case "", "default":
		return DefaultPolicy(), nil
	case "device-plugin":
		return DevicePluginPolicy(), nil
	}
	return nil, fmt.Errorf("unknown profile %q (want one of %v)", name, Profiles())
}

// XIDRuleFor returns the rule for an XID and whether the XID is in the table.
func (p *Policy) XIDRuleFor(xid uint32) (XIDRule, bool) {
	if r, ok := p.XIDs[xid]; ok {
		return r, true
	}
	return p.UnknownXID, false
}

// Clone returns a deep copy, so a caller can derive a policy without changing the original.
func (p *Policy) Clone() *Policy {
	c := *p
	c.XIDs = maps.Clone(p.XIDs)
	c.Repeats = slices.Clone(p.Repeats)
	for i := range c.Repeats {
		c.Repeats[i].XIDs = slices.Clone(c.Repeats[i].XIDs)
	}
	return &c
}

// SortedXIDs returns the XIDs in the table in ascending order.
func (p *Policy) SortedXIDs() []uint32 {
	return slices.Sorted(maps.Keys(p.XIDs))
}
