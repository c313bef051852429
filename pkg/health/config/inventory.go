package config

// InventoryConfig says which GPUs the node should have, against which the GPUs the backend opens
// are compared (docs/xid-policy.md, "Missing GPUs"): those on the PCI bus, read from sysfs, and
// an expected count. Each GPU missing from the backend becomes a placeholder that is Unhealthy
// with reason GPUMissing.
type InventoryConfig struct {
	// Enabled compares at all (default on).
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// SysfsRoot is where sysfs is mounted (default /sys). The simulated backend reads no
	// sysfs unless this is set: the machine it runs on has other GPUs than its scenario.
	SysfsRoot string `yaml:"sysfsRoot,omitempty" json:"sysfsRoot,omitempty"`
	// ExpectedGPUs is how many GPUs the node should have (0: as many as the bus shows). Use it
	// where a GPU can vanish from the bus altogether.
	ExpectedGPUs int `yaml:"expectedGPUs,omitempty" json:"expectedGPUs,omitempty"`
}

// On reports whether the comparison runs.
func (c InventoryConfig) On() bool { return c.Enabled == nil || *c.Enabled }

// MaxExpectedGPUs bounds inventory.expectedGPUs.
const MaxExpectedGPUs = 1024

func (c InventoryConfig) validate(bad func(string, string, ...any)) {
	if c.ExpectedGPUs < 0 || c.ExpectedGPUs > MaxExpectedGPUs {
		bad("inventory.expectedGPUs", "must be from 0 to %d, got %d", MaxExpectedGPUs, c.ExpectedGPUs)
	}
}
