package config

import (
	"slices"
	"strings"

	gpuhealthv1 "github.com/gpuhealth/gpuhealth/pkg/api/v1"
)

// RepairConditionConfig is `agent.repairCondition`: the Node condition through which node repair
// engines (Karpenter's node repair, EKS node auto repair, Cluster API's MachineHealthCheck) learn
// that a GPU needs its node rebooted or replaced (docs/repair-engines.md).
//
// The default, GPURebootRequired, is the condition remediation has always written, unchanged:
// only with remediation enabled, True with reason RemediationFailed or RebootRecommended. Any
// other type carries the repair contract instead, in its place: written whether or not
// remediation is on, asking for a repair with reason RebootRequired or ReplaceRequired, and
// otherwise NoRepairRequired, or RepairHeldByCircuitBreaker while the circuit breaker holds the
// GPUs that need one back (a wave must not make an engine replace a fleet).
type RepairConditionConfig struct {
	// Type is the condition's type (default GPURebootRequired). AcceleratedHardwareReady is the
	// type Karpenter's AWS provider and EKS node auto repair act on; another agent must not
	// write it too (EKS's node monitoring agent does where it runs).
	Type string `yaml:"type,omitempty" json:"type,omitempty"`
	// RepairStatus is the status that asks for a repair: "True" or "False" (in any case: YAML
	// and Helm's --set turn an unquoted True into a boolean). Empty: "False" for a type ending
	// in Ready (AcceleratedHardwareReady False is the problem, as Ready False is), "True" for any
	// other (GPURebootRequired True is the problem).
	RepairStatus string `yaml:"repairStatus,omitempty" json:"repairStatus,omitempty"`
}

// DefaultRepairConditionType is the repair condition's default type: remediation's
// GPURebootRequired, written as before the repair contract existed.
const DefaultRepairConditionType = gpuhealthv1.ConditionGPURebootRequired

// Statuses a repair condition may ask for a repair with.
const (
	RepairStatusTrue  = "True"
	RepairStatusFalse = "False"
)

// reservedConditionTypes are written by the kubelet or by gpuhealth itself for another purpose;
// a repair condition of one of them would fight its writer (or, for Ready, tell every engine and
// controller that the whole node is down).
var reservedConditionTypes = []string{
	"Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable",
	gpuhealthv1.ConditionGPUUnhealthy, gpuhealthv1.ConditionCircuitBreakerOpen,
}

// WithDefaults returns a copy with the type and the status that asks for a repair filled in.
func (r RepairConditionConfig) WithDefaults() RepairConditionConfig {
	if r.Type == "" {
		r.Type = DefaultRepairConditionType
	}
	switch {
	case strings.EqualFold(r.RepairStatus, RepairStatusTrue):
		r.RepairStatus = RepairStatusTrue
	case strings.EqualFold(r.RepairStatus, RepairStatusFalse):
		r.RepairStatus = RepairStatusFalse
	case r.RepairStatus == "" && readyPolarity(r.Type):
		r.RepairStatus = RepairStatusFalse
	case r.RepairStatus == "":
		r.RepairStatus = RepairStatusTrue
	}
	return r
}

// IsDefault reports whether the condition is the default GPURebootRequired, which keeps its own
// reasons, is written only with remediation enabled and is not held back by the breaker.
func (r RepairConditionConfig) IsDefault() bool {
	return r.WithDefaults().Type == DefaultRepairConditionType
}

// HealthyStatus is the status that asks for no repair: the other one.
func (r RepairConditionConfig) HealthyStatus() string {
	if r.WithDefaults().RepairStatus == RepairStatusTrue {
		return RepairStatusFalse
	}
	return RepairStatusTrue
}

// readyPolarity reports whether a type follows the Ready convention (status True is good).
func readyPolarity(typ string) bool { return strings.HasSuffix(typ, "Ready") }

// validate checks the section against the rest of the agent section a: the condition reporter
// writes it, and with the circuit breaker on, the devicetaint reporter is the one that starts the
// breaker the repair condition asks before each repair request.
func (r RepairConditionConfig) validate(a AgentConfig, bad func(path, format string, args ...any)) {
	if r.Type != "" {
		if err := validLabelKey(r.Type); err != nil {
			bad("agent.repairCondition.type", "%q is not a condition type: %v", r.Type, err)
		}
		if slices.Contains(reservedConditionTypes, r.Type) {
			bad("agent.repairCondition.type", "%s is written by the kubelet or by gpuhealth for another purpose; choose the type your repair engine acts on, such as AcceleratedHardwareReady (docs/repair-engines.md)", r.Type)
		}
	}
	d, set := RepairConditionConfig{Type: r.Type}.WithDefaults(), r.WithDefaults().RepairStatus
	switch {
	case set != RepairStatusTrue && set != RepairStatusFalse:
		bad("agent.repairCondition.repairStatus", "must be %q or %q (the status that asks for a repair), got %q", RepairStatusTrue, RepairStatusFalse, r.RepairStatus)
	case set != d.RepairStatus && (d.Type == DefaultRepairConditionType || readyPolarity(d.Type)):
		// Inverted, a healthy node would ask for a repair: an engine would replace every node.
		bad("agent.repairCondition.repairStatus", "%s asks for a repair with status %s, not %s", d.Type, d.RepairStatus, set)
	}
	if r.IsDefault() {
		return
	}
	reporters := a.Reporters
	if reporters == nil {
		reporters = AllReporters()
	}
	if !slices.Contains(reporters, ReporterCondition) {
		bad("agent.repairCondition.type", "is %s, but agent.reporters lacks %s, which writes it", d.Type, ReporterCondition)
	}
	if a.CircuitBreaker.Enabled && !slices.Contains(reporters, ReporterDeviceTaint) {
		bad("agent.repairCondition.type", "is %s with the circuit breaker on, but agent.reporters lacks %s: it is the reporter that starts the breaker, which the repair condition asks before each repair request", d.Type, ReporterDeviceTaint)
	}
}
