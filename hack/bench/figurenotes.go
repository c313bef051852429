package main

// whatEachFigureIs is the section of docs/benchmarks.md that says how every figure is measured,
// written under the table by renderDocument.
const whatEachFigureIs = `
## What each figure is

- **library**: ` + "`BenchmarkXIDStorm`, `BenchmarkMixedLoad` and `BenchmarkStormRetainedMemory`" + ` (pkg/health), with
  ` + "`-count 5 -cpu 1 -benchmem`" + `; the median of the five runs. A repeated identical signal allocates nothing.
- **agent**: the real agent binary the chart's DaemonSet runs, ` + "`gpuhealth-agent --backend sim`" + ` (cmd/gpuhealth-agent: the
  agent without the other commands; all reporters, default HealthConfig: sampling every
  10 s, resync 5 min) against a local kube-apiserver, as its own least-privilege ServiceAccount. Each run waits for
  ` + "`/readyz`" + `, waits 2 s more, then reads utime+stime from ` + "`/proc/PID/stat`" + ` across the window and VmRSS
  (RssAnon and RssFile: anonymous memory and the binary's mapped pages; VmHWM as the peak) from
  ` + "`/proc/PID/status`" + ` at its end, and the Go heap in use from the agent's own ` + "`go_memstats_heap_inuse_bytes`" + `. *Idle* is 8 GPUs and no events; the *storm* sends
  XID 13 (counted, the GPU stays Healthy) to all 8 GPUs in bursts every 100 ms. The goals (idle RSS ≤ 30 MiB,
  anonymous ≤ 10 MiB) are issue 18's; the ratio is the median over the goal. File-backed pages are the binary's.
  Before each run the binary is dropped from the page cache (fsync, then POSIX_FADV_DONTNEED), so RssFile
  is what the agent faulted in itself, with the kernel's readahead; a binary whose pages are all cached (as
  right after ` + "`make build`" + `) is mapped nearly whole on this kernel, and RssFile is then about the size of
  its text and read-only data. The agent links no client-go clientset: client-go's typed clients import a
  scheme of every Kubernetes API group (56 packages), whose code and type data the agent touched at start,
  so the agent's code takes a narrow client of the three groups it uses (` + "`internal/kube`" + `: client-go's
  gentype, protobuf, one connection and one rate limiter, as ` + "`kubernetes.NewForConfig`" + `). That took idle RSS from
  35.4 to 28 MiB and the binary from 47 to 32 MiB; ` + "`TestAgentLinksNoFullClientset`" + ` keeps it so.
- **agent in a container**: ` + "`TestBenchAgentContainerMemory`" + ` (test/e2e): the agent as users run it, the chart's
  DaemonSet pod (` + "`helm install`" + ` with ` + "`ci/local-values.yaml`" + ` and the scenario as ` + "`agent.sim.scenario`" + `) from the image
  ` + "`make image`" + ` builds, in a container on a real kubelet node with containerd and runc, the same idle and storm
  scenarios and window. At the window's end it reads the container's memory three ways: the kubelet's
  ` + "`/stats/summary`" + ` (through the API server's node proxy; *working set*, what eviction and ` + "`kubectl top`" + ` use, is
  usage minus inactive page cache), the container's cgroup (` + "`memory.usage_in_bytes`" + ` and ` + "`memory.stat`" + ` on cgroup v1,
  ` + "`memory.current`" + ` on v2), and ` + "`/proc/PID/status`" + ` of the agent's process. The kubelet and the cgroup count the
  container's anonymous memory and only the page cache charged to it; the binary's pages were read into the page
  cache when containerd unpacked the image and stay charged there, so the working set is far below the /proc RSS,
  which counts every mapped page of the binary whoever paid for it. CPU is the cgroup's CPU time over the window.
- **signal → object**: ` + "`TestBenchSignalToObject`" + ` (test/e2e, ` + "`make bench-e2e`" + `): an in-process agent with the
  CLI's client rate limits; each fault and recovery is timed from the signal until the object is seen through a
  watch. The p50 and p99 quoted are the medians of the runs' p50s and p99s; beside the ratio of those
  medians stand the lowest and highest ratio of single runs (a p99 of 200 faults is the third-slowest, so one
  slow request on a shared machine moves it). Writes per change count the
  ` + "`gpuhealth_api_writes_total`" + ` increments per GPU state change (the condition writer also rewrites its message
  when the set of sick GPUs changes). The limit is measured in the same run: after each of the agent's fault and
  recovery, a bare client (the agent's identity and rate limits, no agent logic) sends the same two changes, a
  merge PATCH of the Volcano annotation and a create (delete) of a DeviceTaintRule of the same shape, together,
  timed until the same watches see them; the ratio is agent ÷ bare client. The trace splits the agent's time at
  its request, timed by its client's transport: in the agent (signal → request sent), the request, and response
  → watch (negative when the watch is faster than the response). It showed the agent's own part below 1 ms and
  its requests slower than the bare client's: the condition's and the Event's requests, sent beside them, slowed
  the API server down. The agent now writes what schedulers read (annotation, DeviceTaintRule, HAMi) first and
  the rest once those have written (` + "`internal/agent/followers.go`" + `), which took the p50 ratio from 1.7× to 1.15×.
  The trace then showed the annotation's watch event reaching the test's watch 3.5–3.9 ms after the agent
  had its response (p99 of three runs), against about 2 ms for the rules: the followers' Node writes, sent
  the moment the response came, competed with the delivery of that event. They now also wait until the
  agent's own Node informer has the write (` + "`nodecache.Cache.WaitCaughtUp`" + `), a watch served like the
  schedulers' watches; in the next runs that step's p99 was 1.4–3.4 ms (median 2.5).
- **kernel log**: ` + "`BenchmarkParseMixedLog` and `BenchmarkReplayRingBuffer`" + ` (pkg/gpu/kmsg, same flags). *Parse*
  runs the kernel-log Source over 1,000,000 /dev/kmsg records held in memory: one in ten an NVRM line
  (XIDs of several driver generations, MIG scopes, XID 154, lost and failed GPUs, identity lines), one in a
  hundred a spoofed line of facility user, the rest ordinary kernel lines; every record is parsed, NVRM lines
  become signals. *Replay* reads a full 1 MiB log buffer one record per read(2) through the Reader into a
  Monitor of 8 GPUs, at a first start and after a restart whose checkpoint cursor covers every record
  ([kernel-log.md](kernel-log.md)).
- **extender**: ` + "`BenchmarkExtenderFilter`" + ` and ` + "`BenchmarkExtenderFilterNodeObjects`" + ` (internal/scheduling/extender):
  one /filter call for a 4-GPU pod over 5,000 nodes × 8 GPUs, through the HTTP handler (decode, filter, encode;
  no network), p50/p99 per call over the benchmark's iterations, the medians of five runs, and the lowest and
  highest p99 of the runs. On a shared machine the wall-clock tail is mostly other processes holding the core,
  so the process's CPU time per call (getrusage, all threads, the collector's included) is given beside it. The
  goal (p99 ≤ 2 ms with nodeCacheCapable) is issue 18's. ` + "`BenchmarkExtenderFilterWithSlowClients`" + ` serves the same
  cluster as ` + "`gpuhealth extender --insecure`" + ` does (` + "`Run`" + `: informers over a fake clientset, the 8 MiB body limit,
  30 s read and write timeouts, at most 64 calls at once; plain HTTP on 127.0.0.1) and times a well-behaved client's
  /filter calls, one after another over a kept-alive connection, from sending the request to reading the whole
  reply. Six rounds alternate 400 calls alone with 400 calls while 8 slow clients, each on a connection of its
  own, announce an 8 MiB body (the same request, then white space) and trickle it, 4 KiB every 5 ms, connecting
  again whenever the server answers or drops them; the ratio is the p99 with them ÷ the p99 without, in the same
  run, since the p99 alone moves between runs more than that (issue 28's goal is ≤ 1.5×). The heap is the whole
  process's (server, fake API server and clients), live after a collection at the start of each phase and at its
  peak in use over the phase's calls, read every 2 ms through runtime/metrics; the limit beside it is the chart's
  extender memory limit. A phase takes under a second and a slow body 10 s, so no slow body is whole within a
  phase and none meets the read timeout: the figures are of slow clients that hold their connections. *Refused*
  counts the slow requests answered 503 (the concurrency bound), *cut* those answered another error or closed.
- **fleet**: ` + "`TestFleet`" + ` (test/fleet): N simulated nodes × 8 GPUs in one process, each with its own
  ` + "`agent.Run`" + `, its own clientset and its own connection (an uncacheable transport, as separate processes would
  have), all reporters, resync 1 h, sharing one ServiceAccount as a DaemonSet does, with the chart's
  FlowSchema and priority level for it, against one kube-apiserver
  (no scheduler or controller-manager). Requests are counted by a ` + "`rest.Config.WrapTransport`" + ` on every
  client. *Start-up* runs from starting every agent at once until every ` + "`/readyz`" + ` is ok. *Memory per node* is the
  growth of the Go heap in use and of the process RSS, after a GC, divided by N (the API server's own memory
  is not included). *Steady state* is a quiet window after start-up. In the *wave* one GPU in ten
  (` + "`(node*8+gpu) % 10 == 0`" + `, at most one per node) gets XID 48 at the same instant through the agents'
  channel backends; the time is until the last DeviceTaintRule and the last ` + "`volcano.sh/gpu-unhealthy-ids`" + `
  annotation are seen through the test's watches. The *bare wave* then measures the limit in the same run:
  it copies what each failing node's agent wrote (its annotations under other keys, its rules under other
  names, its condition under another type, an Event) and, for all those nodes at once, sends the same writes
  with one warm client per node (the agents' identity, rate limits and connections of their own), in the
  agents' order (annotation and rules together, then condition and Event), timed the same way; the ratio is
  the agents' time ÷ the bare clients'. The test asserts only correctness (every expected rule and
  annotation exists at the end, nothing else does, one write per change), never a time. The larger run
  repeats all of it once with more nodes, then measures the *heartbeat* (issue 28). The agents so far beat
  hourly (` + "`agent.heartbeat`" + ` 1 h) and write their first heartbeat with their start-up condition patch, so none
  falls in the steady window or the waves. Once they have stopped, every node's agent starts again (same
  client) with a heartbeat of 20 s (60 s in the larger run: 250 writes/s on top of 5,000 start-ups kept a
  tenth of them from getting ready on 2 cores), one after another over one period, so that the nodes'
  heartbeats fall anywhere in it as in a fleet whose nodes started at unrelated times (agents started
  together write at once, and a window of a few periods counts up to one write per node too few or too
  many, depending on where it opens). Once every agent is ready and every Node has its first heartbeat,
  the agents' writes and requests are counted over 3 periods. Writes per node per period are writes ÷
  nodes ÷ (window ÷ period): below 1 by the random 1 s to 1 s + period/4 each agent adds to its period
  so that agents whose heartbeats fell together do not write together again. The test fails on any other write in the
  window, or a node writing more than once a period. The breaker run turns the circuit breaker on, with its
  controller (the GPU count) in the test process and a budget of 5% of the GPUs, half the wave: 400
  agents race for 200 slots, and the test fails if more than the budget ever had NoSchedule at once
  or if the final state is not exactly the budget NoSchedule and the rest None.

Reading the fleet figures: besides the heartbeat, one nodes/status patch per node per period (the
heartbeat row), the steady state costs no requests at all (no lease, no polling; the 3
watches per agent, each selected by the agent's node through a selector the API server indexes, stay
open), so what remains beyond resyncs is one resync per reporter per hour here (5 minutes by default).
A GPU state change costs exactly four requests: the annotation patch, the condition patch, the
DeviceTaintRule and an Event; the writers read the Node from the agent's shared informer cache, not
with a GET, and no agent watches DeviceTaintRules or ResourceClaims cluster-wide (docs/agent.md says
why). The agents' ServiceAccount gets the chart's FlowSchema and priority level
(` + "`internal/agent.FlowControl`" + `): without them the default FlowSchemas put every agent into one flow
of workload-low with short queues, and most of a wave's burst came back as HTTP 429 (15.3 s for the
500-node wave, 468 rejections; ` + "`GPUHEALTH_FLEET_FLOWCONTROL=0`" + ` reproduces it). With them no request is
rejected up to 1,000 nodes. The queue, ` + "`agent.flowControl.queueLengthLimit`" + `, holds 20,000 requests, four per node
that changes at once: at 5,000 nodes × 8 GPUs (a wave on 4,000 nodes) the old default of 5,000 turned
8,883 of the wave's requests into 429s and retries (34.7 s); with 20,000, 714 (21.6 s, 1.31× the bare
wave). The agents, the test and the API server share the same 2 cores, so the wave's time is mostly
CPU; it varies between runs on a shared machine, and the per-run table below shows the spread.

The fleet test is too heavy for every CI run: it is skipped unless ` + "`GPUHEALTH_FLEET=1`" + `. Run it alone with

` + "```sh" + `
GPUHEALTH_FLEET=1 GPUHEALTH_FLEET_NODES=500 GPUHEALTH_CONTROLPLANE_BIN="$(hack/controlplane/build.sh)" \
  go test -tags e2e -count=1 -v -timeout 20m -run '^TestFleet$' ./test/fleet/
` + "```" + `

(` + "`GPUHEALTH_FLEET_STEADY`" + ` sets the steady window, default 30s; ` + "`GPUHEALTH_FLEET_REPORTERS`" + ` a comma-separated
reporter list, default all; ` + "`GPUHEALTH_FLEET_OUT`" + ` a file for the figures as JSON; ` + "`GPUHEALTH_FLEET_FLOWCONTROL=0`" + `
leaves out the FlowSchema; ` + "`GPUHEALTH_FLEET_HEARTBEAT`" + ` the heartbeat phase's period, default 20s, 0 skips the
phase, and ` + "`GPUHEALTH_FLEET_HEARTBEAT_WINDOW`" + ` its window, default 3 periods; ` + "`GPUHEALTH_FLEET_KEEP`" + ` a directory
for the control plane's logs.)
`
