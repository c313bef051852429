package helm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpuhealth/gpuhealth/internal/agent"
	"github.com/gpuhealth/gpuhealth/internal/breaker"
	"github.com/gpuhealth/gpuhealth/internal/fleet/records"
	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

const testNamespace = "gpuhealth-system"

// requireHelm skips the test when no helm binary can be found or built; CI installs it first
// (hack/tools.sh install helm), so there the tests always run.
func requireHelm(t *testing.T) {
	t.Helper()
	if _, err := Binary(); err != nil {
		t.Skipf("skipping: the helm tool could not be built (hack/tools.sh install helm): %v", err)
	}
}

// rendered is the chart rendered with some values, indexed by kind and name.
type rendered map[string]*unstructured.Unstructured

func render(t *testing.T, set ...string) rendered {
	t.Helper()
	return renderWith(t, Options{Release: "gpuhealth", Namespace: testNamespace, Set: set})
}

// renderWith is render with helm options of its own (values files, --set-file).
func renderWith(t *testing.T, o Options) rendered {
	t.Helper()
	out, err := Template(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := Decode(out)
	if err != nil {
		t.Fatal(err)
	}
	r := rendered{}
	for _, o := range objs {
		key := o.GetKind() + "/" + o.GetName()
		if _, dup := r[key]; dup {
			t.Fatalf("rendered twice: %s", key)
		}
		r[key] = o
	}
	return r
}

// get converts the rendered object kind/name into out, failing if it is missing.
func (r rendered) get(t *testing.T, kind, name string, out any) {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("%s/%s not rendered; have %v", kind, name, r.keys())
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
		t.Fatalf("%s/%s: %v", kind, name, err)
	}
}

func (r rendered) has(kind, name string) bool {
	_, ok := r[kind+"/"+name]
	return ok
}

