// Package validation reads the verdict of an active GPU test, for "verify before return": after
// a GPU is reset the agent runs one command that tests exactly that GPU (by default NVIDIA
// DCGM's `dcgmi diag -r 2 -i gpu:{dcgmID} -j`), and the GPU goes back into service only on a
// parsed pass for that GPU.
//
// The reader is deliberately suspicious. A test that passes a GPU wrongly returns a faulty card
// to workloads, while one that cannot decide only keeps a GPU out a little longer, so every
// doubt becomes Error (no verdict: the GPU stays out, no repair attempt is counted, the test
// is retried later), never Passed. Failed is kept for a test the GPU itself failed, because it
// counts as a failed repair attempt. NVIDIA documents no stable schema for the JSON of
// `dcgmi diag -j`, so ReadDCGM accepts the shapes of DCGM 3.x and 4.x, ignores fields it does
// not know, and demands that the exit code and the document agree.
//
// Command runs a validation command for one GPU with placeholders for the GPU's identity, kills
// its whole process group on timeout or cancellation, bounds the output it keeps, and reads the
// verdict in the configured Format. The package imports nothing from k8s.io.
//
// # DCGM's GPU ids
//
// `dcgmi diag -i gpu:N` and the results' entity_id (4.x) or gpu_id (3.x) use DCGM's GPU id,
// not NVML's index and not the UUID. Command.Run maps the GPU's UUID to that id through
// `dcgmi discovery -l` (same program, same --host) when the command says {dcgmID}, the default,
// and takes health.Device.Index as the id when it says {index}. From
// DCGM's source (tags v3.3.9, v4.4.2, v4.5.0, v4.6.0):
//
//   - The host engine numbers GPUs once, when its cache manager starts
//     (DcgmCacheManager::Init calls DcgmCacheManager::AttachGpus, dcgmlib/src/DcgmCacheManager.cpp).
//     AttachGpus walks nvmlDeviceGetCount_v2 and nvmlDeviceGetHandleByIndex_v2 (4.5+: through
//     NvmlTaskRunner::GetSafeNvmlHandlesImpl, dcgmlib/src/NvmlTaskRunner.cpp) and sets each
//     GPU's id to its NVML index ("For now, gpuId == index == nvmlIndex" in 3.3.9 to 4.4.2).
//     So on a host engine started with every GPU healthy, DCGM id N is NVML index N.
//   - NVML's order, not CUDA's, decides: CUDA_VISIBLE_DEVICES does not renumber NVML, dcgmi
//     only warns on stderr when it is set in its own environment (EnvironmentInfo::
//     ValidateEnvVarValue, dcgmi/Environment.cpp; "This does not affect which GPUs are
//     selected"), and nvvs sets CUDA_VISIBLE_DEVICES itself to the tested GPUs' UUIDs
//     (NvidiaValidationSuite::SetCudaVisibleDevicesForTesting, nvvs/src/NvidiaValidationSuite.cpp).
//     A container that sees fewer GPUs than the host (a device-plugin or DRA allocation) sees
//     NVML renumbered (NVML's behaviour, not checked here), so the index must come from a view
//     of all the node's GPUs, as the host engine's does.
//   - The ids are not refreshed when GPUs come and go. In 3.x and up to 4.4 AttachGpus runs
//     only at start (and for test injection): a GPU that falls off the bus later keeps its id in
//     the engine, while a fresh NVML client (the agent, after its own restart) numbers the
//     survivors from 0 again. From 4.5 the engine listens for driver unbind/bind events
//     (DcgmNvmlSystemEventThread::DetachDriverImpl/AttachDriverImpl, dcgmlib/src/
//     DcgmHostEngineHandler.cpp; dcgmAttachDriver/dcgmDetachDriver in dcgm_agent.h) and then
//     DcgmCacheManager::MergeNewlyDetectedGpuList matches the newly enumerated GPUs to the old
//     ones by UUID: known GPUs keep their old id, a GPU that is gone stays as a detached slot,
//     and a new UUID is appended after the last id. Ids and NVML indexes then diverge.
//   - From 4.5.0 MergeNewlyDetectedGpuList also skips, at first start, GPUs whose UUID could not
//     be read (a handle NVML refused: no permission, GPU lost), storing the GPUs after them in
//     lower slots while each record keeps its NVML index as gpuId; an engine started beside a
//     broken GPU can therefore report ids that are not NVML indexes.
//   - NvmlIndexToGpuId and GpuIdToNvmlIndex (DcgmCacheManager.cpp) hold the engine's own map;
//     `dcgmi discovery -l` prints each id with its UUID and PCI bus id.
//
// In short: DCGM id == NVML index on a host engine that started with every GPU present and
// readable and has seen none leave or join since; after a GPU fell off the bus (the very GPUs
// this package validates) or a driver rebind they may differ, silently. A mistaken id tests
// another GPU, whose pass must not return this one: the cautious command names the GPU by
// something stable (its UUID, mapped to DCGM's id through `dcgmi discovery -l`: {dcgmID}, see
// ParseDCGMDiscovery) or the host engine restarts with the driver. Nothing here was checked on a
// real GPU.
package validation
