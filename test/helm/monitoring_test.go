package helm

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	ruleKind          = "PrometheusRule"
	ruleName          = "gpuhealth"
	dashboardName     = "gpuhealth-dashboard"
	dashboardKey      = "gpuhealth.json"
	promtoolTestsFile = "testdata/prometheusrule-tests.yaml"
)

// TestMonitoringIsOffByDefault: the PrometheusRule needs the Prometheus Operator's CRDs and the
// dashboard a Grafana sidecar; neither is installed unless asked for.
func TestMonitoringIsOffByDefault(t *testing.T) {
	requireHelm(t)
	r := render(t)
	if r.has(ruleKind, ruleName) || r.has("ConfigMap", dashboardName) {
		t.Errorf("rendered by default: %v", r.keys())
	}
}

// TestPrometheusRuleUnitTests runs `promtool test rules` (testdata/prometheusrule-tests.yaml) on
// the rules the chart renders. With the agents' job renamed, the same tests must fail: they see
// what the chart renders.
func TestPrometheusRuleUnitTests(t *testing.T) {
	requireHelm(t)
	promtool := requirePromtool(t)

	dir := rulesDir(t, render(t, "prometheusRule.enabled=true"))
	if out, err := runPromtool(promtool, "check", "rules", filepath.Join(dir, "gpuhealth-rules.yaml")); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := runPromtool(promtool, "test", "rules", filepath.Join(dir, "tests.yaml")); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}

	t.Run("other job", func(t *testing.T) {
		dir := rulesDir(t, render(t, "prometheusRule.enabled=true", "prometheusRule.agentJob=gpu-agents"))
		out, err := runPromtool(promtool, "test", "rules", filepath.Join(dir, "tests.yaml"))
		if err == nil {
			t.Fatalf("promtool test rules passed on rules for job gpu-agents:\n%s", out)
		}
		if !strings.Contains(out, "GPUHealthAgentDown") || !strings.Contains(out, `job="gpu-agents"`) {
			t.Errorf("the failure does not show the agent alerts watching job gpu-agents:\n%s", out)
		}
	})
}

func TestPrometheusRuleObject(t *testing.T) {
	requireHelm(t)
	r := render(t, "prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack")
	o := &unstructured.Unstructured{Object: r.object(t, ruleKind, ruleName)}
	if o.GetAPIVersion() != "monitoring.coreos.com/v1" || o.GetNamespace() != testNamespace {
		t.Errorf("apiVersion %s namespace %s", o.GetAPIVersion(), o.GetNamespace())
	}
	if got := o.GetLabels()["release"]; got != "kube-prometheus-stack" {
		t.Errorf("label release = %q, want the value's", got)
	}
	var alerts []string
	for _, rule := range ruleList(t, o.Object) {
		alerts = append(alerts, rule["alert"].(string))
	}
	// The four things the issue asks alerts for, and the rest the docs describe.
	want := "GPUHealthGPUUnhealthy GPUHealthGPUDegraded GPUHealthGPUNeedsEviction GPUHealthGPUToReplace GPUHealthGPUMissing GPUHealthGPUUnmatched " +
		"GPUHealthGPUValidationFailed GPUHealthGPUValidationNoVerdict " +
		"GPUHealthCircuitBreakerOpen GPUHealthBreakerControllerNotLeading GPUHealthAgentDown GPUHealthAgentsAbsent GPUHealthAPIWritesFailing"
	if got := strings.Join(alerts, " "); got != want {
		t.Errorf("alerts\n got %s\nwant %s", got, want)
	}
}