func (r rendered) keys() []string {
	var keys []string
	for k := range r {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

var valueSets = []struct {
	name string
	set  []string
}{
	{"defaults", nil},
	{"extender and serviceMonitor", []string{"extender.enabled=true", "serviceMonitor.enabled=true"}},
	{"extender binding", []string{"extender.enabled=true", "extender.bind=true"}},
	{"device mounts, no policy", []string{"agent.nvml.mode=hostMounts", "admissionPolicy.enabled=false"}},
	{"circuit breaker, no flow control", []string{"config.agent.circuitBreaker.enabled=true", "agent.flowControl.enabled=false"}},
	{"alerts and dashboard", []string{"prometheusRule.enabled=true", "grafanaDashboard.enabled=true"}},
	{"remediation with validation and a dcgmi", []string{"config.remediation.enabled=true", "config.remediation.validation.enabled=true", "agent.validation.dcgmImage=dcgm:4"}},
	{"the fleet's shared causes alone", []string{"config.fleet.sharedCauses.enabled=true", "breakerController.agentSilence.enabled=false"}},
}

func TestLint(t *testing.T) {
	requireHelm(t)
	for _, tc := range valueSets {
		t.Run(tc.name, func(t *testing.T) {
			if out, err := Lint(context.Background(), Options{Set: tc.set}); err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
		})
	}
}

// TestAgentClusterRoleIsLeastPrivilege: the chart grants the agent exactly the rules the agent
// declares it needs for the reporters and remediation it runs (and that the e2e tests run it
// with), no more: no pod or claim access without a part that reads them. Events are allowed
// only in the default namespace, where Events about its Node go.
func TestAgentClusterRoleIsLeastPrivilege(t *testing.T) {
	requireHelm(t)
	for _, tc := range []struct {
		name        string
		set         []string
		reporters   []string
		remediation bool
		podWatch    bool
	}{
		{"defaults", nil, config.AllReporters(), false, false},
		{"Volcano only: no pods, claims, slices or rules", []string{"config.agent.reporters={annotation}"}, []string{"annotation"}, false, false},
		{"rules and condition", []string{"config.agent.reporters={devicetaint,condition}"}, []string{"devicetaint", "condition"}, false, false},
		{"HAMi with remediation: pods and claims for the holders", []string{"config.agent.reporters={hami,condition}", "config.remediation.enabled=true"}, []string{"hami", "condition"}, true, false},
		{"validation: nothing more than remediation's", []string{"config.remediation.enabled=true", "config.remediation.validation.enabled=true", "agent.validation.dcgmImage=dcgm:4"}, config.AllReporters(), true, false},
		{"claimstatus by a pod watch", []string{"config.agent.claimStatus.podWatch=true"}, config.AllReporters(), false, true},
		{"a pod watch and remediation", []string{"config.agent.claimStatus.podWatch=true", "config.remediation.enabled=true"}, config.AllReporters(), true, true},
		{"a pod watch without claimstatus grants nothing", []string{"config.agent.claimStatus.podWatch=true", "config.agent.reporters={annotation}"}, []string{"annotation"}, false, true},
		{"no repeat offenders: no records", []string{"config.fleet.repeatOffender=null"}, config.AllReporters(), false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			var role rbacv1.ClusterRole
			r.get(t, "ClusterRole", "gpuhealth-agent", &role)
			want := agent.ClusterRoleRulesFor(tc.reporters, tc.remediation, tc.podWatch)
			if !slices.Contains(tc.set, "config.fleet.repeatOffender=null") { // the default rule reads GPURecords
				want = append(want, agent.RecordsClusterRoleRules()...)
			}
			if !equality.Semantic.DeepEqual(role.Rules, want) {
				t.Errorf("chart's agent ClusterRole rules differ from agent.ClusterRoleRulesFor(%v, %v, %v):\n got %s\nwant %s", tc.reporters, tc.remediation, tc.podWatch, rulesString(role.Rules), rulesString(want))
			}
			var events rbacv1.Role
			r.get(t, "Role", "gpuhealth-agent-events", &events)
			if want := agent.EventsRoleRules(); events.Namespace != agent.EventsNamespace || !equality.Semantic.DeepEqual(events.Rules, want) {
				t.Errorf("events Role in %q with %s, want %q with %s", events.Namespace, rulesString(events.Rules), agent.EventsNamespace, rulesString(want))
			}
			var binding rbacv1.RoleBinding
			r.get(t, "RoleBinding", "gpuhealth-agent-events", &binding)
			if binding.Namespace != agent.EventsNamespace || binding.RoleRef.Name != events.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "gpuhealth-agent" {
				t.Errorf("events RoleBinding = %+v", binding)
			}
		})
	}
}

func TestCircuitBreakerRoleIsLeastPrivilege(t *testing.T) {
	requireHelm(t)
	if render(t).has("Role", "gpuhealth-agent-breaker") {
		t.Error("the breaker's Role is rendered although the breaker is off")
	}
	r := render(t, "config.agent.circuitBreaker.enabled=true")
	var role rbacv1.Role
	r.get(t, "Role", "gpuhealth-agent-breaker", &role)
	if want := agent.BreakerRoleRules(); !equality.Semantic.DeepEqual(role.Rules, want) {
		t.Errorf("chart's breaker Role rules differ from agent.BreakerRoleRules():\n got %s\nwant %s", rulesString(role.Rules), rulesString(want))
	}
	var binding rbacv1.RoleBinding
	r.get(t, "RoleBinding", "gpuhealth-agent-breaker", &binding)
	if binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 || binding.Subjects[0].Name != "gpuhealth-agent" {
		t.Errorf("breaker RoleBinding = %+v", binding)
	}

	// The breaker's controller: least privilege, and the Deployment runs it in the namespace. It
	// also sweeps remediation's slots, so it runs with either.
	const controller = "gpuhealth-breaker-controller"
	if render(t, "breakerController.agentSilence.enabled=false", "config.fleet.records.enabled=false").has("Deployment", controller) {
		t.Error("the breaker controller is rendered although the breaker, remediation, the agent silence watch and the GPU records are off")
	}
	// By default it runs to mark the nodes whose agents went silent, with no taint and no
	// access to the Nodes' spec, and to keep the GPU records (records.ControllerClusterRoleRules).
	recs := records.ControllerClusterRoleRules()
	var silenceRole rbacv1.ClusterRole
	def := render(t)
	def.get(t, "ClusterRole", controller, &silenceRole)
	if want := slices.Concat(breaker.ControllerClusterRoleRules(), recs); !equality.Semantic.DeepEqual(silenceRole.Rules, want) {
		t.Errorf("default breaker controller ClusterRole differs from breaker.ControllerClusterRoleRules():\n got %s\nwant %s", rulesString(silenceRole.Rules), rulesString(want))
	}
	var silenceDep appsv1.Deployment
	def.get(t, "Deployment", controller, &silenceDep)
	if args := strings.Join(silenceDep.Spec.Template.Spec.Containers[0].Args, " "); strings.Contains(args, "--agent-silen") {
		t.Errorf("default breaker controller args %q: want the agent silence watch on by its default, untainted", args)
	}
	tainted := render(t, "breakerController.agentSilence.taint=true")
	tainted.get(t, "ClusterRole", controller, &silenceRole)
	if want := slices.Concat(breaker.ControllerClusterRoleRules(), breaker.SilentTaintClusterRoleRules(), recs); !equality.Semantic.DeepEqual(silenceRole.Rules, want) {
		t.Errorf("breaker controller ClusterRole with the silent taint:\n got %s\nwant %s", rulesString(silenceRole.Rules), rulesString(want))
	}
	tainted.get(t, "Deployment", controller, &silenceDep)
	if !slices.Contains(silenceDep.Spec.Template.Spec.Containers[0].Args, "--agent-silent-taint") {
		t.Errorf("breaker controller args %v lack --agent-silent-taint", silenceDep.Spec.Template.Spec.Containers[0].Args)
	}
	if !render(t, "config.remediation.enabled=true").has("Deployment", controller) {
		t.Error("the breaker controller is not rendered with remediation on: nothing would sweep its expired slots")
	}
	var clusterRole rbacv1.ClusterRole
	r.get(t, "ClusterRole", controller, &clusterRole)
	if want := slices.Concat(breaker.ControllerClusterRoleRules(), recs); !equality.Semantic.DeepEqual(clusterRole.Rules, want) {
		t.Errorf("breaker controller ClusterRole differs from breaker.ControllerClusterRoleRules():\n got %s\nwant %s", rulesString(clusterRole.Rules), rulesString(want))
	}
	var controllerRole rbacv1.Role
	r.get(t, "Role", controller, &controllerRole)
	if want := breaker.ControllerRoleRules(); !equality.Semantic.DeepEqual(controllerRole.Rules, want) {
		t.Errorf("breaker controller Role differs from breaker.ControllerRoleRules():\n got %s\nwant %s", rulesString(controllerRole.Rules), rulesString(want))
	}
	var dep appsv1.Deployment
	r.get(t, "Deployment", controller, &dep)
	ctr := dep.Spec.Template.Spec.Containers[0]
	if len(ctr.Args) < 5 || ctr.Args[0] != "breaker" || ctr.Args[1] != "controller" || ctr.Args[2] != "--metrics-address=:9403" ||
		ctr.Args[3] != "--window=10m" || ctr.Args[4] != "--driver=gpu.nvidia.com" {
		t.Errorf("breaker controller args = %v", ctr.Args)
	}
	if ctr.LivenessProbe == nil || ctr.LivenessProbe.HTTPGet == nil || ctr.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("breaker controller liveness probe = %+v, want /healthz", ctr.LivenessProbe)
	}
	if dep.Spec.Template.Spec.ServiceAccountName != controller {
		t.Errorf("breaker controller runs as %q, want %q", dep.Spec.Template.Spec.ServiceAccountName, controller)
	}
}

