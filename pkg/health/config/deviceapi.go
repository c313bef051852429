package config

import (
	"regexp"
	"strconv"
)

// DeviceAPIConfig is `agent.deviceAPI`: the agent serves NVIDIA's Device API (NVSentinel's
// GpuService: GetGpu, ListGpus, WatchGpus) on a node-local Unix socket, one Gpu per GPU with a
// Ready condition, one condition per family of checks and a recommended action
// (docs/device-api.md). Off unless Socket is set.
type DeviceAPIConfig struct {
	// Socket is the Unix socket the agent creates and serves on; empty (the default) turns the
	// Device API off.
	Socket string `yaml:"socket,omitempty" json:"socket,omitempty"`
	// Group, when set, owns the socket and may connect (mode 0660); without it only the agent's
	// own user may (0600). A group name or a numeric GID; a name is looked up where the agent
	// runs, so in a container a GID is what works.
	Group string `yaml:"group,omitempty" json:"group,omitempty"`
	// MaxWatchers bounds the WatchGpus streams open at once (default 64); one more is refused
	// with RESOURCE_EXHAUSTED.
	MaxWatchers int `yaml:"maxWatchers,omitempty" json:"maxWatchers,omitempty"`
}

// Defaults and bounds of DeviceAPIConfig.
const (
	DefaultDeviceAPIMaxWatchers = 64
	// MaxDeviceAPIWatchers keeps the watchers' buffers (and what a misbehaving client can hold)
	// bounded by configuration, too.
	MaxDeviceAPIWatchers = 4096
)

// WithDefaults returns a copy with defaults filled in.
func (d DeviceAPIConfig) WithDefaults() DeviceAPIConfig {
	if d.MaxWatchers == 0 {
		d.MaxWatchers = DefaultDeviceAPIMaxWatchers
	}
	return d
}

// groupName is what useradd and groupadd accept (shadow-utils' default rule, with the
// uppercase letters many distributions allow).
var groupName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_.-]{0,31}$`)

func (d DeviceAPIConfig) validate(bad func(path, format string, args ...any)) {
	if d.Socket != "" {
		const example = "/var/run/gpuhealth/device-api.sock"
		validSocketPath("agent.deviceAPI.socket", d.Socket, example, ", e.g. "+example, bad)
	}
	if g := d.Group; g != "" {
		if gid, err := strconv.ParseUint(g, 10, 32); err == nil {
			if gid == 1<<32-1 {
				bad("agent.deviceAPI.group", "%s is not a GID (it means \"no change\" to chown)", g)
			}
		} else if !groupName.MatchString(g) {
			bad("agent.deviceAPI.group", "must be a group name or a numeric GID, got %q", g)
		}
		if d.Socket == "" {
			bad("agent.deviceAPI.group", "is set but agent.deviceAPI.socket is empty (the Device API is off)")
		}
	}
	if m := d.MaxWatchers; m < 0 || m > MaxDeviceAPIWatchers {
		bad("agent.deviceAPI.maxWatchers", "must be between 1 and %d (0: %d), got %d", MaxDeviceAPIWatchers, DefaultDeviceAPIMaxWatchers, m)
	}
}
