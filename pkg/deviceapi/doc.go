// Package deviceapi serves gpuhealth's verdicts as NVIDIA's Device API: the read-only GpuService
// of NVSentinel (GetGpu, ListGpus, WatchGpus, package nvidia.nvsentinel.v1alpha1), which device
// plugins, DRA drivers and other node-local readers use to learn which GPUs are fit for work
// without judging GPUs themselves.
//
// Each physical GPU is one Gpu, named by its lowercased UUID, with spec.uuid its UUID and these
// conditions (Convert; docs/device-api.md has the table):
//
//   - Ready: False while the GPU, or one of its MIG instances, is Unhealthy, with the reason of
//     its worst condition; True when Healthy, and when Degraded (schedulers keep placing work on
//     a Degraded GPU), then with the reason of its worst condition;
//   - one condition per family of checks (XIDHealthy, MemoryHealthy, ThermalHealthy, ...; see
//     FamilyTypes): False while a fault of the family is in effect, Unknown where the backend
//     runs none of its checks, True otherwise;
//
// and recommended_action, the action gpuhealth recommends for the worst fault ("ResetGPU").
//
// A Server follows a health.Monitor (Run): each snapshot becomes Gpus, and each Gpu that changed
// is one event for every watcher, queued in the watcher's bounded buffer without waiting. A
// watcher that falls behind its buffer is dropped (RESOURCE_EXHAUSTED) and the number of open
// watches is capped, so no client can slow the Monitor or another client. The agent serves it
// on a socket (agent.deviceAPI); an embedder of the health library serves the same:
//
//	srv := deviceapi.New(runtime.Monitor(), deviceapi.Options{})
//	g.Go(func() error {
//		return srv.ServeSocket(ctx, deviceapi.SocketOptions{Path: "/var/run/gpuhealth/device-api.sock"})
//	})
//
// or registers it on a gRPC server of its own (Register) and runs Run beside it. The wire types
// are package v1alpha1, generated from gpuhealth's own description of the interface.
package deviceapi