func rulesString(rules []rbacv1.PolicyRule) string {
	var b strings.Builder
	for _, r := range rules {
		fmt.Fprintf(&b, "\n  %v %v %v %v", r.APIGroups, r.Resources, r.Verbs, r.ResourceNames)
	}
	return b.String()
}

// TestIdentitiesLineUp: every workload runs as a ServiceAccount the chart creates, every binding
// binds a rendered role to a rendered ServiceAccount, and the policy names the agent's account.
func TestIdentitiesLineUp(t *testing.T) {
	requireHelm(t)
	for _, tc := range valueSets {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			for key, o := range r {
				if o.GetKind() != "ClusterRoleBinding" {
					continue
				}
				var b rbacv1.ClusterRoleBinding
				r.get(t, "ClusterRoleBinding", o.GetName(), &b)
				if b.RoleRef.Kind != "ClusterRole" || !r.has("ClusterRole", b.RoleRef.Name) {
					t.Errorf("%s binds %s %q, which the chart does not render", key, b.RoleRef.Kind, b.RoleRef.Name)
				}
				if len(b.Subjects) != 1 || b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Namespace != testNamespace ||
					!r.has("ServiceAccount", b.Subjects[0].Name) {
					t.Errorf("%s subjects %+v are not one ServiceAccount of the chart in %s", key, b.Subjects, testNamespace)
				}
				if b.RoleRef.Name != b.Name || b.Subjects[0].Name != b.Name {
					t.Errorf("%s: each component's account, role and binding share its name; got role %s, account %s", key, b.RoleRef.Name, b.Subjects[0].Name)
				}
			}
			var ds appsv1.DaemonSet
			r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
			if sa := ds.Spec.Template.Spec.ServiceAccountName; sa != "gpuhealth-agent" || !r.has("ClusterRoleBinding", sa) {
				t.Errorf("agent runs as %q, want the bound gpuhealth-agent", sa)
			}
			if r.has("Deployment", "gpuhealth-extender") {
				var d appsv1.Deployment
				r.get(t, "Deployment", "gpuhealth-extender", &d)
				if sa := d.Spec.Template.Spec.ServiceAccountName; sa != "gpuhealth-extender" || !r.has("ClusterRoleBinding", sa) {
					t.Errorf("extender runs as %q, want the bound gpuhealth-extender", sa)
				}
			}
		})
	}
}

