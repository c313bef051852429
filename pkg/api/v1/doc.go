// Package v1 is gpuhealth's public wire format, version 1: the Node annotations the agent writes
// and the scheduler side (extender, Volcano, HAMi, `gpuhealth status`) reads, the administrative
// drains `gpuhealth drain` writes, the clear requests `gpuhealth clear` writes, and the Node
// conditions. Everything here is a contract with other processes, possibly of other versions:
// fields are added, never renamed or removed, and readers ignore what they do not know. A
// breaking change gets a new package (v2), written beside v1 for a release.
//
// It owns both directions: what the agent writes (Summaries, UnhealthyIndexes, the shared lists'
// MergeUnhealthyIDs and MergeCordon) and how readers read it back (ReadUnhealthyIDs, ReadHealth,
// ReadDrains and ReadCordon: lenient, per entry, with warnings; ParseHealth and the other Parse
// functions: strict, for gpuhealth's own round trips). It imports only the standard library and
// pkg/health, so any scheduler plugin or tool can read gpuhealth's annotations without
// client-go. Import it as gpuhealthv1.
//
// The annotations on a Node:
//
//   - volcano.sh/gpu-unhealthy-ids (UnhealthyIDsKey): Unhealthy GPU indexes, ascending,
//     comma-separated, no spaces ("0,3"), the format Volcano's device plugin writes and its
//     scheduler reads. Shared with other writers: see VolcanoStateKey.
//   - gpuhealth.dev/gpu-health (HealthKey): a JSON object keyed by device UUID whose values are
//     GPUSummary, for every GPU and MIG instance.
//   - gpuhealth.dev/gpu-health-heartbeat (HeartbeatKey): when the agent last confirmed its report,
//     refreshed at its heartbeat period; readers treat an old one as a stopped agent.
//   - gpuhealth.dev/gpu-drains (DrainsKey): a JSON object keyed by GPU UUID whose values are Drain.
//   - gpuhealth.dev/gpu-clears (ClearsKey): operators' requests to clear conditions, a JSON
//     object keyed by GPU UUID whose values are lists of Clear; the agent applies them once and
//     removes the annotation.
//   - hami.io/device-cordon (HAMiCordonKey): HAMi's per-GPU cordon, UUIDs comma-separated, written
//     by gpuhealth's opt-in hami reporter beside other writers (see HAMiStateKey).
package v1
