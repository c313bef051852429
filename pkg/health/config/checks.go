package config

import (
	"fmt"
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Checks turns polled checks on and off and sets their thresholds.
type Checks struct {
	ECC            *ECCCheck     `yaml:"ecc,omitempty" json:"ecc,omitempty"`
	RowRemap       *Toggle       `yaml:"rowRemap,omitempty" json:"rowRemap,omitempty"`
	RetiredPages   *Toggle       `yaml:"retiredPages,omitempty" json:"retiredPages,omitempty"`
	Thermal        *ThermalCheck `yaml:"thermal,omitempty" json:"thermal,omitempty"`
	ClockEvents    *ClockCheck   `yaml:"clockEvents,omitempty" json:"clockEvents,omitempty"`
	PCIeReplays    *RateCheck    `yaml:"pcieReplays,omitempty" json:"pcieReplays,omitempty"`
	NVLink         *NVLinkCheck  `yaml:"nvlink,omitempty" json:"nvlink,omitempty"`
	RecoveryAction *Toggle       `yaml:"recoveryAction,omitempty" json:"recoveryAction,omitempty"`
	// The fabric and the early warnings (docs/xid-policy.md).
	Fabric            *FabricCheck           `yaml:"fabric,omitempty" json:"fabric,omitempty"`
	RowRemapHistogram *Toggle                `yaml:"rowRemapHistogram,omitempty" json:"rowRemapHistogram,omitempty"`
	SRAM              *Toggle                `yaml:"sram,omitempty" json:"sram,omitempty"`
	PCIeLink          *PCIeLinkCheck         `yaml:"pcieLink,omitempty" json:"pcieLink,omitempty"`
	NVLinkRecoveries  *NVLinkRecoveriesCheck `yaml:"nvlinkRecoveries,omitempty" json:"nvlinkRecoveries,omitempty"`
}

// FabricCheck configures the NVLink fabric checks.
type FabricCheck struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// RegistrationTimeout is how long a registration may stay incomplete before the GPU is
	// Degraded (default 10m).
	RegistrationTimeout *Duration `yaml:"registrationTimeout,omitempty" json:"registrationTimeout,omitempty"`
}

// PCIeLinkCheck configures the PCIe link check.
type PCIeLinkCheck struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Generation also judges the link's generation (off: idle GPUs train down to save power).
	Generation      *bool `yaml:"generation,omitempty" json:"generation,omitempty"`
	RecoverySamples *int  `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// NVLinkRecoveriesCheck configures the NVLink recovery-count check.
type NVLinkRecoveriesCheck struct {
	Enabled *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	PerHour *float64 `yaml:"perHour,omitempty" json:"perHour,omitempty"`
}

// Toggle is a check with no settings beyond on and off.
type Toggle struct {
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
}

// ECCCheck configures the ECC checks.
type ECCCheck struct {
	Enabled                 *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	CorrectedStormPerMinute *float64 `yaml:"correctedStormPerMinute,omitempty" json:"correctedStormPerMinute,omitempty"`
}

// ThermalCheck configures the temperature check. Zero thresholds mean "the device's own".
type ThermalCheck struct {
	Enabled         *bool  `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	SlowdownC       *int64 `yaml:"slowdownC,omitempty" json:"slowdownC,omitempty"`
	ShutdownC       *int64 `yaml:"shutdownC,omitempty" json:"shutdownC,omitempty"`
	RecoverySamples *int   `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// ClockCheck configures the clock-event (throttle) check.
type ClockCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	Reasons         []string `yaml:"reasons,omitempty" json:"reasons,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// RateCheck configures a counter-rate check.
type RateCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	PerMinute       *float64 `yaml:"perMinute,omitempty" json:"perMinute,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
}

// NVLinkCheck configures the NVLink checks.
type NVLinkCheck struct {
	Enabled         *bool    `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	ErrorsPerMinute *float64 `yaml:"errorsPerMinute,omitempty" json:"errorsPerMinute,omitempty"`
	RecoverySamples *int     `yaml:"recoverySamples,omitempty" json:"recoverySamples,omitempty"`
	// ExpectedLinks is how many NVLinks each GPU should have up (0: what the GPU reports
	// active when first read). With it, a link that never came up is Unhealthy (NVLinkDown).
	ExpectedLinks *int `yaml:"expectedLinks,omitempty" json:"expectedLinks,omitempty"`
}