func TestAdmissionPolicy(t *testing.T) {
	requireHelm(t)
	r := render(t)
	var policy admissionregistrationv1.ValidatingAdmissionPolicy
	r.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node", &policy)
	if fp := policy.Spec.FailurePolicy; fp == nil || *fp != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", fp)
	}
	want := `request.userInfo.username == "system:serviceaccount:gpuhealth-system:gpuhealth-agent"`
	if len(policy.Spec.MatchConditions) != 1 || policy.Spec.MatchConditions[0].Expression != want {
		t.Errorf("matchConditions %+v, want the one %s", policy.Spec.MatchConditions, want)
	}
	if len(policy.Spec.Validations) == 0 {
		t.Error("policy has no validations")
	}
	var binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
	r.get(t, "ValidatingAdmissionPolicyBinding", "gpuhealth-agent-own-node", &binding)
	if binding.Spec.PolicyName != "gpuhealth-agent-own-node" ||
		!slices.Equal(binding.Spec.ValidationActions, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}) {
		t.Errorf("binding %+v, want policy gpuhealth-agent-own-node with [Deny]", binding.Spec)
	}
	if off := render(t, "admissionPolicy.enabled=false"); off.has("ValidatingAdmissionPolicy", "gpuhealth-agent-own-node") {
		t.Error("admissionPolicy.enabled=false still renders the policy")
	}
}

