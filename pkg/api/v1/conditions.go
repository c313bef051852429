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
)
