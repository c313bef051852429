// Package nvsentinel feeds gpuhealth's verdicts to NVIDIA's NVSentinel, which quarantines,
// drains and repairs nodes from the health events its monitors send to a node-local gRPC socket
// (the platform-connector's PlatformConnector.HealthEventOccurredV1). gpuhealth becomes one of
// those monitors, under its own agent name, "gpuhealth".
//
// The mapping is pure (Faults, Twin, CheckName, ErrorCode, Action, Entities): every condition of
// a physical GPU, or of one of its MIG instances, is one unhealthy event per GPU, check family
// and error code; Unhealthy is fatal with the recommended action of gpuhealth's policy, Degraded
// is not fatal and asks for nothing; every event of a GPU names the same entities (GPU index, PCI
// address without its function, GPU_UUID), and the end of a fault is its healthy twin, with the
// same check, codes and entities, which is what NVSentinel clears by. docs/nvsentinel.md has the
// table.
//
// Delivery is the Publisher's: it keeps the state NVSentinel is to have, sends what it lacks,
// retries failed sends with backoff, and sends everything again to a platform-connector that
// restarted. The agent drives it from its damped writer (internal/report/nvsentinel); an
// embedder of the health library (a device plugin, a DRA driver) runs Publisher.Run beside its
// Monitor. The wire types are package datamodels, generated from gpuhealth's own description of
// NVSentinel's interface; nvsentineltest is a platform-connector of gpuhealth's for tests.
package nvsentinel
