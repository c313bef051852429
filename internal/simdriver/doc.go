// Package simdriver is gpuhealth's simulated NVIDIA driver: real, unmodified NVML programs
// (gpuhealth's own NVML backend through go-nvml's cgo path, NVIDIA's nvidia-smi and device plugin,
// Volcano's and HAMi's plugins) run on simulated GPUs with faults injected at run time.
//
// Two halves:
//
//   - c/nvml_sim.c is a thin C libnvidia-ml.so.1, built per driver profile by hack/sim-driver.sh
//     against go-nvml's nvml.h, exporting exactly the functions the real library of that branch
//     exports (profiles/<version>.txt, read from NVIDIA's libraries by hack/sim-driver-profiles.sh).
//     Each call goes over the Unix socket beside the library (SocketName) to the simulator, on a
//     connection of the calling thread. Functions it does not implement answer NOT_SUPPORTED.
//   - Serve (this package, `gpuhealth sim-driver serve`) installs that library into a driver root
//     and is the one simulator of the node: every process that loads the library from the driver
//     root, whenever it starts, sees the same GPUs, readings and faults at the same instant. It
//     replays a scenario file (pkg/gpu/sim's format) on the real clock; Inject
//     (`gpuhealth sim-driver inject`) applies one more event at once.
//
// The simulator is also the node's DCGM host engine: Serve installs DCGMIPath, a dcgmi that runs
// DCGMI (`gpuhealth sim-driver dcgmi`), which asks the simulator for a diagnostic of one GPU and
// prints DCGM's document and exit status for the GPU's diagnostic state (dcgm.go, dcgmi.go).
//
// The socket is open to every user (SocketMode), as /dev/nvidiactl is on a real node: any process,
// in a container or not, reads the GPUs. The simulator knows each process from the kernel
// (SO_PEERCRED), never from the pid its HELLO gives, and takes injections and GPU resets only from
// root, its own user and Options.InjectUIDs, in its own pid namespace: not from a tenant's
// container, root or not (peer.go).
//
// Events reach every event set that registered their type for their device, from the moment of
// registration, in every process; a lost GPU answers GPU_IS_LOST from every call on it. With the
// simulator stopped the library answers nvmlInit with DRIVER_NOT_LOADED, as NVIDIA's does without
// its kernel module, and a simulator started again is a driver that came back. See docs/nvml.md,
// "The simulated driver".
package simdriver
