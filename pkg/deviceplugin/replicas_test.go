package deviceplugin_test

import (
	"context"
	"slices"
	"testing"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/gpuhealth/gpuhealth/pkg/deviceplugin"
	"github.com/gpuhealth/gpuhealth/pkg/health"
)

func replicaSnapshot(unhealthy ...string) health.Snapshot {
	var devs []health.DeviceStatus
	for i, u := range []string{"GPU-0", "GPU-1", "GPU-2"} {
		d := health.DeviceStatus{Device: health.Device{UUID: u, Index: i}, Health: health.Healthy}
		if slices.Contains(unhealthy, u) {
			d.Health = health.Unhealthy
		}
		devs = append(devs, d)
	}
	return health.Snapshot{Devices: devs}
}

func TestDevicesWithReplicas(t *testing.T) {
	devs := deviceplugin.Devices(replicaSnapshot("GPU-1"), deviceplugin.Options{Replicas: 2})
	var got []string
	for _, d := range devs {
		got = append(got, d.GetID()+"="+d.GetHealth())
	}
	want := []string{
		"GPU-0::0=Healthy", "GPU-0::1=Healthy",
		"GPU-1::0=Unhealthy", "GPU-1::1=Unhealthy", // every replica of a sick GPU is sick
		"GPU-2::0=Healthy", "GPU-2::1=Healthy",
	}
	if !slices.Equal(got, want) {
		t.Errorf("devices = %v, want %v", got, want)
	}
	if one := deviceplugin.Devices(replicaSnapshot(), deviceplugin.Options{Replicas: 1}); one[0].GetID() != "GPU-0" {
		t.Errorf("one replica: ID %q, want the bare UUID", one[0].GetID())
	}
}

func TestAllocateReplicasGivesEachGPUOnce(t *testing.T) {
	tracker, err := health.NewTracker(health.DefaultPolicy(), replicaSnapshotDevices())
	if err != nil {
		t.Fatal(err)
	}
	for _, cdi := range []bool{false, true} {
		svc := deviceplugin.NewService(health.NewMonitor(tracker), deviceplugin.ServiceOptions{Options: deviceplugin.Options{Replicas: 4}, CDI: cdi})
		resp, err := svc.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"GPU-2::3", "GPU-0::1", "GPU-2::0"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		c := resp.GetContainerResponses()[0]
		if cdi {
			var names []string
			for _, d := range c.GetCdiDevices() {
				names = append(names, d.GetName())
			}
			if want := []string{"nvidia.com/gpu=GPU-2", "nvidia.com/gpu=GPU-0"}; !slices.Equal(names, want) {
				t.Errorf("CDI devices %v, want %v", names, want)
			}
		} else if got := c.GetEnvs()[deviceplugin.VisibleDevicesEnv]; got != "GPU-2,GPU-0" {
			t.Errorf("%s = %q, want GPU-2,GPU-0", deviceplugin.VisibleDevicesEnv, got)
		}
		if _, err := svc.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"GPU-0::4"}},
		}}); err == nil {
			t.Error("Allocate accepted a replica number that is not advertised")
		}
	}
}

func replicaSnapshotDevices() []health.Device {
	var out []health.Device
	for _, d := range replicaSnapshot().Devices {
		out = append(out, d.Device)
	}
	return out
}

func TestPreferredSpreadsReplicas(t *testing.T) {
	snap := replicaSnapshot("GPU-1")
	known := map[string]health.DeviceStatus{}
	for _, d := range snap.Devices {
		for n := range 3 {
			known[deviceplugin.ReplicaID(d.Device.UUID, n)] = d
		}
	}
	for _, tc := range []struct {
		name      string
		available []string
		size      int
		want      []string
	}{
		{
			name:      "one replica per GPU before a second, healthy GPUs first",
			available: []string{"GPU-0::0", "GPU-0::1", "GPU-0::2", "GPU-1::0", "GPU-1::1", "GPU-2::0", "GPU-2::1", "GPU-2::2"},
			size:      3,
			want:      []string{"GPU-0::0", "GPU-2::0", "GPU-0::1"},
		},
		{
			name:      "the least loaded GPU first, even twice: GPU-0 has 2 of 3 replicas in use",
			available: []string{"GPU-0::2", "GPU-2::0", "GPU-2::1", "GPU-2::2"},
			size:      2,
			want:      []string{"GPU-2::0", "GPU-2::1"},
		},
		{
			name:      "equal load alternates GPUs",
			available: []string{"GPU-0::1", "GPU-0::2", "GPU-2::1", "GPU-2::2"},
			size:      3,
			want:      []string{"GPU-0::1", "GPU-2::1", "GPU-0::2"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := deviceplugin.Preferred(known, nil, tc.available, nil, tc.size)
			if !slices.Equal(got, tc.want) {
				t.Errorf("Preferred = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestValidateReplicas(t *testing.T) {
	for n, ok := range map[int]bool{0: false, 1: true, 8: true, deviceplugin.MaxReplicas: true, deviceplugin.MaxReplicas + 1: false, -3: false} {
		if err := deviceplugin.ValidateReplicas(n); (err == nil) != ok {
			t.Errorf("ValidateReplicas(%d) = %v", n, err)
		}
	}
	if got := deviceplugin.GPUOf("GPU-7::12"); got != "GPU-7" {
		t.Errorf("GPUOf = %q", got)
	}
}
