package config

import (
	"fmt"
	"os"

	"github.com/gpuhealth/gpuhealth/pkg/health"
	"github.com/gpuhealth/gpuhealth/pkg/strictyaml"
)

// Default returns the configuration that selects the default profile and changes nothing.
func Default() *HealthConfig {
	return &HealthConfig{APIVersion: APIVersion, Kind: Kind, Profile: "default"}
}

// Load reads, decodes and validates a HealthConfig file. Errors name the file.
func Load(path string) (*HealthConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}

// LoadPolicy reads the HealthConfig file at path (the default configuration when path is empty)
// and builds its Policy: what every embedder does at start. Errors name the file.
func LoadPolicy(path string) (*HealthConfig, *health.Policy, error) {
	cfg := Default()
	if path != "" {
		var err error
		if cfg, err = Load(path); err != nil {
			return nil, nil, err
		}
	}
	policy, err := cfg.Policy()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, policy, nil
}

// Parse decodes and validates a HealthConfig.
func Parse(data []byte) (*HealthConfig, error) {
	var c HealthConfig
	if err := strictyaml.Decode(data, &c); err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}
