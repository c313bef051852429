package healthstream_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpuhealth/gpuhealth/pkg/dra"
	"github.com/gpuhealth/gpuhealth/pkg/dra/healthstream"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

const (
	driverName = "gpu.example.com"
	waitLimit  = 30 * time.Second
)

func gpuStatus(uuid string, sev health.Severity, conds ...health.Condition) health.DeviceStatus {
	d := health.DeviceStatus{Device: health.Device{UUID: uuid}, Health: sev, Conditions: conds}
	for _, c := range conds {
		d.Evict = d.Evict || c.Evict
	}
	return d
}

func TestHealth(t *testing.T) {
	tests := []struct {
		name        string
		in          health.DeviceStatus
		want        kubeletplugin.HealthStatus
		wantMessage string
	}{
		{"healthy", gpuStatus("GPU-a", health.Healthy), kubeletplugin.HealthStatusHealthy, ""},
		{"degraded works", gpuStatus("GPU-a", health.Degraded, health.Condition{Type: health.ConditionThermal, Severity: health.Degraded, Reason: "TemperatureAtSlowdown", Message: "91°C"}),
			kubeletplugin.HealthStatusHealthy, "Degraded: TemperatureAtSlowdown: 91°C"},
		{"unhealthy", gpuStatus("GPU-a", health.Unhealthy, health.Condition{Type: health.ConditionXID, Code: 48, Severity: health.Unhealthy, Reason: "XID48", Message: "double-bit ECC"}),
			kubeletplugin.HealthStatusUnhealthy, "XID48: double-bit ECC"},
		{"unmonitored is unknown", health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, Unmonitored: true},
			kubeletplugin.HealthStatusUnknown, "the GPU backend cannot watch this device"},
		{"lost and unmonitored is unhealthy", health.DeviceStatus{Device: health.Device{UUID: "GPU-a"}, Unmonitored: true, Health: health.Unhealthy,
			Conditions: []health.Condition{{Type: health.ConditionGPULost, Severity: health.Unhealthy, Reason: "GPULost"}}},
			kubeletplugin.HealthStatusUnhealthy, "GPULost"},
		{"long messages are cut", gpuStatus("GPU-a", health.Unhealthy, health.Condition{Severity: health.Unhealthy, Reason: "R", Message: strings.Repeat("x", 2000)}),
			kubeletplugin.HealthStatusUnhealthy, "R: " + strings.Repeat("x", 1018) + "..."},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := healthstream.Health(tc.in); got != tc.want {
				t.Errorf("Health = %s, want %s", got, tc.want)
			}
			if got := dra.Message(tc.in); got != tc.wantMessage {
				t.Errorf("Message = %q, want %q", got, tc.wantMessage)
			}
		})
	}
}

func TestReport(t *testing.T) {
	now := time.Unix(2000, 0)
	snap := health.Snapshot{Devices: []health.DeviceStatus{
		gpuStatus("GPU-AAAA", health.Healthy),
		gpuStatus("GPU-bbbb", health.Unhealthy, health.Condition{Severity: health.Unhealthy, Reason: "XID48"}),
		gpuStatus("GPU-unpublished", health.Unhealthy),
	}}
	devices := map[string]dra.DeviceID{"gpu-aaaa": {Pool: "node-a", Device: "gpu-0"}, "gpu-bbbb": {Pool: "node-a", Device: "gpu-1"}, "gpu-gone": {Pool: "node-a", Device: "gpu-2"}}
	got := healthstream.Report(snap, devices, now, time.Minute)
	want := []kubeletplugin.DeviceHealth{
		{PoolName: "node-a", DeviceName: "gpu-0", Health: kubeletplugin.HealthStatusHealthy, LastUpdated: now, HealthCheckTimeout: time.Minute},
		{PoolName: "node-a", DeviceName: "gpu-1", Health: kubeletplugin.HealthStatusUnhealthy, Message: "XID48", LastUpdated: now, HealthCheckTimeout: time.Minute},
		{PoolName: "node-a", DeviceName: "gpu-2", Health: kubeletplugin.HealthStatusUnknown, Message: "gpuhealth does not monitor GPU gpu-gone", LastUpdated: now, HealthCheckTimeout: time.Minute},
	}
	if !slices.Equal(got.Devices, want) {
		t.Errorf("Report =\n%+v\nwant\n%+v", got.Devices, want)
	}
}

