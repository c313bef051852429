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
