package config

import "path/filepath"

// DefaultKernelLogPath is the kernel's record interface to its log.
const DefaultKernelLogPath = "/dev/kmsg"

// KernelLogConfig configures the kernel log as a second source of signals beside NVML (see
// docs/kernel-log.md).
type KernelLogConfig struct {
	// Enabled turns the source on or off. Unset means on where the log can be read: where it
	// cannot, the agent warns once and reports gpuhealth_source_up{source="kmsg"} 0.
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Path is the kernel log device (default /dev/kmsg).
	Path string `yaml:"path,omitempty" json:"path,omitempty"`
}

// KernelLogSection returns the kernel-log section with defaults filled in: Enabled is never nil.
func (c *HealthConfig) KernelLogSection() KernelLogConfig {
	k := c.KernelLog
	if k.Enabled == nil {
		on := true
		k.Enabled = &on
	}
	if k.Path == "" {
		k.Path = DefaultKernelLogPath
	}
	return k
}

func (k KernelLogConfig) validate(bad func(path, format string, args ...any)) {
	if k.Path != "" && !filepath.IsAbs(k.Path) {
		bad("kernelLog.path", "must be an absolute path, got %q", k.Path)
	}
}
