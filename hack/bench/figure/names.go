package figure

// Units. A reader asks for a figure by name and unit, so a figure measured in another unit is
// not found rather than misread.
const (
	UnitMilliseconds      = "ms"
	UnitSeconds           = "s"
	UnitKiB               = "KiB"
	UnitCPU               = "% of a core"
	UnitRequests          = "requests"
	UnitRequestsPerSecond = "requests/s"
	UnitWrites            = "writes"
	UnitWritesPerChange   = "writes/change"
	UnitNodes             = "nodes"
	UnitGPUs              = "GPUs"
	UnitWatches           = "watches"
	UnitGoroutines        = "goroutines"
	UnitTransports        = "transports"
	UnitBytesPerSecond    = "bytes/s"
	UnitMiB               = "MiB"
	UnitCalls             = "calls"

	// UnitWritesPerNodePerPeriod is writes per node per heartbeat period.
	UnitWritesPerNodePerPeriod = "writes/node/period"
)

// Percentiles.
const (
	P50 = "p50"
	P90 = "p90"
	P99 = "p99"
	Max = "max"
)

// The figures TestBenchSignalToObject (test/e2e) writes to GPUHEALTH_BENCH_OUT.
const (
	// SignalToObject is the time from a signal until an object is seen through a watch, in
	// UnitMilliseconds, one figure per LabelPath: the value is the p50, with P50, P99 and Max.
	SignalToObject = "signal_to_object"
	LabelPath      = "path"
	// BareClientToObject is the limit SignalToObject is compared with: the time from a bare
	// client's request (same identity, rate limits and spacing, no agent logic) until the same
	// watch saw the object, per LabelPath, as SignalToObject.
	BareClientToObject = "bare_client_to_object"
	// SignalTrace splits SignalToObject at the agent's request, per LabelPath and LabelStage
	// (signal -> request sent, request -> response, response -> watch), as SignalToObject.
	SignalTrace = "signal_trace"
	LabelStage  = "stage"
	// WritesPerChange is the API writes per GPU state change of one reporter (LabelSink), in
	// UnitWritesPerChange; the samples are the state changes.
	WritesPerChange = "api_writes_per_change"
	LabelSink       = "sink"
)