func TestGrafanaDashboardConfigMap(t *testing.T) {
	requireHelm(t)
	var cm corev1.ConfigMap
	render(t, "grafanaDashboard.enabled=true", "grafanaDashboard.annotations.grafana_folder=GPUs").get(t, "ConfigMap", dashboardName, &cm)
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v lack the sidecar's grafana_dashboard: \"1\"", cm.Labels)
	}
	if cm.Annotations["grafana_folder"] != "GPUs" {
		t.Errorf("annotations %v lack the value's grafana_folder", cm.Annotations)
	}
	var dash struct {
		UID    string           `json:"uid"`
		Panels []map[string]any `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data[dashboardKey]), &dash); err != nil {
		t.Fatalf("%s is not JSON: %v", dashboardKey, err)
	}
	if dash.UID != "gpuhealth" || len(dash.Panels) == 0 {
		t.Errorf("uid %q, %d panels", dash.UID, len(dash.Panels))
	}
}

// TestMonitorsCoverEveryComponent: with serviceMonitor on, Prometheus scrapes every component
// the dashboard shows: the agents (ServiceMonitor), the extender (ServiceMonitor on its Service)
// and the breaker controller (PodMonitor: it has no Service), each on a port that exists.
func TestMonitorsCoverEveryComponent(t *testing.T) {
	requireHelm(t)
	r := render(t, "serviceMonitor.enabled=true", "extender.enabled=true", "config.agent.circuitBreaker.enabled=true")

	var svc corev1.Service
	r.get(t, "Service", "gpuhealth-extender", &svc)
	sm := r["ServiceMonitor/gpuhealth-extender"]
	if sm == nil {
		t.Fatalf("no ServiceMonitor for the extender: %v", r.keys())
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	if !selects(sel, svc.Labels) {
		t.Errorf("the extender's ServiceMonitor selects %v, its Service has %v", sel, svc.Labels)
	}
	if port := endpointPort(t, sm.Object, "endpoints"); !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == port }) {
		t.Errorf("the extender's ServiceMonitor scrapes port %q, which its Service lacks", port)
	}

	var d appsv1.Deployment
	r.get(t, "Deployment", "gpuhealth-breaker-controller", &d)
	pm := r["PodMonitor/gpuhealth-breaker-controller"]
	if pm == nil {
		t.Fatalf("no PodMonitor for the breaker controller: %v", r.keys())
	}
	sel, _, _ = unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	if !selects(sel, d.Spec.Template.Labels) {
		t.Errorf("the breaker's PodMonitor selects %v, its pods have %v", sel, d.Spec.Template.Labels)
	}
	if port := endpointPort(t, pm.Object, "podMetricsEndpoints"); !slices.ContainsFunc(d.Spec.Template.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == port }) {
		t.Errorf("the breaker's PodMonitor scrapes port %q, which its container lacks", port)
	}

	if r := render(t, "serviceMonitor.enabled=true"); r.has("ServiceMonitor", "gpuhealth-extender") || r.has("PodMonitor", "gpuhealth-breaker-controller") {
		t.Errorf("monitors for components that are off: %v", r.keys())
	}
}

func selects(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return len(selector) > 0
}

// endpointPort returns the port of a monitor's only endpoint, under field.
func endpointPort(t *testing.T, obj map[string]any, field string) string {
	t.Helper()
	eps, _, _ := unstructured.NestedSlice(obj, "spec", field)
	if len(eps) != 1 {
		t.Fatalf("spec.%s = %v, want one endpoint", field, eps)
	}
	port, _ := eps[0].(map[string]any)["port"].(string)
	return port
}

func requirePromtool(t *testing.T) string {
	t.Helper()
	p, err := Promtool()
	if err != nil {
		// No skip: promtool is built from Go modules like helm, so wherever helm could be had,
		// promtool can too, and the alerts are only tested through it.
		t.Fatalf("promtool: %v", err)
	}
	return p
}

func runPromtool(promtool string, args ...string) (string, error) {
	out, err := exec.CommandContext(context.Background(), promtool, args...).CombinedOutput()
	return string(out), err
}

// rulesDir writes the rendered PrometheusRule's spec as a Prometheus rules file,
// gpuhealth-rules.yaml, next to a copy of the promtool tests (tests.yaml), which name it.
func rulesDir(t *testing.T, r rendered) string {
	t.Helper()
	spec, ok := r.object(t, ruleKind, ruleName)["spec"].(map[string]any)
	if !ok {
		t.Fatalf("%s has no spec", ruleKind)
	}
	rules, err := yaml.Marshal(map[string]any{"groups": spec["groups"]})
	if err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(promtoolTestsFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, data := range map[string][]byte{"gpuhealth-rules.yaml": rules, "tests.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// object returns the rendered object kind/name as a map, failing if it is missing.
func (r rendered) object(t *testing.T, kind, name string) map[string]any {
	t.Helper()
	o, ok := r[kind+"/"+name]
	if !ok {
		t.Fatalf("%s/%s not rendered; have %v", kind, name, r.keys())
	}
	return o.Object
}

// ruleList returns every rule of a rendered PrometheusRule, in order.
func ruleList(t *testing.T, obj map[string]any) []map[string]any {
	t.Helper()
	spec, _ := obj["spec"].(map[string]any)
	groups, _ := spec["groups"].([]any)
	var out []map[string]any
	for _, g := range groups {
		rules, _ := g.(map[string]any)["rules"].([]any)
		for _, r := range rules {
			out = append(out, r.(map[string]any))
		}
	}
	if len(out) == 0 {
		t.Fatal("the PrometheusRule has no rules")
	}
	return out
}
