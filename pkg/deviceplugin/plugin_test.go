package deviceplugin_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin"
	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin/deviceplugintest"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

// waitLimit bounds every wait; the tests poll, they never assert timings.
const waitLimit = 30 * time.Second

var uuids = []string{"GPU-11111111-0000-0000-0000-000000000000", "GPU-22222222-0000-0000-0000-000000000000",
	"GPU-33333333-0000-0000-0000-000000000000"}

// rig is a plugin on a real health monitor, served to a test kubelet over Unix sockets.
type rig struct {
	t       *testing.T
	dir     string
	monitor *health.Monitor
	plugin  *deviceplugin.Plugin
	kubelet *deviceplugintest.Kubelet
	stop    context.CancelFunc
	done    chan error
}

// socketDir is a short directory: a Unix socket path must fit in 108 bytes, and t.TempDir()
// paths grow with the test name.
func socketDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func newRig(t *testing.T, opts deviceplugin.ServiceOptions) *rig {
	t.Helper()
	devices := []health.Device{}
	for i, u := range uuids {
		devices = append(devices, health.Device{UUID: u, Index: i})
	}
	devices = append(devices, health.Device{UUID: "MIG-44444444-0000-0000-0000-000000000000", Index: 2,
		MIG: &health.MIGPlacement{ParentUUID: uuids[2], GPUInstance: 1}})
	tracker, err := health.NewTracker(health.DefaultPolicy(), devices)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, dir: socketDir(t), monitor: health.NewMonitor(tracker), done: make(chan error, 1)}
	r.kubelet, err = deviceplugintest.Start(r.dir, deviceplugintest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r.plugin = deviceplugin.NewPlugin(deviceplugin.NewService(r.monitor, opts),
		deviceplugin.PluginOptions{Dir: r.dir, PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(t)))
	r.stop = cancel
	go func() { r.done <- r.plugin.Run(ctx) }()
	t.Cleanup(func() {
		if err := r.shutdown(); err != nil {
			t.Errorf("plugin shutdown: %v", err)
		}
		r.kubelet.Stop()
	})
	return r
}

// shutdown stops the plugin and returns what Run returned; later calls return nil.
func (r *rig) shutdown() error {
	if r.stop == nil {
		return nil
	}
	r.stop()
	r.stop = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(waitLimit):
		return errors.New("plugin did not stop")
	}
}

func (r *rig) registered() *deviceplugintest.Plugin {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	p, err := r.kubelet.Registered(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	return p
}

func (r *rig) signal(s health.Signal) {
	s.Time = time.Unix(1000, 0)
	r.monitor.Signal(s)
}

// waitHealth waits until the kubelet's latest list is exactly want.
func waitHealth(t *testing.T, p *deviceplugintest.Plugin, want map[string]string) []*pluginapi.Device {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	devs, err := p.WaitFor(ctx, func(devs []*pluginapi.Device) bool {
		return maps.Equal(deviceplugintest.Health(devs), want)
	})
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	return devs
}

func allHealthy() map[string]string {
	m := map[string]string{}
	for _, u := range uuids {
		m[u] = pluginapi.Healthy
	}
	return m
}

func with(m map[string]string, uuid, h string) map[string]string {
	m = maps.Clone(m)
	m[uuid] = h
	return m
}

func TestPluginRegistersAndListsGPUsByUUID(t *testing.T) {
	r := newRig(t, deviceplugin.ServiceOptions{})
	p := r.registered()
	if got := p.Request.GetVersion(); got != pluginapi.Version {
		t.Errorf("registered version %q, want %q", got, pluginapi.Version)
	}
	if got := p.Request.GetResourceName(); got != "nvidia.com/gpu" {
		t.Errorf("registered resource %q, want nvidia.com/gpu", got)
	}
	if got, want := p.Request.GetEndpoint(), "gpuhealth-gpu.sock"; got != want {
		t.Errorf("registered endpoint %q, want %q", got, want)
	}
	if !p.Request.GetOptions().GetGetPreferredAllocationAvailable() || !p.Options.GetGetPreferredAllocationAvailable() {
		t.Errorf("GetPreferredAllocation not advertised: register %v, options %v", p.Request.GetOptions(), p.Options)
	}
	if p.Options.GetPreStartRequired() {
		t.Error("PreStartContainer asked for, but the plugin has nothing to do in it")
	}
	devs := waitHealth(t, p, allHealthy())
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.GetID())
	}
	if !slices.Equal(ids, uuids) {
		t.Errorf("device IDs %v, want the GPU UUIDs in index order %v", ids, uuids)
	}
}