// driver is a minimal DRA driver: it prepares nothing and reports health through a
// healthstream.HealthReporter, as a real driver embedding the library would.
type driver struct {
	health *healthstream.HealthReporter
	t      *testing.T
}

func (d driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{}
	}
	return out, nil
}

func (d driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (d driver) HandleError(_ context.Context, err error, msg string) { d.t.Logf("%s: %v", msg, err) }

func (d driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	return d.health.WatchHealthStatus(ctx, reports)
}

var gpus = []string{"GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"}

// shortDir is a directory whose sockets fit the 108-byte limit of a Unix socket path.
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "dra")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// kubelet is the kubelet's side of the health stream: it finds the driver through the plugin
// registration socket, as the kubelet's plugin manager does, and opens NodeWatchResources.
type kubelet struct {
	t      *testing.T
	client drahealthv1.DRAResourceHealthClient
}

func newKubelet(t *testing.T, registrarDir string) *kubelet {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	reg := dial(t, filepath.Join(registrarDir, driverName+"-reg.sock"))
	info, err := registerapi.NewRegistrationClient(reg).GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatalf("GetInfo: %v", err)
	}
	if info.GetType() != registerapi.DRAPlugin || info.GetName() != driverName {
		t.Fatalf("registration info %v, want a DRA plugin %s", info, driverName)
	}
	if !slices.Contains(info.GetSupportedVersions(), drahealthv1.DRAResourceHealthService) {
		t.Fatalf("driver advertises %v, not %s", info.GetSupportedVersions(), drahealthv1.DRAResourceHealthService)
	}
	if _, err := registerapi.NewRegistrationClient(reg).NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatalf("NotifyRegistrationStatus: %v", err)
	}
	return &kubelet{t: t, client: drahealthv1.NewDRAResourceHealthClient(dial(t, info.GetEndpoint()))}
}

func dial(t *testing.T, path string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

type stream struct {
	t      *testing.T
	s      grpc.ServerStreamingClient[drahealthv1.NodeWatchResourcesResponse]
	cancel context.CancelFunc
}

func (k *kubelet) watch() *stream {
	k.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
	s, err := k.client.NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		cancel()
		k.t.Fatalf("NodeWatchResources: %v", err)
	}
	k.t.Cleanup(cancel)
	return &stream{t: k.t, s: s, cancel: cancel}
}

// next returns the next report as "pool/device" → "HEALTH message".
func (s *stream) next() map[string]string {
	s.t.Helper()
	resp, err := s.s.Recv()
	if err != nil {
		s.t.Fatalf("Recv: %v", err)
	}
	out := map[string]string{}
	for _, d := range resp.GetDevices() {
		if d.GetLastUpdatedTime() == 0 || d.GetHealthCheckTimeoutSeconds() != 30 {
			s.t.Errorf("device %v: lastUpdated %d, timeout %ds", d.GetDevice(), d.GetLastUpdatedTime(), d.GetHealthCheckTimeoutSeconds())
		}
		out[d.GetDevice().GetPoolName()+"/"+d.GetDevice().GetDeviceName()] = strings.TrimSpace(d.GetHealth().String() + " " + d.GetMessage())
	}
	return out
}

// until reads reports until one equals want; the stream's deadline bounds it.
func (s *stream) until(want map[string]string) {
	s.t.Helper()
	var seen []map[string]string
	for range 100 {
		got := s.next()
		if maps.Equal(got, want) {
			return
		}
		seen = append(seen, got)
	}
	s.t.Fatalf("no report %v; got %v", want, seen)
}