func TestAgentDaemonSet(t *testing.T) {
	requireHelm(t)
	r := render(t)
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]

	var nodeName *corev1.EnvVar
	for i := range c.Env {
		if c.Env[i].Name == "NODE_NAME" {
			nodeName = &c.Env[i]
		}
	}
	if nodeName == nil || nodeName.ValueFrom == nil || nodeName.ValueFrom.FieldRef == nil || nodeName.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
		t.Errorf("NODE_NAME is not taken from spec.nodeName: %+v", nodeName)
	}

	var checkpoint *corev1.Volume
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == "checkpoint" {
			checkpoint = &pod.Volumes[i]
		}
	}
	if checkpoint == nil || checkpoint.HostPath == nil || checkpoint.HostPath.Path != "/var/lib/gpuhealth" {
		t.Errorf("checkpoint volume %+v, want hostPath /var/lib/gpuhealth", checkpoint)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "checkpoint" && m.MountPath == "/var/lib/gpuhealth" && !m.ReadOnly
	}) || !slices.Contains(c.Args, "--checkpoint=/var/lib/gpuhealth/checkpoint.json") {
		t.Errorf("checkpoint not mounted writable where --checkpoint points: mounts %+v args %v", c.VolumeMounts, c.Args)
	}

	// The image's agent-only binary (cmd/gpuhealth-agent), which takes the same arguments.
	if !slices.Equal(c.Command, []string{"/gpuhealth-agent"}) || len(c.Args) == 0 || c.Args[0] != "agent" {
		t.Errorf("agent runs %v %v, want /gpuhealth-agent agent ...", c.Command, c.Args)
	}
	if !slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9402 }) {
		t.Errorf("no metrics port 9402: %+v", c.Ports)
	}
	for _, p := range []struct {
		probe *corev1.Probe
		path  string
	}{{c.LivenessProbe, "/healthz"}, {c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil || p.probe.HTTPGet.Path != p.path || p.probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("want an HTTP probe on metrics%s, got %+v", p.path, p.probe)
		}
	}

	if pod.RuntimeClassName == nil || *pod.RuntimeClassName != "nvidia" {
		t.Errorf("runtimeClassName %v, want nvidia", pod.RuntimeClassName)
	}
	sc := c.SecurityContext
	if sc == nil || sc.Privileged != nil && *sc.Privileged || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("agent security context is not locked down: %+v", sc)
	}
	if pod.NodeSelector["nvidia.com/gpu.present"] != "true" || len(pod.Tolerations) == 0 {
		t.Errorf("agent not aimed at GPU nodes: nodeSelector %v tolerations %v", pod.NodeSelector, pod.Tolerations)
	}

	// The HealthConfig the agent reads must be one the agent accepts.
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
	cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
	if err != nil {
		t.Fatalf("rendered HealthConfig: %v\n%s", err, cm.Data["healthconfig.yaml"])
	}
	if got, want := cfg.Agent.WithDefaults().Reporters, config.AllReporters(); !slices.Equal(got, want) {
		t.Errorf("reporters %v, want all %v", got, want)
	}
}

func TestAgentSimScenario(t *testing.T) {
	requireHelm(t)
	scenario := filepath.Join(t.TempDir(), "scenario.yaml")
	const want = "apiVersion: gpuhealth.dev/v1alpha1\nkind: Scenario\ngpus: {count: 2}\n"
	if err := os.WriteFile(scenario, []byte(want), 0o600); err != nil {
		t.Fatal(err)
	}
	r := renderWith(t, Options{Values: []string{"deployments/helm/gpuhealth/ci/local-values.yaml"}, SetFile: []string{"agent.sim.scenario=" + scenario}})
	var cm corev1.ConfigMap
	r.get(t, "ConfigMap", "gpuhealth-agent-scenario", &cm)
	if got := cm.Data["scenario.yaml"]; got != want {
		t.Errorf("scenario ConfigMap holds %q, want %q", got, want)
	}
	var ds appsv1.DaemonSet
	r.get(t, "DaemonSet", "gpuhealth-agent", &ds)
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]
	if !slices.Contains(c.Args, "--backend=sim") || !slices.Contains(c.Args, "--scenario=/etc/gpuhealth-sim/scenario.yaml") {
		t.Errorf("agent args %v, want the sim backend replaying the mounted scenario", c.Args)
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == "scenario" && m.MountPath == "/etc/gpuhealth-sim" }) ||
		!slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
			return v.Name == "scenario" && v.ConfigMap != nil && v.ConfigMap.Name == "gpuhealth-agent-scenario"
		}) {
		t.Errorf("scenario ConfigMap not mounted at /etc/gpuhealth-sim: mounts %+v volumes %+v", c.VolumeMounts, pod.Volumes)
	}
	if len(pod.NodeSelector) != 0 || pod.RuntimeClassName != nil || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("local values: nodeSelector %v, runtimeClassName %v, pull policy %s; want none, none, Never", pod.NodeSelector, pod.RuntimeClassName, c.ImagePullPolicy)
	}

	if _, err := Template(t.Context(), Options{Set: []string{"agent.backend=sim"}}); err == nil || !strings.Contains(err.Error(), "agent.sim.scenario") {
		t.Errorf("backend sim without a scenario rendered (err %v), want an error naming agent.sim.scenario", err)
	}
}