func TestPluginStreamsFaultAndRecovery(t *testing.T) {
	r := newRig(t, deviceplugin.ServiceOptions{})
	p := r.registered()
	waitHealth(t, p, allHealthy())

	// XID 48 (double-bit ECC) makes the GPU Unhealthy until it is reset.
	r.signal(health.XIDSignal(uuids[1], 48, time.Time{}))
	waitHealth(t, p, with(allHealthy(), uuids[1], pluginapi.Unhealthy))

	// XID 63 (row remap recorded) is Degraded: the GPU works and stays schedulable, so the
	// kubelet gets no new list for it.
	before := len(p.Lists())
	r.signal(health.XIDSignal(uuids[2], 63, time.Time{}))
	if got := r.monitor.Snapshot().Devices[3].Health; got != health.Degraded {
		t.Fatalf("GPU 2 is %v after XID 63, want Degraded", got)
	}

	// The reset recovers the GPU: the kubelet sees it Healthy again.
	r.signal(health.Signal{Kind: health.SignalReset, Device: uuids[1]})
	waitHealth(t, p, allHealthy())
	lists := p.Lists()
	if got := len(lists) - before; got != 1 {
		t.Errorf("%d lists after the Degraded GPU and the recovery, want 1 (the recovery): %v", got, lists[before:])
	}
}

func TestPluginAllocate(t *testing.T) {
	tests := []struct {
		name string
		opts deviceplugin.ServiceOptions
		want func(*testing.T, *pluginapi.ContainerAllocateResponse)
	}{
		{
			name: "NVIDIA_VISIBLE_DEVICES by UUID",
			want: func(t *testing.T, r *pluginapi.ContainerAllocateResponse) {
				if got, want := r.GetEnvs()["NVIDIA_VISIBLE_DEVICES"], uuids[2]+","+uuids[0]; got != want {
					t.Errorf("NVIDIA_VISIBLE_DEVICES = %q, want %q", got, want)
				}
				if len(r.GetCdiDevices()) != 0 {
					t.Errorf("CDI devices %v without --cdi", r.GetCdiDevices())
				}
			},
		},
		{
			name: "CDI device names",
			opts: deviceplugin.ServiceOptions{CDI: true},
			want: func(t *testing.T, r *pluginapi.ContainerAllocateResponse) {
				var names []string
				for _, d := range r.GetCdiDevices() {
					names = append(names, d.GetName())
				}
				if want := []string{"nvidia.com/gpu=" + uuids[2], "nvidia.com/gpu=" + uuids[0]}; !slices.Equal(names, want) {
					t.Errorf("CDI devices %v, want %v", names, want)
				}
				if len(r.GetEnvs()) != 0 {
					t.Errorf("environment %v with CDI", r.GetEnvs())
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, tc.opts)
			p := r.registered()
			waitHealth(t, p, allHealthy())
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			resp, err := p.Client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: []string{uuids[2], uuids[0]}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetContainerResponses()) != 1 {
				t.Fatalf("%d container responses, want 1", len(resp.GetContainerResponses()))
			}
			tc.want(t, resp.GetContainerResponses()[0])

			if _, err := p.Client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: []string{"GPU-unknown"}},
			}}); err == nil {
				t.Error("Allocate of an unknown device succeeded")
			}
		})
	}
}

func TestPluginPreferredAllocation(t *testing.T) {
	r := newRig(t, deviceplugin.ServiceOptions{})
	p := r.registered()
	waitHealth(t, p, allHealthy())
	r.signal(health.XIDSignal(uuids[0], 63, time.Time{})) // Degraded
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	resp, err := p.Client.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: uuids, AllocationSize: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := resp.GetContainerResponses()[0].GetDeviceIDs(), []string{uuids[1], uuids[2]}; !slices.Equal(got, want) {
		t.Errorf("preferred %v, want the Healthy GPUs %v before the Degraded one", got, want)
	}
	if _, err := p.Client.PreStartContainer(ctx, &pluginapi.PreStartContainerRequest{DevicesIds: uuids[:1]}); err != nil {
		t.Errorf("PreStartContainer: %v", err)
	}
}

