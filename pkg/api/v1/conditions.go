package v1

// Node conditions, following node-problem-detector's convention: the type names the problem and
// status True means the problem is present.
const (
	// ConditionGPUUnhealthy is True when at least one GPU of the node is Unhealthy.
	ConditionGPUUnhealthy = "GPUUnhealthy"
	// ConditionCircuitBreakerOpen is True when the circuit breaker holds back this node's GPUs
	// (tainted None instead of NoSchedule/NoExecute).
	ConditionCircuitBreakerOpen = "GPUCircuitBreakerOpen"
)

// Reasons of ConditionGPUUnhealthy.
const (
	ReasonGPUsUnhealthy = "GPUsUnhealthy"
	ReasonGPUsDegraded  = "GPUsDegraded"
	ReasonGPUsHealthy   = "GPUsHealthy"
	// ReasonNVMLUnavailable: status Unknown, the agent cannot reach NVML (no library, a library
	// the loader refuses, or no kernel driver) and does not know the GPUs' health; the message
	// says which. The other sinks keep what they last reported.
	ReasonNVMLUnavailable = "NVMLUnavailable"
	// ReasonAgentSilent: status Unknown, written by the cluster-side controller (not the agent):
	// the node's agent stopped renewing its heartbeat (stale, unreadable, far in the future, or
	// removed after it had one), so nothing it last reported can be trusted. The agent's next
	// write replaces it.
	ReasonAgentSilent = "AgentSilent"
)

// Reasons of the repair condition (agent.repairCondition) when its type is not the default
// GPURebootRequired, which keeps its own reasons (remediation.go). The first two ask a node repair
// engine for a repair (the configured repair status); the others do not (docs/repair-engines.md).
const (
	// ReasonRebootRequired: a GPU's fault, or remediation giving up on it, needs the node
	// rebooted (XID 79, a lost GPU, NVML's NODE_REBOOT recovery action, resets that failed).
	ReasonRebootRequired = "RebootRequired"
	// ReasonReplaceRequired: a GPU needs hardware work a reboot does not do (its fault returned
	// after repairs, a row-remap failure, auxiliary power, a GPU missing from the bus): replace
	// the node. It wins over RebootRequired when GPUs need both.
	ReasonReplaceRequired = "ReplaceRequired"
	// ReasonNoRepairRequired: no GPU needs the node rebooted or replaced.
	ReasonNoRepairRequired = "NoRepairRequired"
	// ReasonRepairHeldByCircuitBreaker: GPUs need a repair, but the circuit breaker holds them
	// back (too many of the cluster's GPUs failed at once); the condition asks for none until
	// `gpuhealth breaker ack` or the wave leaves the breaker's window.
	ReasonRepairHeldByCircuitBreaker = "RepairHeldByCircuitBreaker"
)

// AgentSilentTaintKey is the NoSchedule taint the cluster-side controller puts on a node whose
// agent went silent, when configured to (off by default), and removes when the agent is back.
const AgentSilentTaintKey = "gpuhealth.dev/agent-silent"

// Events of the cluster-side controller about an agent's silence, on the Node.
const (
	// EventAgentSilent (Warning): the node's agent went silent.
	EventAgentSilent = "GPUAgentSilent"
	// EventAgentBack (Normal): the node's agent writes its heartbeat again.
	EventAgentBack = "GPUAgentBack"
)
