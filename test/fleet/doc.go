// Package fleet runs many simulated GPU nodes, each with its own agent and its own API client, in
// one process against a real control plane (test/controlplane), and prints what a cluster of
// that size costs: start-up time, memory per node, API requests per second at steady state, how
// long a wave of GPU failures takes to reach the API server, and the writes of the heartbeat. It
// is too heavy for every CI run: the test carries the e2e build tag and is skipped unless
// GPUHEALTH_FLEET=1 (make bench runs it; see docs/benchmarks.md).
//
// Beside TestFleet, three tests check the fleet's judgements on at least 500 nodes (issue 47,
// docs/fleet.md): TestFleetSharedCause (a wave on one driver is one finding, the same faults at
// random none, over seeded runs), TestFleetJobSignature (one job's XID 45 on all its GPUs is its
// signature, no rack's fault) and TestFleetBreakerDomain (a bad rack held at its circuit-breaker
// budget while the other racks are admitted, reported once).
package fleet