func TestPluginReRegistersWhenKubeletRestarts(t *testing.T) {
	tests := []struct {
		name string
		// opts of the restarted kubelet: the real one clears the directory, removing the
		// plugin's socket; a kubelet.sock recreated alone must be noticed too.
		opts deviceplugintest.Options
	}{
		{"directory cleared", deviceplugintest.Options{}},
		{"only kubelet.sock recreated", deviceplugintest.Options{KeepSockets: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, deviceplugin.ServiceOptions{})
			first := r.registered()
			waitHealth(t, first, allHealthy())

			r.kubelet.Stop()
			// A fault while the kubelet is down reaches the next kubelet's first list.
			r.signal(health.XIDSignal(uuids[2], 48, time.Time{}))
			var err error
			r.kubelet, err = deviceplugintest.Start(r.dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			second := r.registered()
			waitHealth(t, second, with(allHealthy(), uuids[2], pluginapi.Unhealthy))
			if lists := second.Lists(); len(lists) == 0 || !maps.Equal(deviceplugintest.Health(lists[0]), with(allHealthy(), uuids[2], pluginapi.Unhealthy)) {
				t.Errorf("first list after the restart %v, want the current state", lists)
			}
			select {
			case <-first.Done():
			case <-time.After(waitLimit):
				t.Error("the old kubelet's ListAndWatch stream is still open")
			}

			// And the plugin still serves the new kubelet.
			r.signal(health.Signal{Kind: health.SignalReset, Device: uuids[2]})
			waitHealth(t, second, allHealthy())
		})
	}
}

func TestPluginShutdown(t *testing.T) {
	r := newRig(t, deviceplugin.ServiceOptions{})
	p := r.registered()
	waitHealth(t, p, allHealthy())
	if err := r.shutdown(); err != nil {
		t.Fatalf("Run returned %v on shutdown", err)
	}
	if _, err := os.Stat(filepath.Join(r.dir, "gpuhealth-gpu.sock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("plugin socket left behind: %v", err)
	}
	select {
	case <-p.Done():
	case <-time.After(waitLimit):
		t.Error("ListAndWatch stream still open after shutdown")
	}
}

func TestPluginWaitsForKubelet(t *testing.T) {
	r := newRig(t, deviceplugin.ServiceOptions{})
	r.registered()
	r.kubelet.Stop()
	// No kubelet for a while: the plugin keeps waiting rather than failing.
	if _, err := os.Stat(r.plugin.SocketPath()); err != nil {
		t.Fatalf("plugin socket: %v", err)
	}
	select {
	case err := <-r.done:
		t.Fatalf("Run returned %v with the kubelet down", err)
	default:
	}
	var err error
	r.kubelet, err = deviceplugintest.Start(r.dir, deviceplugintest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	waitHealth(t, r.registered(), allHealthy())
}

// TestPluginRegistersThroughRelativeDir: `--kubelet-socket-dir .cluster/nodes/NAME/device-plugins`
// is a relative path, which a "unix://" gRPC target would misread as an authority.
func TestPluginRegistersThroughRelativeDir(t *testing.T) {
	dir := socketDir(t)
	t.Chdir(filepath.Dir(dir))
	rel := filepath.Base(dir)
	kubelet, err := deviceplugintest.Start(dir, deviceplugintest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Stop()
	tracker, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: uuids[0]}})
	if err != nil {
		t.Fatal(err)
	}
	plugin := deviceplugin.NewPlugin(deviceplugin.NewService(health.NewMonitor(tracker), deviceplugin.ServiceOptions{}),
		deviceplugin.PluginOptions{Dir: rel, PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(t)))
	done := make(chan error, 1)
	go func() { done <- plugin.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("plugin stopped with %v", err)
		}
	}()
	wait, stop := context.WithTimeout(context.Background(), waitLimit)
	defer stop()
	if _, err := kubelet.Registered(wait); err != nil {
		t.Fatalf("plugin with relative directory %q did not register: %v", rel, err)
	}
}
