package helm

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// podReads returns, for every ClusterRole and Role the chart renders, the rules that let their
// subjects list or watch pods (wildcards included): a list or watch returns every pod's spec,
// environment variables included.
func podReads(t *testing.T, r rendered) []string {
	t.Helper()
	var out []string
	for _, key := range r.keys() {
		kind, name, _ := strings.Cut(key, "/")
		if kind != "ClusterRole" && kind != "Role" {
			continue
		}
		var role rbacv1.ClusterRole // a Role's rules decode alike
		r.get(t, kind, name, &role)
		for _, rule := range role.Rules {
			core := slices.Contains(rule.APIGroups, "") || slices.Contains(rule.APIGroups, "*")
			pods := slices.Contains(rule.Resources, "pods") || slices.Contains(rule.Resources, "*")
			reads := slices.ContainsFunc(rule.Verbs, func(v string) bool { return v == "list" || v == "watch" || v == "*" })
			if core && pods && reads {
				out = append(out, key+": "+rulesString([]rbacv1.PolicyRule{rule}))
			}
		}
	}
	return out
}

func podResourcesMount(t *testing.T, r rendered) (mounted, volume bool) {
	t.Helper()
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	for _, m := range ds.Spec.Template.Spec.Containers[0].VolumeMounts {
		if m.Name == "pod-resources" {
			mounted = m.MountPath == "/var/lib/kubelet/pod-resources" && m.ReadOnly
		}
	}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		if v.Name == "pod-resources" {
			volume = v.HostPath != nil && v.HostPath.Path == "/var/lib/kubelet/pod-resources"
		}
	}
	return mounted, volume
}

// TestDefaultInstallListsNoPods: with the default values nothing the chart renders may list or
// watch pods: the claimstatus reporter (on by default) finds the claims of its node's pods through
// the kubelet's pod-resources API, mounted read-only. Only config.agent.claimStatus.podWatch
// grants the agents a pod watch, and then they need no socket for it.
func TestDefaultInstallListsNoPods(t *testing.T) {
	requireHelm(t)
	for _, tc := range []struct {
		name      string
		set       []string
		podReads  bool
		mount     bool
		podWatch  bool
		reporters []string
	}{
		{name: "defaults", mount: true, reporters: config.AllReporters()},
		{name: "a pod watch for claims", set: []string{"config.agent.claimStatus.podWatch=true"}, podReads: true, podWatch: true},
		{name: "no claimstatus", set: []string{"config.agent.reporters={annotation,devicetaint,condition}"}},
		{name: "no claimstatus, a pod watch asked for", set: []string{"config.agent.reporters={annotation}", "config.agent.claimStatus.podWatch=true"}, podWatch: true},
		{name: "remediation lists the node's pods", set: []string{"config.remediation.enabled=true"}, podReads: true, mount: true},
		{name: "eviction reads pods (its own ClusterRole)", set: []string{"config.agent.eviction.enabled=true"}, podReads: true, mount: true},
		{name: "the fleet's shared causes list pods (the breaker controller's ClusterRole)", set: []string{"config.fleet.sharedCauses.enabled=true"}, podReads: true, mount: true, reporters: config.AllReporters()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			if got := podReads(t, r); (len(got) > 0) != tc.podReads {
				t.Errorf("rules that list or watch pods: %v; want some: %v", got, tc.podReads)
			}
			if mounted, volume := podResourcesMount(t, r); mounted != tc.mount || volume != tc.mount {
				t.Errorf("pod-resources socket mounted read-only %v, hostPath volume %v; want %v", mounted, volume, tc.mount)
			}
			var cm corev1.ConfigMap
			r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
			cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
			if err != nil {
				t.Fatalf("rendered HealthConfig: %v", err)
			}
			a := cfg.Agent.WithDefaults()
			if a.ClaimStatus.PodWatch != tc.podWatch || a.ClaimStatus.PodResourcesSocket != "/var/lib/kubelet/pod-resources/kubelet.sock" {
				t.Errorf("the agent's claimStatus %+v, want podWatch %v and the kubelet's socket under the mount", a.ClaimStatus, tc.podWatch)
			}
			if tc.reporters != nil && !slices.Equal(a.Reporters, tc.reporters) {
				t.Errorf("reporters %v, want %v", a.Reporters, tc.reporters)
			}
		})
	}
}
