// Package watch is the continuous judge of shared causes: while `gpuhealth breaker controller`
// leads, a Watcher judges the fleet every period (fleet.sharedCauses.every, 1m) as `gpuhealth
// fleet` does on demand (internal/fleet reads, internal/fleet/sharedcause judges) and publishes
// the verdict for the cluster:
//
//   - the ConfigMap gpuhealth-fleet-findings in the controller's namespace, key findings: the
//     current verdict as JSON (Findings; ParseFindings reads it back). It is written only when the
//     verdict changed, or every RefreshEvery (10m) when it did not, so that its judgedAt tells a
//     stopped controller's verdict from a quiet fleet's. Its lists are capped (MaxSharedCauses
//     findings, MaxSignatures signatures of at most MaxSignatureGPUs GPUs named each, and
//     MaxFindingsBytes in all, well under a ConfigMap's 1 MiB); what is left out is counted.
//   - Events on that ConfigMap: a Warning FleetSharedCause once per new finding, a Normal
//     FleetSharedCauseGone when it ends, a Warning FleetWorkloadSignature once per new workload
//     signature.
//   - through callbacks, the metrics gpuhealth_fleet_findings{attribute,value} (1 per current
//     finding, the series removed when it ends) and gpuhealth_fleet_workload_signatures.
//
// A failure to read the cluster or to write the ConfigMap keeps the last published verdict; the
// next period tries again. Without the right to list pods the fleet is judged without workloads
// (a job's signature then counts as its GPUs' faults), which is logged once; without the right
// to list ResourceClaims (or the driver's ResourceSlices), without the GPUs pods hold through
// claims, logged once too.
//
// # What it reads, and its cost at 50,000 nodes
//
// The Nodes come from an informer that keeps only what the judge reads of each
// (fleet.CollectedNode: the gpu-health annotation, a few labels), not a LIST every period: a LIST
// of 50,000 Nodes (each about 25 KB as decoded, with node feature discovery's labels and the
// kubelet's images) every minute would have the API server serialize about a gigabyte a minute,
// while the watch sends only what changes (the agents write their annotation when a GPU's health
// changes; their heartbeats go to Leases). It is a second watch of the Nodes beside the breaker
// counter's (each keeps its own few fields); one shared cache would need the counter to keep the
// topology labels too.
//
// The pods are the larger set (10-30 a node: 0.5-1.5 M at 50,000 nodes) and only the few that
// name a card (GPU sharing: gpuhealth.dev/gpu-uuid, volcano.sh/gpu-index) matter. A paged LIST
// every minute would serialize every running pod each time; an informer, even with a transform,
// keeps an entry for every pod (a stub Pod is 1.2 KB of struct alone). So a reflector of the
// running pods feeds a store of its own (podCache) that keeps, for the pods that give a
// workload a GPU, only fleet.WorkloadPod (its workload, node and cards), and nothing for the
// others; its transform maps them all to one placeholder, so that even the streamed initial list
// (client-go's watch-list) holds only the pods that matter. The reflector starts only once a
// one-item LIST says pods may be listed; until then every period asks again, one small request.
// Every pod event of the cluster is still decoded once (the watch's cost, not the cache's).
//
// A pod that names no card but uses ResourceClaims (DRA, this project's main path) is kept with
// its claims' names. What ties them to GPUs comes from two informers (claims.go), started once a
// one-item LIST of each says they may be listed (else the judge counts no GPU held through
// claims, logs it once and asks again every period): the ResourceClaims, each kept as its
// namespace, name and the devices of the driver it is allocated (heldClaim: estimated at about
// 0.2 KB with its store entry; one or a few claims a GPU pod, so tens of MB at 50,000 nodes of 8
// GPUs), and the driver's ResourceSlices (field selector spec.driver), each kept as its pool,
// generation and each device's GPU UUID (slicedGPUs: about 50 B a device, a GPU's MIG partitions
// sharing one UUID string; about 0.5 KB a node of 8 GPUs). Neither has a namespace index. Every
// period joins them to the pods (fleet.HoldClaims) through a map of every device of the newest
// generation of each pool (about 400,000 entries at 50,000 nodes: some tens of MB, short-lived).
// These claim and slice figures are estimates, not yet measured by BenchmarkCacheMemory.
//
// BenchmarkCacheMemory measures what each cache keeps: about 2.8 KB a Node of 8 GPUs (mostly the
// agent's report) instead of about 25 KB, so about 140 MB for 50,000 nodes; nothing for a pod that
// names no card (about 9 KB as decoded) and about 0.3 KB for one that does. Each period parses
// every Node's annotation again and judges (400,000 GPUs: about 0.3 s and 45 MB,
// sharedcause's BenchmarkJudge400kGPUs).
package watch
