package config

import (
	"time"

	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Building the health policy: the profile's, each section of the file applying its changes
// (xids.go, repeats.go, checks.go).

// Policy builds the health policy: the profile's, with the file's changes applied. Call it on
// a validated config.
func (c *HealthConfig) Policy() (*health.Policy, error) {
	p, err := health.PolicyForProfile(c.Profile)
	if err != nil {
		return nil, err
	}
	if c.QuietPeriod != nil {
		p.QuietPeriod = time.Duration(*c.QuietPeriod)
	}
	c.XIDs.apply(p)
	if err := c.Repeats.apply(p); err != nil {
		return nil, err
	}
	if e := c.Escalation; e != nil {
		e.apply(p)
	}
	if err := c.Checks.apply(p); err != nil {
		return nil, err
	}
	return p, nil
}

func setBool(dst *bool, v *bool) {
	if v != nil {
		*dst = *v
	}
}

func setInt(dst *int, v *int) {
	if v != nil {
		*dst = *v
	}
}
