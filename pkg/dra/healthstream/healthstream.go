// Package healthstream streams GPU health to the kubelet for a DRA driver built on
// k8s.io/dynamic-resource-allocation/kubeletplugin (KEP-4680, DRAResourceHealth): the kubelet
// shows it in pod status, status.containerStatuses[].allocatedResourcesStatus. It is the part of
// the DRA support that needs the kubelet's gRPC API and client-go; the pure mapping from health
// to taints and messages is package dra.
package healthstream

import (
	"context"
	"strings"
	"sync"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// Defaults of HealthOptions.
const (
	// DefaultHealthCheckTimeout is the kubelet's own default: a device not reported within it
	// turns Unknown in pod status.
	DefaultHealthCheckTimeout = 30 * time.Second
	// DefaultResendEvery re-sends the full report well within DefaultHealthCheckTimeout.
	DefaultResendEvery = 10 * time.Second
)

// Source is where a HealthReporter reads health from; *health.Monitor is one.
type Source interface {
	// Subscribe returns a subscription that starts with the current snapshot pending.
	Subscribe() *health.Subscription
}

var _ Source = (*health.Monitor)(nil)

// HealthOptions configure a HealthReporter.
type HealthOptions struct {
	// HealthCheckTimeout is how long the kubelet trusts a report before it shows the device's
	// health as Unknown (default 30s, the kubelet's default).
	HealthCheckTimeout time.Duration
	// ResendEvery is how often the full report goes out again when nothing changed, so that the
	// kubelet's lease does not run out (default 10s; must be under HealthCheckTimeout).
	ResendEvery time.Duration
	// Clock stamps reports and paces resends (default: the real clock).
	Clock clock.WithTicker
}

// HealthReporter serves GPU health to the kubelet's DRA health stream. A driver built on the
// kubeletplugin helper calls WatchHealthStatus from its own DRAPlugin.WatchHealthStatus.
type HealthReporter struct {
	src  Source
	opts HealthOptions

	mu      sync.Mutex
	devices map[string]dra.DeviceID // by lower-case UUID
	changed chan struct{}           // closed and replaced by SetDevices
}

// NewHealthReporter returns a reporter of the driver's devices (GPU UUID → device).
func NewHealthReporter(src Source, devices map[string]dra.DeviceID, opts HealthOptions) *HealthReporter {
	if opts.HealthCheckTimeout <= 0 {
		opts.HealthCheckTimeout = DefaultHealthCheckTimeout
	}
	if opts.ResendEvery <= 0 || opts.ResendEvery >= opts.HealthCheckTimeout {
		opts.ResendEvery = min(DefaultResendEvery, opts.HealthCheckTimeout/3)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	h := &HealthReporter{src: src, opts: opts, changed: make(chan struct{})}
	h.SetDevices(devices)
	return h
}

// SetDevices replaces the UUID → device map, for a driver whose devices change (MIG
// reconfiguration); open streams send a new report at once.
func (h *HealthReporter) SetDevices(devices map[string]dra.DeviceID) {
	m := make(map[string]dra.DeviceID, len(devices))
	for uuid, id := range devices {
		m[strings.ToLower(uuid)] = id
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.devices = m
	close(h.changed)
	h.changed = make(chan struct{})
}

func (h *HealthReporter) state() (map[string]dra.DeviceID, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.devices, h.changed
}

// WatchHealthStatus implements the contract of kubeletplugin.DRAPlugin.WatchHealthStatus: a full
// report at once, a new one whenever a device's health, message or the device map changes, and
// the full report again every ResendEvery so the kubelet's lease never lapses while the monitor
// is alive. It returns nil when ctx ends. It may run several times at once (one per stream).
func (h *HealthReporter) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	logger := klog.FromContext(ctx)
	sub := h.src.Subscribe()
	defer sub.Close()
	resend := h.opts.Clock.NewTicker(h.opts.ResendEvery)
	defer resend.Stop()

	var snap health.Snapshot
	have := false
	// changed is taken together with the devices each report is built from: a SetDevices while a
	// report is being sent closes the channel this loop waits on next, so no change is missed.
	_, changed := h.state()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-sub.C():
			u, ok := sub.Next()
			if !ok {
				continue
			}
			snap, have = u.Snapshot, true
		case <-changed:
		case <-resend.C():
		}
		var devices map[string]dra.DeviceID
		devices, changed = h.state()
		if !have {
			// Nothing to say before the first snapshot (the subscription starts with one).
			continue
		}
		r := Report(snap, devices, h.opts.Clock.Now(), h.opts.HealthCheckTimeout)
		select {
		case <-ctx.Done():
			return nil
		case reports <- r:
		}
		logger.V(5).Info("Sent a device health report", "devices", len(r.Devices))
	}
}

// Report is the health report of the driver's devices (GPU UUID, lower case → device) in snap,
// stamped at now. A mapped device whose GPU is not in snap is Unknown.
func Report(snap health.Snapshot, devices map[string]dra.DeviceID, now time.Time, timeout time.Duration) kubeletplugin.DeviceHealthReport {
	seen := make(map[string]bool, len(devices))
	r := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(devices))}
	for _, d := range snap.Devices {
		uuid := strings.ToLower(d.Device.UUID)
		id, ok := devices[uuid]
		if !ok {
			continue
		}
		seen[uuid] = true
		r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{
			PoolName: id.Pool, DeviceName: id.Device, Health: Health(d), Message: dra.Message(d),
			LastUpdated: now, HealthCheckTimeout: timeout,
		})
	}
	for uuid, id := range devices {
		if !seen[uuid] {
			r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{
				PoolName: id.Pool, DeviceName: id.Device, Health: kubeletplugin.HealthStatusUnknown,
				Message: "gpuhealth does not monitor GPU " + uuid, LastUpdated: now, HealthCheckTimeout: timeout,
			})
		}
	}
	return r
}

// Health maps a device's health for pod status: Unhealthy stays Unhealthy (a fault or a drain);
// a device the backend cannot watch is Unknown; Healthy and Degraded (it works) are Healthy.
func Health(d health.DeviceStatus) kubeletplugin.HealthStatus {
	switch {
	case d.Health == health.Unhealthy:
		return kubeletplugin.HealthStatusUnhealthy
	case d.Unmonitored:
		return kubeletplugin.HealthStatusUnknown
	}
	return kubeletplugin.HealthStatusHealthy
}
