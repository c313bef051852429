// Package health is the gpuhealth library: it turns raw GPU facts (signals) into per-GPU health
// (conditions with a severity), remembers what must survive an agent restart, and says exactly
// when a GPU's health changes.
//
// The package imports nothing from k8s.io so that a device plugin or a DRA driver can embed it
// without pulling in client-go. The pieces, in the order data flows through them:
//
//   - Device identifies a GPU or a MIG instance. The UUID is the key everywhere; the index, PCI
//     bus ID, minor number, model and MIG placement are attributes. MissingGPUs adds
//     placeholders for GPUs the node should have and the backend cannot open.
//   - Signal is one fact from a backend (NVML, the kernel log or the simulator): an XID (with
//     what the driver said beside it, XIDFlags), a counter sample, a temperature reading, the
//     fabric's registration, an early warning, "the GPU is lost", "the GPU was reset".
//   - Policy is data: the XID table (see XIDTable and docs/xid-policy.md), the thresholds of the
//     polled checks, the repeat rules (RepeatRule: an XID that keeps returning on one GPU, or
//     spreads over several) and escalation (EscalationPolicy). DefaultPolicy follows NVIDIA's
//     XID catalog and the peers' rules; DevicePluginPolicy reproduces the NVIDIA device plugin.
//   - Tracker applies signals to per-device state under a Policy, merges conditions, applies
//     hysteresis, keeps each GPU's history of faults and repairs, raises node findings
//     (NodeFinding), and reports a Transition only when a device's effective health changes.
//     Repeated identical signals cost no allocation and produce no transition.
//   - Monitor serialises a Tracker between one feeding goroutine and any number of
//     subscribers, each handed every Update (a snapshot and its transitions) without ever
//     blocking the feed.
//   - Checkpoint persists what must outlive the process (sticky conditions, histories, source
//     cursors), keyed to the boot ID, in a versioned, checksummed file every release can read.
//   - Dedup pairs up the XIDs two sources report (NVML's events and the kernel log), so that an
//     XID seen by both counts once; Dedup.Feed is a backend's sink over the Monitor that leaves
//     out what the other source reported (pkg/gpu/kmsg's Companion runs the two together).
//   - Runtime is what an embedder runs: it builds the Tracker and Monitor, restores the
//     checkpoint, ticks, saves on change and runs the backend.
//
// Evaluation is pure and deterministic: the Tracker takes the time from each signal, never from
// a wall clock, so tests and the simulator replay hours of faults in milliseconds.
package health
