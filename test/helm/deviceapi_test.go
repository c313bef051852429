package helm

import (
	"context"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestDeviceAPIChart: the Device API is off by default; a socket path turns it on, and the agent
// then mounts the socket's host directory read-write (it creates the socket there), at the same
// path; a group makes the pod a member (supplementalGroups), so that the agent may give it the
// socket. A group name, which means nothing in the image, is refused at install.
func TestDeviceAPIChart(t *testing.T) {
	requireHelm(t)
	type view struct {
		mount  *corev1.VolumeMount
		volume *corev1.Volume
		groups []int64
		api    config.DeviceAPIConfig
	}
	look := func(r rendered) view {
		var ds appsv1.DaemonSet
		r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
		var v view
		spec := ds.Spec.Template.Spec
		for _, c := range spec.Containers {
			for i, m := range c.VolumeMounts {
				if m.Name == "device-api" {
					if c.Name != "agent" {
						t.Errorf("container %s mounts the Device API's directory", c.Name)
					}
					v.mount = &c.VolumeMounts[i]
				}
			}
		}
		for i, pv := range spec.Volumes {
			if pv.Name == "device-api" {
				v.volume = &spec.Volumes[i]
			}
		}
		if spec.SecurityContext != nil {
			v.groups = spec.SecurityContext.SupplementalGroups
		}
		var cm corev1.ConfigMap
		r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
		cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
		if err != nil {
			t.Fatalf("rendered HealthConfig: %v\n%s", err, cm.Data["healthconfig.yaml"])
		}
		v.api = cfg.AgentSection().DeviceAPI
		return v
	}
	if v := look(render(t)); v.mount != nil || v.volume != nil || v.groups != nil || v.api.Socket != "" {
		t.Errorf("the default values serve the Device API: %+v", v)
	}
	for _, tc := range []struct {
		name   string
		set    []string
		groups []int64
		api    config.DeviceAPIConfig
	}{
		{"a socket: root alone", []string{"config.agent.deviceAPI.socket=/var/run/gpuhealth/device-api.sock"}, nil,
			config.DeviceAPIConfig{Socket: "/var/run/gpuhealth/device-api.sock", MaxWatchers: 64}},
		{"a socket for a group", []string{"config.agent.deviceAPI.socket=/var/run/gpuhealth/device-api.sock", "config.agent.deviceAPI.group=2000", "config.agent.deviceAPI.maxWatchers=8"},
			[]int64{2000}, config.DeviceAPIConfig{Socket: "/var/run/gpuhealth/device-api.sock", Group: "2000", MaxWatchers: 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := look(render(t, tc.set...))
			if v.mount == nil || v.mount.MountPath != "/var/run/gpuhealth" || v.mount.ReadOnly {
				t.Errorf("agent mount %+v, want /var/run/gpuhealth read-write", v.mount)
			}
			if v.volume == nil || v.volume.HostPath == nil || v.volume.HostPath.Path != "/var/run/gpuhealth" ||
				v.volume.HostPath.Type == nil || *v.volume.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("volume %+v, want the host's /var/run/gpuhealth, DirectoryOrCreate", v.volume)
			}
			if !slices.Equal(v.groups, tc.groups) {
				t.Errorf("supplementalGroups %v, want %v", v.groups, tc.groups)
			}
			if v.api != tc.api {
				t.Errorf("rendered agent.deviceAPI %+v, want %+v", v.api, tc.api)
			}
		})
	}
	for _, tc := range []struct {
		name string
		set  []string
		want string
	}{
		{"a group name", []string{"config.agent.deviceAPI.socket=/run/g/d.sock", "config.agent.deviceAPI.group=gpu-readers"}, "must be a numeric GID"},
		{"NVSentinel's directory", []string{"config.agent.deviceAPI.socket=/var/run/nvsentinel/d.sock", "config.agent.reporters={nvsentinel}"}, "NVSentinel's socket directory"},
	} {
		_, err := Template(context.Background(), Options{Release: "gpuhealth", Namespace: testNamespace, Set: tc.set})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want the chart to refuse: %s", tc.name, err, tc.want)
		}
	}
}