// validate checks each check's settings.
func (ch Checks) validate(bad func(string, string, ...any)) {
	if e := ch.ECC; e != nil && e.CorrectedStormPerMinute != nil && !positive(*e.CorrectedStormPerMinute) {
		bad("checks.ecc.correctedStormPerMinute", "must be positive, got %v", *e.CorrectedStormPerMinute)
	}
	if t := ch.Thermal; t != nil {
		t.validate(bad)
	}
	if k := ch.ClockEvents; k != nil {
		for i, r := range k.Reasons {
			if _, err := health.ParseClockEventReason(r); err != nil {
				bad(fmt.Sprintf("checks.clockEvents.reasons[%d]", i), "%v", err)
			}
		}
		validateSamples("checks.clockEvents.recoverySamples", k.RecoverySamples, bad)
	}
	if r := ch.PCIeReplays; r != nil {
		if r.PerMinute != nil && !positive(*r.PerMinute) {
			bad("checks.pcieReplays.perMinute", "must be positive, got %v", *r.PerMinute)
		}
		validateSamples("checks.pcieReplays.recoverySamples", r.RecoverySamples, bad)
	}
	if n := ch.NVLink; n != nil {
		n.validate(bad)
	}
	if f := ch.Fabric; f != nil && f.RegistrationTimeout != nil && time.Duration(*f.RegistrationTimeout) <= 0 {
		bad("checks.fabric.registrationTimeout", "must be positive, got %v", time.Duration(*f.RegistrationTimeout))
	}
	if l := ch.PCIeLink; l != nil {
		validateSamples("checks.pcieLink.recoverySamples", l.RecoverySamples, bad)
	}
	if r := ch.NVLinkRecoveries; r != nil && r.PerHour != nil && !positive(*r.PerHour) {
		bad("checks.nvlinkRecoveries.perHour", "must be positive, got %v", *r.PerHour)
	}
}

func (t *ThermalCheck) validate(bad func(string, string, ...any)) {
	if t.SlowdownC != nil && (*t.SlowdownC < 0 || *t.SlowdownC > 150) {
		bad("checks.thermal.slowdownC", "must be 0 (the device's own) or a temperature up to 150, got %d", *t.SlowdownC)
	}
	if t.ShutdownC != nil && (*t.ShutdownC < 0 || *t.ShutdownC > 150) {
		bad("checks.thermal.shutdownC", "must be 0 (the device's own) or a temperature up to 150, got %d", *t.ShutdownC)
	}
	if t.SlowdownC != nil && t.ShutdownC != nil && *t.SlowdownC > 0 && *t.ShutdownC > 0 && *t.SlowdownC >= *t.ShutdownC {
		bad("checks.thermal.shutdownC", "must be above slowdownC (%d), got %d", *t.SlowdownC, *t.ShutdownC)
	}
	validateSamples("checks.thermal.recoverySamples", t.RecoverySamples, bad)
}

func (n *NVLinkCheck) validate(bad func(string, string, ...any)) {
	if n.ErrorsPerMinute != nil && !positive(*n.ErrorsPerMinute) {
		bad("checks.nvlink.errorsPerMinute", "must be positive, got %v", *n.ErrorsPerMinute)
	}
	validateSamples("checks.nvlink.recoverySamples", n.RecoverySamples, bad)
	if n.ExpectedLinks != nil && (*n.ExpectedLinks < 0 || *n.ExpectedLinks > MaxNVLinks) {
		bad("checks.nvlink.expectedLinks", "must be from 0 to %d, got %d", MaxNVLinks, *n.ExpectedLinks)
	}
}

