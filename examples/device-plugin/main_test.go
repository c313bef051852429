package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin/deviceplugintest"
	"github.com/gpuhealth/gpuhealth/pkg/gpu/sim"
)

// TestRun runs the example against deviceplugintest's kubelet (real gRPC on Unix sockets): it
// registers, lists the simulated GPUs by UUID, marks the GPU with XID 48 Unhealthy, and
// allocates by NVIDIA_VISIBLE_DEVICES.
func TestRun(t *testing.T) {
	// Unix socket paths are limited to 108 bytes: a short directory, not t.TempDir().
	dir, err := os.MkdirTemp("", "dp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	scenario := filepath.Join(dir, "scenario.yaml")
	if err := os.WriteFile(scenario, []byte(`apiVersion: gpuhealth.dev/v1alpha1
kind: Scenario
node: node-a
gpus: {count: 2}
events:
  - {at: 0s, gpu: 1, xid: 48}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	kubelet, err := deviceplugintest.Start(dir, deviceplugintest.Options{KeepSockets: true})
	if err != nil {
		t.Fatal(err)
	}
	defer kubelet.Stop()

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() {
		done <- run(runCtx, options{scenario: scenario, resourceName: "nvidia.com/gpu", socketDir: dir})
	}()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	}()

	p, err := kubelet.Registered(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := p.Request.GetResourceName(); got != "nvidia.com/gpu" {
		t.Errorf("registered %q", got)
	}
	gpu0, gpu1 := sim.GPUUUID("node-a", 0), sim.GPUUUID("node-a", 1)
	if _, err := p.WaitFor(ctx, func(devs []*pluginapi.Device) bool {
		h := deviceplugintest.Health(devs)
		return len(h) == 2 && h[gpu0] == pluginapi.Healthy && h[gpu1] == pluginapi.Unhealthy
	}); err != nil {
		t.Fatal(err)
	}
	resp, err := p.Client.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{gpu0}}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := resp.GetContainerResponses()[0].GetEnvs()["NVIDIA_VISIBLE_DEVICES"]; got != gpu0 {
		t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %s", got, gpu0)
	}
}

// TestOnlyPublicPackages holds the example to its point: it uses gpuhealth's public packages
// (pkg/...) and nothing internal, which Go would allow here (the module path is under the
// repository's).
func TestOnlyPublicPackages(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		if strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/") && !strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/pkg/") &&
			!strings.HasPrefix(dep, "github.com/gpuhealth/gpuhealth/examples/") {
			t.Errorf("the example depends on %s: only github.com/gpuhealth/gpuhealth/pkg/... is public", dep)
		}
	}
}
