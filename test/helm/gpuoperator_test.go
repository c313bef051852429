package helm

import (
	"context"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/internal/remediation"
)

// TestGPUOperatorValues: the values for an operator-managed cluster lint, and the agent they
// render leaves for the operator's driver and MIG managers (nvidia.com/gpu.deploy.client in its
// nodeSelector, which the managers wait on), runs under the operator's RuntimeClass, stops in
// time, and asks for no GPU (a pod that does is one the driver upgrade must delete, and a
// DaemonSet pod cannot be).
func TestGPUOperatorValues(t *testing.T) {
	requireHelm(t)
	o := Options{Release: "gpuhealth", Namespace: testNamespace, Values: []string{"deployments/helm/gpuhealth/gpu-operator-values.yaml"}}
	if out, err := Lint(context.Background(), o); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	r := renderWith(t, o)
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	pod := ds.Spec.Template.Spec
	if pod.NodeSelector["nvidia.com/gpu.deploy.client"] != "true" || pod.NodeSelector["nvidia.com/gpu.present"] != "true" {
		t.Errorf("nodeSelector %v: the operator's managers wait only for pods selecting nvidia.com/gpu.deploy.client", pod.NodeSelector)
	}
	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName %v, want the operator's nvidia", pod.RuntimeClassName)
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || *g > 60 {
		t.Errorf("terminationGracePeriodSeconds %v: a paused agent must be gone well within the managers' five minutes", g)
	}
	for _, c := range append(pod.InitContainers, pod.Containers...) {
		for _, list := range []corev1.ResourceList{c.Resources.Requests, c.Resources.Limits} {
			for name := range list {
				if isGPUResource(name) {
					t.Errorf("container %s asks for %s: the driver upgrade would have to delete the pod", c.Name, name)
				}
			}
		}
		if len(c.Resources.Claims) > 0 {
			t.Errorf("container %s holds a ResourceClaim", c.Name)
		}
	}
}

// isGPUResource is what the operator's upgrade counts as a GPU pod's request.
func isGPUResource(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), "nvidia.com/gpu") || strings.HasPrefix(string(name), "nvidia.com/mig-")
}

// TestAgentHostPID: the agent joins the host's PID namespace only when asked (so that a failed
// reset names the host's processes holding the GPU); the default keeps its own.
func TestAgentHostPID(t *testing.T) {
	requireHelm(t)
	for _, tc := range []struct {
		set  []string
		want bool
	}{{nil, false}, {[]string{"agent.hostPID=true"}, true}} {
		var ds appsv1.DaemonSet
		render(t, tc.set...).get(t, "DaemonSet", "gpuhealth-agent", &ds)
		if got := ds.Spec.Template.Spec.HostPID; got != tc.want {
			t.Errorf("with %v hostPID = %v, want %v", tc.set, got, tc.want)
		}
	}
}

// TestPauseOperatorComponentsPolicy: the admission policy lets the agent touch a GPU operator
// component's label only with remediation.pauseOperatorComponents.
func TestPauseOperatorComponentsPolicy(t *testing.T) {
	requireHelm(t)
	for _, tc := range []struct {
		set  []string
		want bool
	}{
		{[]string{"config.remediation.enabled=true"}, false},
		{[]string{"config.remediation.enabled=true", "config.remediation.pauseOperatorComponents=true"}, true},
	} {
		out, err := Template(context.Background(), Options{Release: "gpuhealth", Namespace: testNamespace, Set: tc.set})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(out, "optional.of('paused-by-gpuhealth')"); got != tc.want {
			t.Errorf("with %v the policy allows paused-by-gpuhealth: %v, want %v", tc.set, got, tc.want)
		}
		// The policy's labels are exactly those remediation pauses.
		for _, k := range remediation.GPUClientComponents {
			if got := strings.Contains(out, "'"+k+"'"); got != tc.want {
				t.Errorf("with %v the policy names %s: %v, want %v", tc.set, k, got, tc.want)
			}
		}
		if strings.Contains(out, "'nvidia.com/gpu.deploy.driver'") {
			t.Errorf("with %v the policy lets the agent pause the driver", tc.set)
		}
	}
}