// apply changes p's checks as the file's say.
func (ch Checks) apply(p *health.Policy) error {
	if e := ch.ECC; e != nil {
		setBool(&p.ECC.Enabled, e.Enabled)
		if e.CorrectedStormPerMinute != nil {
			p.ECC.CorrectedStormPerMinute = *e.CorrectedStormPerMinute
		}
	}
	toggle(&p.RowRemap.Enabled, ch.RowRemap)
	toggle(&p.RetiredPages.Enabled, ch.RetiredPages)
	toggle(&p.RecoveryAction.Enabled, ch.RecoveryAction)
	if t := ch.Thermal; t != nil {
		t.apply(p)
	}
	if k := ch.ClockEvents; k != nil {
		if err := k.apply(p); err != nil {
			return err
		}
	}
	if r := ch.PCIeReplays; r != nil {
		r.apply(&p.PCIeReplays.ThresholdCheck, &p.PCIeReplays.PerMinute)
	}
	if n := ch.NVLink; n != nil {
		n.apply(p)
	}
	if f := ch.Fabric; f != nil {
		setBool(&p.Fabric.Enabled, f.Enabled)
		if f.RegistrationTimeout != nil {
			p.Fabric.RegistrationTimeout = time.Duration(*f.RegistrationTimeout)
		}
	}
	toggle(&p.RowRemapHistogram.Enabled, ch.RowRemapHistogram)
	toggle(&p.SRAM.Enabled, ch.SRAM)
	if l := ch.PCIeLink; l != nil {
		setBool(&p.PCIeLink.Enabled, l.Enabled)
		setBool(&p.PCIeLink.Generation, l.Generation)
		setInt(&p.PCIeLink.RecoverySamples, l.RecoverySamples)
	}
	if r := ch.NVLinkRecoveries; r != nil {
		setBool(&p.NVLinkRecoveries.Enabled, r.Enabled)
		if r.PerHour != nil {
			p.NVLinkRecoveries.PerHour = *r.PerHour
		}
	}
	return nil
}

// toggle turns a check on or off as t says, when the file has it.
func toggle(enabled *bool, t *Toggle) {
	if t != nil {
		setBool(enabled, t.Enabled)
	}
}

func (t *ThermalCheck) apply(p *health.Policy) {
	setBool(&p.Thermal.Enabled, t.Enabled)
	setInt(&p.Thermal.RecoverySamples, t.RecoverySamples)
	if t.SlowdownC != nil {
		p.Thermal.SlowdownC = *t.SlowdownC
	}
	if t.ShutdownC != nil {
		p.Thermal.ShutdownC = *t.ShutdownC
	}
}

func (k *ClockCheck) apply(p *health.Policy) error {
	setBool(&p.ClockEvents.Enabled, k.Enabled)
	setInt(&p.ClockEvents.RecoverySamples, k.RecoverySamples)
	if k.Reasons != nil {
		p.ClockEvents.Reasons = 0
		for _, r := range k.Reasons {
			bit, err := health.ParseClockEventReason(r)
			if err != nil {
				return err
			}
			p.ClockEvents.Reasons |= bit
		}
	}
	return nil
}

// apply changes a counter-rate check: check, and its limit perMinute.
func (r *RateCheck) apply(check *health.ThresholdCheck, perMinute *float64) {
	setBool(&check.Enabled, r.Enabled)
	setInt(&check.RecoverySamples, r.RecoverySamples)
	if r.PerMinute != nil {
		*perMinute = *r.PerMinute
	}
}

func (n *NVLinkCheck) apply(p *health.Policy) {
	setBool(&p.NVLink.Enabled, n.Enabled)
	setInt(&p.NVLink.RecoverySamples, n.RecoverySamples)
	if n.ErrorsPerMinute != nil {
		p.NVLink.ErrorsPerMinute = *n.ErrorsPerMinute
	}
}
