package cli_test

import (
	"bytes"
	"context"
	"maps"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/internal/cli"
	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin/deviceplugintest"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// A reset-class XID on GPU 1, and the reset that clears it.
const devicePluginScenario = `apiVersion: gpuhealth.dev/v1alpha1
kind: Scenario
node: dp-node
gpus: {count: 2}
events:
  - {at: 2s, gpu: 1, xid: 48}
  - {at: 5s, gpu: 1, reset: true}
`

// syncBuffer is a bytes.Buffer the command's logger and the test may use at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestDevicePluginSimAgainstKubelet(t *testing.T) {
	// A Unix socket path must fit in 108 bytes; t.TempDir() grows with the test name.
	dir, err := os.MkdirTemp("", "dpcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	kubelet, err := deviceplugintest.Start(dir, deviceplugintest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Stop()

	scenario := writeFile(t, "scenario.yaml", devicePluginScenario)
	checkpoint := t.TempDir() + "/checkpoint.json"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stdout, stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- cli.Execute(ctx, []string{"device-plugin", "--backend", "sim", "--scenario", scenario,
			"--kubelet-socket-dir", dir, "--cdi", "--checkpoint", checkpoint}, &stdout, &stderr)
	}()

	wait, done := context.WithTimeout(ctx, time.Minute)
	defer done()
	p, err := kubelet.Registered(wait)
	if err != nil {
		t.Fatalf("%v; stderr:\n%s", err, stderr.String())
	}
	gpu0, gpu1 := sim.GPUUUID("dp-node", 0), sim.GPUUUID("dp-node", 1)
	healthy := map[string]string{gpu0: pluginapi.Healthy, gpu1: pluginapi.Healthy}
	for _, want := range []map[string]string{
		healthy,
		{gpu0: pluginapi.Healthy, gpu1: pluginapi.Unhealthy}, // XID 48
		healthy, // the reset
	} {
		if _, err := p.WaitFor(wait, func(devs []*pluginapi.Device) bool {
			return maps.Equal(deviceplugintest.Health(devs), want)
		}); err != nil {
			t.Fatalf("waiting for %v: %v; stderr:\n%s", want, err, stderr.String())
		}
	}

	resp, err := p.Client.Allocate(wait, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{gpu1}}}})
	if err != nil {
		t.Fatal(err)
	}
	var cdi []string
	for _, d := range resp.GetContainerResponses()[0].GetCdiDevices() {
		cdi = append(cdi, d.GetName())
	}
	if want := []string{"nvidia.com/gpu=" + gpu1}; !slices.Equal(cdi, want) {
		t.Errorf("--cdi Allocate gave %v, want %v", cdi, want)
	}

	cancel()
	select {
	case code := <-exit:
		if code != cli.ExitOK {
			t.Errorf("exit code %d after interrupt, want 0; stderr:\n%s", code, stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatal("device-plugin did not stop on interrupt")
	}
	if _, err := os.Stat(checkpoint); err != nil {
		t.Errorf("checkpoint not written: %v", err)
	}
}

func TestDevicePluginBadInput(t *testing.T) {
	scenario := writeFile(t, "scenario.yaml", devicePluginScenario)
	tests := []struct {
		name string
		args []string
	}{
		{"unknown backend", []string{"--backend", "cuda"}},
		{"sim without scenario", []string{"--backend", "sim"}},
		{"scenario with nvml", []string{"--backend", "nvml", "--scenario", scenario}},
		{"resource name without domain", []string{"--backend", "sim", "--scenario", scenario, "--resource-name", "gpu"}},
		{"no socket dir", []string{"--backend", "sim", "--scenario", scenario, "--kubelet-socket-dir", ""}},
		{"zero replicas", []string{"--backend", "sim", "--scenario", scenario, "--replicas", "0"}},
		{"too many replicas", []string{"--backend", "sim", "--scenario", scenario, "--replicas", "1000"}},
		{"missing config", []string{"--backend", "sim", "--scenario", scenario, "--config", "/nonexistent.yaml"}},
		{"bad log format", []string{"--log-format", "xml"}},
		{"arguments", []string{"extra"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := cli.Execute(context.Background(), append([]string{"device-plugin"}, tc.args...), &stdout, &stderr)
			if code != cli.ExitBadInput {
				t.Errorf("exit code %d, want %d; stderr %q", code, cli.ExitBadInput, stderr.String())
			}
		})
	}
}

// TestDevicePluginRestartKeepsRebootFault restarts the plugin on the same boot with a scenario
// that has no faults: a fault that lasts until a reboot must come back from the checkpoint, also
// when the first run started without one.
func TestDevicePluginRestartKeepsRebootFault(t *testing.T) {
	dir, err := os.MkdirTemp("", "dpcli")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	checkpoint := t.TempDir() + "/checkpoint.json"
	gpu0, gpu1 := sim.GPUUUID("dp-node", 0), sim.GPUUUID("dp-node", 1)
	runs := []struct {
		events string
		want   map[string]string
	}{
		{"  - {at: 1s, gpu: 1, xid: 79}\n", map[string]string{gpu0: pluginapi.Healthy, gpu1: pluginapi.Unhealthy}},
		{"  []\n", map[string]string{gpu0: pluginapi.Healthy, gpu1: pluginapi.Unhealthy}},
	}
	for i, run := range runs {
		kubelet, err := deviceplugintest.Start(dir, deviceplugintest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		scenario := writeFile(t, "scenario.yaml", "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\nnode: dp-node\ngpus: {count: 2}\nevents:\n"+run.events)
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr syncBuffer
		exit := make(chan int, 1)
		go func() {
			exit <- cli.Execute(ctx, []string{"device-plugin", "--backend", "sim", "--scenario", scenario,
				"--kubelet-socket-dir", dir, "--checkpoint", checkpoint}, &stdout, &stderr)
		}()
		wait, done := context.WithTimeout(ctx, time.Minute)
		p, err := kubelet.Registered(wait)
		if err == nil {
			_, err = p.WaitFor(wait, func(devs []*pluginapi.Device) bool {
				return maps.Equal(deviceplugintest.Health(devs), run.want)
			})
		}
		done()
		cancel()
		<-exit
		kubelet.Stop()
		if err != nil {
			t.Fatalf("run %d: waiting for %v: %v; stderr:\n%s", i+1, run.want, err, stderr.String())
		}
	}
}