// The figures TestFleet (test/fleet) writes to GPUHEALTH_FLEET_OUT, one run each.
const (
	FleetNodes             = "nodes"               // UnitNodes
	FleetGPUs              = "gpus"                // UnitGPUs
	FleetSetupTime         = "setup_time"          // UnitSeconds: creating the Nodes and ResourceSlices
	FleetStartupTime       = "startup_time"        // UnitSeconds: until every agent is ready
	FleetStartupRequests   = "startup_requests"    // UnitRequests, By kind
	FleetHeapPerNode       = "heap_per_node"       // UnitKiB
	FleetRSSPerNode        = "rss_per_node"        // UnitKiB
	FleetGoroutinesPerNode = "goroutines_per_node" // UnitGoroutines
	FleetOpenWatches       = "open_watches"        // UnitWatches
	FleetWatchesPerNode    = "watches_per_node"    // UnitWatches
	FleetClientTransports  = "client_transports"   // UnitTransports
	FleetSteadyWindow      = "steady_window"       // UnitSeconds
	FleetSteadyRequests    = "steady_requests"     // UnitRequests, By kind
	FleetSteadyRequestRate = "steady_request_rate" // UnitRequestsPerSecond
	FleetSteadyWrites      = "steady_writes"       // UnitWrites
	FleetSteadyCPU         = "steady_cpu"          // UnitCPU, all agents together
	FleetWaveGPUs          = "wave_gpus"           // UnitGPUs failing at once
	FleetWaveNodes         = "wave_nodes"          // UnitNodes they are on
	// UnitSeconds from the injection until the last object of a kind was seen; all is the later
	// of the annotations and the rules: what schedulers read.
	FleetWaveAnnotationsTime = "wave_annotations_time"
	FleetWaveRulesTime       = "wave_rules_time"
	FleetWaveConditionsTime  = "wave_conditions_time"
	FleetWaveAllTime         = "wave_all_time"
	FleetWaveObjectLatency   = "wave_object_latency" // UnitSeconds per taint and annotation: the p50, with P50 and P99
	FleetWaveRequests        = "wave_requests"       // UnitRequests, By kind (failed ones again by status)
	FleetWaveWrites          = "wave_writes"         // UnitWrites, By reporter
	FleetWaveRewatches       = "wave_rewatches"      // UnitWatches the API server closed on the observer
	// The bare wave: the wave's writes sent by bare clients (no agent logic), UnitSeconds until
	// all its annotations and rules were seen, and its UnitRequests, By kind.
	FleetBareWaveAllTime  = "bare_wave_all_time"
	FleetBareWaveRequests = "bare_wave_requests"
	// With the circuit breaker on: its budget, and when the budget is below the wave, the
	// seconds until exactly the budget had NoSchedule and the most that ever had it at once.
	FleetBreakerBudget        = "breaker_budget"         // UnitGPUs
	FleetBreakerSettleTime    = "breaker_settle_time"    // UnitSeconds
	FleetBreakerMaxDisruptive = "breaker_max_disruptive" // UnitGPUs
	// The heartbeat phase (issue 28): every agent started again with agent.heartbeat
	// FleetHeartbeatPeriod (UnitSeconds); over FleetHeartbeatWindow (UnitSeconds) of steady state
	// the agents' UnitWrites (By reporter) and UnitRequests (By kind), and the writes per node
	// per period, in UnitWritesPerNodePerPeriod (the goal: at most 1).
	FleetHeartbeatPeriod           = "heartbeat_period"
	FleetHeartbeatWindow           = "heartbeat_window"
	FleetHeartbeatWrites           = "heartbeat_writes"
	FleetHeartbeatRequests         = "heartbeat_requests"
	FleetHeartbeatPerNodePerPeriod = "heartbeat_writes_per_node_per_period"

	// A fleet of which only some nodes run a real agent (GPUHEALTH_FLEET_AGENTS; issue 49): the
	// real agents (UnitNodes) and the agent.heartbeat of the main run (UnitSeconds; the
	// simulated nodes renew their Leases at it too).
	FleetAgents          = "agents"
	FleetAgentHeartbeat  = "agent_heartbeat"
	FleetSteadyByteRate  = "steady_byte_rate"  // UnitBytesPerSecond: request and response bodies, watches included
	FleetWaveWindow      = "wave_window"       // UnitSeconds: from the injection until the wave's requests were counted
	FleetWaveRequestRate = "wave_request_rate" // UnitRequestsPerSecond over FleetWaveWindow
	FleetWaveByteRate    = "wave_byte_rate"    // UnitBytesPerSecond over FleetWaveWindow
	// Time to taint: from the fault's signal until its DeviceTaintRule and its
	// volcano.sh/gpu-unhealthy-ids are both seen through watches, per faulty GPU, in UnitSeconds:
	// the p50 with P50, P90 and P99. FleetFaultTaint: single faults on real agents one at a time
	// (Samples: how many), FleetBareFaultTaint the bare client's same writes; FleetWaveTaint and
	// FleetBareWaveTaint the same for every GPU of the wave.
	FleetFaultTaint     = "fault_taint"
	FleetBareFaultTaint = "bare_fault_taint"
	FleetWaveTaint      = "wave_taint"
	FleetBareWaveTaint  = "bare_wave_taint"
	// The control plane's memory (UnitMiB) at steady state and at its peak (VmRSS, VmHWM).
	FleetAPIServerRSS     = "apiserver_rss"
	FleetAPIServerPeakRSS = "apiserver_peak_rss"
	FleetEtcdRSS          = "etcd_rss"
	FleetEtcdPeakRSS      = "etcd_peak_rss"
	// The readers over the whole fleet: the extender's /filter (UnitSeconds, p50 with P50, P90,
	// P99; Samples: the calls), the seconds its caches took to sync and the heap and RSS (UnitMiB)
	// they added; the breaker counter's time from its start to the right count and its heap and
	// RSS; `gpuhealth status`'s wall time and peak RSS.
	FleetFilter           = "filter"
	FleetFilterFitNodes   = "filter_fit_nodes" // UnitNodes
	FleetExtenderSync     = "extender_sync"
	FleetExtenderHeap     = "extender_heap"
	FleetExtenderRSS      = "extender_rss"
	FleetCounterRecount   = "counter_recount"
	FleetCounterHeap      = "counter_heap"
	FleetCounterRSS       = "counter_rss"
	FleetStatusTime       = "status_time"
	FleetStatusPeakRSS    = "status_peak_rss"
	FleetStatusUnfinished = "status_unfinished" // UnitCalls: 1 when it was stopped at the test's limit
)

// The figures of TestBenchAgentContainerMemory: the agent as the chart runs it, in a container on
// a real kubelet node, as the kubelet (stats summary), the container's cgroup and /proc see it.
// Each carries LabelScenario.
const (
	ContainerWorkingSet = "container_working_set" // kubelet: workingSetBytes (what eviction and `kubectl top` use)
	ContainerRSS        = "container_rss"         // kubelet: rssBytes (anonymous)
	ContainerUsage      = "container_usage"       // kubelet: usageBytes
	CgroupUsage         = "cgroup_usage"          // memory.usage_in_bytes (v1) or memory.current (v2)
	CgroupAnon          = "cgroup_anon"           // memory.stat rss (v1) or anon (v2)
	CgroupFile          = "cgroup_file"           // memory.stat cache (v1) or file (v2): page cache charged to the container
	CgroupPeak          = "cgroup_peak"           // memory.max_usage_in_bytes (v1) or memory.peak (v2)
	ContainerProcRSS    = "container_proc_rss"    // /proc/PID/status of the agent in the container: VmRSS
	ContainerProcAnon   = "container_proc_anon"   // RssAnon
	ContainerProcFile   = "container_proc_file"   // RssFile
	ContainerCPU        = "container_cpu"         // the cgroup's CPU time over the window, in percent of a core

	LabelScenario = "scenario"
	ScenarioIdle  = "idle"
	ScenarioStorm = "storm"
)