func TestAgentDevicePlugin(t *testing.T) {
	requireHelm(t)
	var ds appsv1.DaemonSet
	render(t, "agent.devicePlugin.enabled=true").get(t, "DaemonSet", "gpuhealth-agent", &ds)
	pod := ds.Spec.Template.Spec
	if len(pod.Containers) != 2 || pod.Containers[1].Name != "device-plugin" {
		t.Fatalf("containers %d, want the agent and a device-plugin container", len(pod.Containers))
	}
	c := pod.Containers[1]
	for _, want := range []string{"device-plugin", "--kubelet-socket-dir=/var/lib/kubelet/device-plugins", "--resource-name=nvidia.com/gpu", "--checkpoint=/var/lib/gpuhealth/device-plugin.json"} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("device-plugin args %v lack %s", c.Args, want)
		}
	}
	if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "device-plugins" && m.MountPath == "/var/lib/kubelet/device-plugins" && !m.ReadOnly
	}) || !slices.ContainsFunc(pod.Volumes, func(v corev1.Volume) bool {
		return v.Name == "device-plugins" && v.HostPath != nil && v.HostPath.Path == "/var/lib/kubelet/device-plugins"
	}) {
		t.Errorf("the kubelet's device-plugin directory is not mounted: mounts %+v", c.VolumeMounts)
	}
	if !equality.Semantic.DeepEqual(c.SecurityContext, pod.Containers[0].SecurityContext) || !equality.Semantic.DeepEqual(c.Env, pod.Containers[0].Env) {
		t.Error("the device plugin runs with another security context or environment than the agent")
	}
}

func TestAgentDeviceMounts(t *testing.T) {
	requireHelm(t)
	var ds appsv1.DaemonSet
	render(t, "agent.nvml.mode=hostMounts").get(t, "DaemonSet", "gpuhealth-agent", &ds)
	pod := ds.Spec.Template.Spec
	if pod.RuntimeClassName != nil {
		t.Errorf("hostMounts still asks for runtime class %q", *pod.RuntimeClassName)
	}
	c := pod.Containers[0]
	if c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
		t.Error("hostMounts needs a privileged container for the host's device nodes")
	}
	for _, v := range []string{"dev", "driver-root"} {
		if !slices.ContainsFunc(pod.Volumes, func(vol corev1.Volume) bool { return vol.Name == v && vol.HostPath != nil }) {
			t.Errorf("no hostPath volume %s", v)
		}
	}
}

