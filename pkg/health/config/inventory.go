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
	// OtherDrivers says what becomes of a GPU on the bus bound to a driver other than NVIDIA's
	// (vfio-pci for a virtual machine: KubeVirt, Kata): OtherDriversLeaveOut (the default) or
	// OtherDriversMissing.
	OtherDrivers string `yaml:"otherDrivers,omitempty" json:"otherDrivers,omitempty"`
}

// The values of inventory.otherDrivers.
const (
	// OtherDriversLeaveOut leaves a GPU bound to another driver out of the comparison: it was
	// given to that driver on purpose, is neither watched nor missing, and is reported once per
	// start (a log line and an Event).
	OtherDriversLeaveOut = "leaveOut"
	// OtherDriversMissing counts it missing, as a GPU NVIDIA's driver failed to bind: for nodes
	// where no GPU is ever given to another driver on purpose.
	OtherDriversMissing = "missing"
)

// On reports whether the comparison runs.
func (c InventoryConfig) On() bool { return c.Enabled == nil || *c.Enabled }

// OtherDriversMissingOn reports whether a GPU bound to another driver counts missing.
func (c InventoryConfig) OtherDriversMissingOn() bool { return c.OtherDrivers == OtherDriversMissing }

// MaxExpectedGPUs bounds inventory.expectedGPUs.
const MaxExpectedGPUs = 1024

func (c InventoryConfig) validate(bad func(string, string, ...any)) {
	if c.ExpectedGPUs < 0 || c.ExpectedGPUs > MaxExpectedGPUs {
		bad("inventory.expectedGPUs", "must be from 0 to %d, got %d", MaxExpectedGPUs, c.ExpectedGPUs)
	}
	switch c.OtherDrivers {
	case "", OtherDriversLeaveOut, OtherDriversMissing:
	default:
		bad("inventory.otherDrivers", "must be %s or %s, got %q", OtherDriversLeaveOut, OtherDriversMissing, c.OtherDrivers)
	}
}
