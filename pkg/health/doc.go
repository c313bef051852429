// Package health is the gpuhealth library: it turns raw GPU facts (signals) into per-GPU health
// (conditions with a severity), remembers what must survive an agent restart, and says exactly
// when a GPU's health changes.
//
// The package imports nothing from k8s.io so that a device plugin or a DRA driver can embed it
// without pulling in client-go. The pieces, in the order data flows through them:
//
//   - Device identifies a GPU or a MIG instance. The UUID is the key everywhere; the index, PCI
//     bus ID, minor number, model and MIG placement are attributes.
//   - Signal is one fact from a backend (NVML or the simulator): an XID, a counter sample, a
//     temperature reading, "the GPU is lost", "the GPU was reset".
//   - Policy is data: the XID table (see XIDTable and docs/xid-policy.md) and the thresholds of
//     the polled checks. DefaultPolicy follows NVIDIA's XID catalog; DevicePluginPolicy
//     reproduces the NVIDIA device plugin.
//   - Tracker applies signals to per-device state under a Policy, merges conditions, applies
//     hysteresis, and reports a Transition only when a device's effective health changes.
//     Repeated identical signals cost no allocation and produce no transition.
//   - Checkpoint persists the conditions that must outlive the process, keyed to the boot ID.
//
// Evaluation is pure and deterministic: the Tracker takes the time from each signal, never from
// a wall clock, so tests and the simulator replay hours of faults in milliseconds.
package health
