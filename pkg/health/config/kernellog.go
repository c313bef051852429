package config

import "path/filepath"

// DefaultKernelLogPath is the kernel's record interface to its log.
const DefaultKernelLogPath = "/dev/kmsg"

// maxSocketPath is the longest path a Unix socket may have (sun_path, less its NUL).
const maxSocketPath = 107

// KernelLogConfig configures the kernel log as a second source of signals beside NVML (see
// docs/kernel-log.md). The log is read from Path, or, with RelaySocket, from a `gpuhealth
// kmsg-relay` that reads it for a process that may not (the chart's unprivileged agent).
type KernelLogConfig struct {
	// Enabled turns the source on or off. Unset means on where the log can be read: where it
	// cannot, the agent warns once and reports gpuhealth_source_up{source="kmsg"} 0.
	Enabled *bool `yaml:"enabled,omitempty" json:"enabled,omitempty"`
	// Path is the kernel log device (default /dev/kmsg, unless RelaySocket is set).
	Path string `yaml:"path,omitempty" json:"path,omitempty"`
	// RelaySocket is the Unix socket of a kmsg relay to read the log from instead of Path. A
	// relay that does not answer yet is waited for: the source is down until it does.
	RelaySocket string `yaml:"relaySocket,omitempty" json:"relaySocket,omitempty"`
}

// KernelLogSection returns the kernel-log section with defaults filled in: Enabled is never nil,
// and Path is set unless the log is read from RelaySocket.
func (c *HealthConfig) KernelLogSection() KernelLogConfig {
	k := c.KernelLog
	if k.Enabled == nil {
		on := true
		k.Enabled = &on
	}
	if k.Path == "" && k.RelaySocket == "" {
		k.Path = DefaultKernelLogPath
	}
	return k
}

func (k KernelLogConfig) validate(bad func(path, format string, args ...any)) {
	if k.Path != "" && !filepath.IsAbs(k.Path) {
		bad("kernelLog.path", "must be an absolute path, got %q", k.Path)
	}
	switch {
	case k.RelaySocket == "":
	case k.Path != "":
		bad("kernelLog.relaySocket", "the log is read from path or from a relay: set one, not both (path %q)", k.Path)
	case !filepath.IsAbs(k.RelaySocket):
		bad("kernelLog.relaySocket", "must be an absolute path, got %q", k.RelaySocket)
	case len(k.RelaySocket) > maxSocketPath:
		bad("kernelLog.relaySocket", "a Unix socket's path is at most %d bytes, got %d", maxSocketPath, len(k.RelaySocket))
	}
}
