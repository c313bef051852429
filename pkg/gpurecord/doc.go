// Package gpurecord is a GPU's life kept cluster-side by its board serial: the GPURecord custom
// resource (gpuhealth.dev/v1alpha1, cluster-scoped, named by serial), how the breaker controller
// merges what the agents report into it (Observe), and the rule that turns a past into a verdict
// when the card appears on a node (RepeatOffenderRule).
//
// A node forgets a GPU when the node is re-imaged or deleted, or when the card is moved: its
// history lives in the agent's checkpoint, keyed by UUID, on that node's disk. A GPURecord
// survives all three. Only the cluster-side controller writes records, from the agents'
// gpu-health and gpu-drains annotations; an agent reads, by name, the records of its own GPUs'
// serials when it starts, and never writes one (RBAC grants it get, the admission policy denies
// it every write).
//
// A record is bounded: the newest MaxEvents events and MaxPlacements placements, with lifetime
// counts beside them, about 10 KiB at most. Only a GPU with something to remember (a fault, a
// repair, a validation, a drain) gets a record, so a healthy fleet has none.
package gpurecord