func TestExtender(t *testing.T) {
	requireHelm(t)
	if r := render(t); r.has("Deployment", "gpuhealth-extender") || r.has("ServiceMonitor", "gpuhealth-agent") {
		t.Error("extender or ServiceMonitor rendered by default")
	}
	for _, bind := range []bool{false, true} {
		t.Run(fmt.Sprintf("bind=%t", bind), func(t *testing.T) {
			r := render(t, "extender.enabled=true", fmt.Sprintf("extender.bind=%t", bind), "serviceMonitor.enabled=true")
			var role rbacv1.ClusterRole
			r.get(t, "ClusterRole", "gpuhealth-extender", &role)
			want := []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
				{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "watch"}},
			}
			if bind {
				want[1].Verbs = append(want[1].Verbs, "patch")
				want = append(want, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/binding"}, Verbs: []string{"create"}})
			}
			if !equality.Semantic.DeepEqual(role.Rules, want) {
				t.Errorf("extender rules:%s\nwant%s", rulesString(role.Rules), rulesString(want))
			}

			var d appsv1.Deployment
			r.get(t, "Deployment", "gpuhealth-extender", &d)
			if got := slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--bind"); got != bind {
				t.Errorf("--bind in args: %t, want %t", got, bind)
			}
			// Slow clients and large bodies: the runtime must know the limit it lives under.
			if !slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Env, func(e corev1.EnvVar) bool {
				return e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory"
			}) {
				t.Errorf("the extender has no GOMEMLIMIT from its memory limit: env %+v", d.Spec.Template.Spec.Containers[0].Env)
			}
			var svc corev1.Service
			r.get(t, "Service", "gpuhealth-extender", &svc)

			var cm corev1.ConfigMap
			r.get(t, "ConfigMap", "gpuhealth-extender-scheduler-config", &cm)
			sc := cm.Data["scheduler-config.yaml"]
			for _, s := range []string{
				"urlPrefix: https://gpuhealth-extender." + testNamespace + ".svc:8888", "enableHTTPS: true",
				"certFile: /etc/kubernetes/gpuhealth-extender/tls.crt", "caFile: /etc/kubernetes/gpuhealth-extender/ca.crt",
				"filterVerb: filter", "prioritizeVerb: prioritize", "nodeCacheCapable: true", "name: nvidia.com/gpu",
			} {
				if !strings.Contains(sc, s) {
					t.Errorf("scheduler config lacks %q:\n%s", s, sc)
				}
			}
			if got := strings.Contains(sc, "bindVerb: bind"); got != bind {
				t.Errorf("bindVerb in scheduler config: %t, want %t", got, bind)
			}

			sm := r["ServiceMonitor/gpuhealth-agent"]
			if sm == nil || sm.GetAPIVersion() != "monitoring.coreos.com/v1" {
				t.Fatalf("no monitoring.coreos.com/v1 ServiceMonitor: %v", r.keys())
			}
			var metricsSvc corev1.Service
			r.get(t, "Service", "gpuhealth-agent-metrics", &metricsSvc)
			sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
			for k, v := range sel {
				if metricsSvc.Labels[k] != v {
					t.Errorf("ServiceMonitor selects %s=%s, which the metrics Service lacks", k, v)
				}
			}
		})
	}
}

// TestAgentFlowControl: the chart's FlowSchema and priority level are agent.FlowControl()'s,
// the ones the fleet test measures with; they can be turned off.
func TestAgentFlowControl(t *testing.T) {
	requireHelm(t)
	r := render(t)
	wantSchema, wantLevel := agent.FlowControl("gpuhealth-agent", testNamespace, "gpuhealth-agent", agent.DefaultFlowQueueLength)
	var schema flowcontrolv1.FlowSchema
	r.get(t, "FlowSchema", "gpuhealth-agent", &schema)
	if !equality.Semantic.DeepEqual(schema.Spec, wantSchema.Spec) {
		t.Errorf("chart's FlowSchema spec differs from agent.FlowControl():\n got %+v\nwant %+v", schema.Spec, wantSchema.Spec)
	}
	var level flowcontrolv1.PriorityLevelConfiguration
	r.get(t, "PriorityLevelConfiguration", "gpuhealth-agent", &level)
	if !equality.Semantic.DeepEqual(level.Spec, wantLevel.Spec) {
		t.Errorf("chart's PriorityLevelConfiguration spec differs from agent.FlowControl():\n got %+v\nwant %+v", level.Spec, wantLevel.Spec)
	}
	// The queue is sized by a value.
	render(t, "agent.flowControl.queueLengthLimit=12000").get(t, "PriorityLevelConfiguration", "gpuhealth-agent", &level)
	if got := level.Spec.Limited.LimitResponse.Queuing.QueueLengthLimit; got != 12000 {
		t.Errorf("queueLengthLimit = %d, want the value's 12000", got)
	}
	if off := render(t, "agent.flowControl.enabled=false"); off.has("FlowSchema", "gpuhealth-agent") || off.has("PriorityLevelConfiguration", "gpuhealth-agent") {
		t.Error("flow control rendered although agent.flowControl.enabled=false")
	}
}
