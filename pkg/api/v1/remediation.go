package v1

import (
	"fmt"
	"time"
)

// RemediationKey is the Node annotation where the agent publishes the GPUs under remediation:
// a JSON object of GPURemediation keyed by UUID; absent when no repair is under way and no
// attempt still counts.
const RemediationKey = "gpuhealth.dev/gpu-remediation"

// GPURemediation is where one GPU's automatic repair stands (docs/remediation.md).
type GPURemediation struct {
	// Phase is WaitingForPods, WaitingForSlot, PausingComponents, Resetting, Validating, Probation,
	// BlockedByDrain, RemediationFailed, or empty when no repair is under way (attempts still
	// count).
	Phase string    `json:"phase,omitempty"`
	Since time.Time `json:"since,omitzero"`
	// Attempts is the number of resets within the window; MaxAttempts the limit.
	Attempts    int    `json:"attempts"`
	MaxAttempts int    `json:"maxAttempts"`
	Fault       string `json:"fault,omitempty"`
	Message     string `json:"message,omitempty"`
}

// ParseRemediation decodes RemediationKey's value. An empty value means no GPU under repair.
func ParseRemediation(value string) (map[string]GPURemediation, error) {
	return parseByUUID[GPURemediation](RemediationKey, value)
}

// Short is the remediation state as a table cell: "Probation (1/3)", "-" when idle.
func (r GPURemediation) Short() string {
	phase := r.Phase
	if phase == "" {
		if r.Attempts == 0 {
			return "-"
		}
		phase = "Repaired"
	}
	return fmt.Sprintf("%s (%d/%d)", phase, r.Attempts, r.MaxAttempts)
}

// ConditionGPURebootRequired is True when a GPU of the node needs the node rebooted (or
// power-cycled): GPU resets did not cure it (reason RemediationFailed), or its fault calls for a
// reboot (reason RebootRecommended). Node repair engines that read conditions (Cluster API
// MachineHealthCheck, Karpenter node repair, NVSentinel) take it from there; gpuhealth itself
// never reboots a node. The agent writes it only with remediation enabled.
const ConditionGPURebootRequired = "GPURebootRequired"

// Reasons of ConditionGPURebootRequired.
const (
	ReasonRemediationFailed = "RemediationFailed"
	// ReasonValidationFailed is also the reason of a given-up GPU's condition (the gpu-health
	// annotation's reasons) when its validations failed (docs/remediation.md).
	ReasonValidationFailed  = "ValidationFailed"
	ReasonRebootRecommended = "RebootRecommended"
	ReasonNoRebootRequired  = "NoRebootRequired"
)