func TestHealthStreamOverGRPC(t *testing.T) {
	devices := []health.Device{{UUID: gpus[0], Index: 0}, {UUID: gpus[1], Index: 1}}
	tracker, err := health.NewTracker(health.DefaultPolicy(), devices)
	if err != nil {
		t.Fatal(err)
	}
	monitor := health.NewMonitor(tracker)
	clk := clocktesting.NewFakeClock(time.Unix(5000, 0))
	reporter := healthstream.NewHealthReporter(monitor, map[string]dra.DeviceID{
		gpus[0]: {Pool: "node-a", Device: "gpu-0"},
		gpus[1]: {Pool: "node-a", Device: "gpu-1"},
	}, healthstream.HealthOptions{Clock: clk})

	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), testr.New(t)))
	defer cancel()
	dataDir, regDir := shortDir(t), shortDir(t)
	helper, err := kubeletplugin.Start(ctx, driver{health: reporter, t: t},
		kubeletplugin.DriverName(driverName), kubeletplugin.NodeName("node-a"), kubeletplugin.KubeClient(fake.NewClientset()),
		kubeletplugin.PluginDataDirectoryPath(dataDir), kubeletplugin.RegistrarDirectoryPath(regDir))
	if err != nil {
		t.Fatal(err)
	}
	defer helper.Stop()
	k := newKubelet(t, regDir)
	at := time.Unix(6000, 0)

	healthy := map[string]string{"node-a/gpu-0": "HEALTHY", "node-a/gpu-1": "HEALTHY"}
	sick := map[string]string{"node-a/gpu-0": "HEALTHY", "node-a/gpu-1": "UNHEALTHY XID48: " + xidMessage(t, 48)}

	t.Run("initial state", func(t *testing.T) {
		s := k.watch()
		defer s.cancel()
		s.until(healthy)
	})

	t.Run("fault and recovery", func(t *testing.T) {
		s := k.watch()
		defer s.cancel()
		s.until(healthy)
		monitor.Signal(health.XIDSignal(gpus[1], 48, at))
		s.until(sick)
		monitor.Signal(health.Signal{Kind: health.SignalReset, Device: gpus[1], Time: at})
		s.until(healthy)
	})

	t.Run("a restarted stream starts from the current state", func(t *testing.T) {
		s := k.watch()
		s.until(healthy)
		s.cancel()
		monitor.Signal(health.XIDSignal(gpus[1], 48, at)) // while no stream is open
		s = k.watch()
		defer s.cancel()
		if got := s.next(); !maps.Equal(got, sick) {
			t.Errorf("first report %v, want %v", got, sick)
		}
		monitor.Signal(health.Signal{Kind: health.SignalReset, Device: gpus[1], Time: at})
		s.until(healthy)
	})

	t.Run("resent when nothing changes", func(t *testing.T) {
		s := k.watch()
		defer s.cancel()
		s.until(healthy)
		// The reporter's ticker exists once the stream is open; every step past the resend
		// period must bring the full report again, so the kubelet's lease never runs out.
		for range 2 {
			waitForTicker(t, clk)
			clk.Step(healthstream.DefaultResendEvery)
			if got := s.next(); !maps.Equal(got, healthy) {
				t.Errorf("resent report %v, want %v", got, healthy)
			}
		}
	})

	t.Run("unmonitored is unknown, a device map change is sent", func(t *testing.T) {
		s := k.watch()
		defer s.cancel()
		s.until(healthy)
		monitor.SetUnmonitored(gpus[0], true)
		s.until(map[string]string{"node-a/gpu-0": "UNKNOWN the GPU backend cannot watch this device", "node-a/gpu-1": "HEALTHY"})
		monitor.SetUnmonitored(gpus[0], false)
		s.until(healthy)
		reporter.SetDevices(map[string]dra.DeviceID{gpus[1]: {Pool: "node-a", Device: "gpu-1"}})
		s.until(map[string]string{"node-a/gpu-1": "HEALTHY"})
	})
}

// xidMessage is the library's message for an XID condition, read from the library itself so the
// test does not restate the XID catalog.
func xidMessage(t *testing.T, code uint32) string {
	t.Helper()
	tr, err := health.NewTracker(health.DefaultPolicy(), []health.Device{{UUID: "GPU-x"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Observe(health.XIDSignal("GPU-x", code, time.Unix(1, 0)), nil); err != nil {
		t.Fatal(err)
	}
	d := tr.Snapshot().Devices[0]
	if len(d.Conditions) == 0 {
		t.Fatalf("XID %d raises no condition", code)
	}
	return d.Conditions[0].Message
}

func waitForTicker(t *testing.T, clk *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !clk.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("the reporter never started its resend ticker"))
		}
		time.Sleep(time.Millisecond)
	}
}
