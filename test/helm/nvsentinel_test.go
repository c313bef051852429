package helm

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestNVSentinelChart: the nvsentinel reporter is opt-in; with it the agent container mounts the
// host directory of the platform-connector's socket (read-only, at the same path, so that the
// configured socket is where the agent looks), and the rendered HealthConfig carries the section.
// Two repairers are refused at install.
func TestNVSentinelChart(t *testing.T) {
	requireHelm(t)
	mount := func(r rendered) (corev1.VolumeMount, corev1.Volume, bool) {
		var ds appsv1.DaemonSet
		r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
		var m corev1.VolumeMount
		var v corev1.Volume
		for _, c := range ds.Spec.Template.Spec.Containers {
			for _, cm := range c.VolumeMounts {
				if cm.Name == "nvsentinel" && c.Name == "agent" {
					m = cm
				}
			}
		}
		for _, pv := range ds.Spec.Template.Spec.Volumes {
			if pv.Name == "nvsentinel" {
				v = pv
			}
		}
		return m, v, m.Name != "" || v.Name != ""
	}
	if _, _, ok := mount(render(t)); ok {
		t.Error("the default values mount NVSentinel's socket directory")
	}
	for _, tc := range []struct {
		name    string
		set     []string
		dir     string
		section config.NVSentinelConfig
	}{
		{"NVSentinel's own path", []string{"config.agent.reporters={annotation,nvsentinel}"}, "/var/run/nvsentinel",
			config.NVSentinelConfig{Socket: "/var/run/nvsentinel/nvsentinel.sock", Remediation: "gpuhealth"}},
		{"a socket elsewhere, NVSentinel repairing", []string{"config.agent.reporters={nvsentinel}", "config.agent.nvsentinel.socket=/run/nvs/pc.sock",
			"config.agent.nvsentinel.remediation=nvsentinel", "config.agent.nvsentinel.rebootAction=RESTART_VM"}, "/run/nvs",
			config.NVSentinelConfig{Socket: "/run/nvs/pc.sock", Remediation: "nvsentinel", RebootAction: "RESTART_VM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			m, v, _ := mount(r)
			if m.MountPath != tc.dir || !m.ReadOnly || v.HostPath == nil || v.HostPath.Path != tc.dir ||
				v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
				t.Errorf("mount %+v, volume %+v; want %s from the host, read-only, DirectoryOrCreate", m, v.VolumeSource, tc.dir)
			}
			var cm corev1.ConfigMap
			r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
			cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
			if err != nil {
				t.Fatalf("rendered HealthConfig: %v", err)
			}
			if got := cfg.AgentSection().NVSentinel; got != tc.section {
				t.Errorf("rendered agent.nvsentinel %+v, want %+v", got, tc.section)
			}
		})
	}
	_, err := Template(context.Background(), Options{Release: "gpuhealth", Namespace: testNamespace, Set: []string{
		"config.agent.reporters={nvsentinel}", "config.agent.nvsentinel.remediation=nvsentinel", "config.remediation.enabled=true"}})
	if err == nil || !strings.Contains(err.Error(), "both would reset the same GPUs") {
		t.Errorf("two repairers: %v, want the chart to refuse", err)
	}
}
