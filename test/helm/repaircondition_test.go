package helm

import (
	"context"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/gpuhealth/gpuhealth/pkg/health/config"
)

// TestRepairConditionChart: config.agent.repairCondition reaches the agent's HealthConfig, and
// the admission policy lets the agents write the configured type, in place of GPURebootRequired;
// a type that is no condition type (it would be spliced into the policy's CEL) or one the
// kubelet or gpuhealth writes for another purpose is refused at install.
func TestRepairConditionChart(t *testing.T) {
	requireHelm(t)
	owned := func(r rendered) string {
		var policy admissionregistrationv1.ValidatingAdmissionPolicy
		r.get(t, "ValidatingAdmissionPolicy", "gpuhealth-agent-own-node", &policy)
		for _, v := range policy.Spec.Variables {
			if v.Name == "ownedConditions" {
				return v.Expression
			}
		}
		t.Fatal("the policy has no ownedConditions")
		return ""
	}
	for _, tc := range []struct {
		name        string
		set         []string
		want        config.RepairConditionConfig
		owned, not  []string
		defaultType bool
	}{
		{"default", nil, config.RepairConditionConfig{}, []string{"'GPUUnhealthy'"}, []string{"GPURebootRequired", "AcceleratedHardwareReady"}, true},
		{"default with remediation", []string{"config.remediation.enabled=true"}, config.RepairConditionConfig{},
			[]string{"'GPUUnhealthy'", "'GPURebootRequired'"}, []string{"AcceleratedHardwareReady"}, true},
		{"AcceleratedHardwareReady, remediation on", []string{"config.agent.repairCondition.type=AcceleratedHardwareReady", "config.remediation.enabled=true"},
			config.RepairConditionConfig{Type: "AcceleratedHardwareReady"}, []string{"'GPUUnhealthy'", "'AcceleratedHardwareReady'"}, []string{"GPURebootRequired"}, false},
		{"a prefixed type, polarity set", []string{"config.agent.repairCondition.type=example.com/GPUNodeRepair", "config.agent.repairCondition.repairStatus=True"},
			config.RepairConditionConfig{Type: "example.com/GPUNodeRepair", RepairStatus: "true"}, []string{"'example.com/GPUNodeRepair'"}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.set...)
			var cm corev1.ConfigMap
			r.get(t, "ConfigMap", "gpuhealth-agent-config", &cm)
			cfg, err := config.Parse([]byte(cm.Data["healthconfig.yaml"]))
			if err != nil {
				t.Fatalf("rendered HealthConfig: %v\n%s", err, cm.Data["healthconfig.yaml"])
			}
			if got := cfg.AgentSection().RepairCondition; got != tc.want || got.IsDefault() != tc.defaultType {
				t.Errorf("agent.repairCondition %+v, want %+v", got, tc.want)
			}
			expr := owned(r)
			for _, c := range tc.owned {
				if !strings.Contains(expr, c) {
					t.Errorf("ownedConditions %s lacks %s", expr, c)
				}
			}
			for _, c := range tc.not {
				if strings.Contains(expr, c) {
					t.Errorf("ownedConditions %s has %s", expr, c)
				}
			}
		})
	}
	for _, bad := range []string{"Ready", "GPUUnhealthy", "a'b", "x'+'y"} {
		_, err := Template(context.Background(), Options{Release: "gpuhealth", Namespace: testNamespace, Set: []string{"config.agent.repairCondition.type=" + bad}})
		if err == nil || !strings.Contains(err.Error(), "is not a condition type the agent may write") {
			t.Errorf("type %q: %v, want the chart to refuse it", bad, err)
		}
	}
}
