/*
 * The wire between the simulated libnvidia-ml.so.1 and the simulator (`gpuhealth sim-driver
 * serve`), over the Unix socket beside the library. internal/simdriver/wire.go mirrors it: change
 * both together (TestWireMatchesHeader compares them).
 *
 * Every call is one request and one response of fixed size, little-endian, on a connection the
 * calling thread owns (so that a thread blocked in nvmlEventSetWait holds up no other call). The
 * first request of a connection is SIM_OP_HELLO with the process ID in a and the library's
 * profile (driver version) in s; the simulator keeps event sets and NVML sessions per process.
 * It knows the process from the socket's peer credentials (SO_PEERCRED), not from a: a is taken
 * only from a process the simulator's pid namespace cannot see (peer.go).
 */
#ifndef GPUHEALTH_SIM_WIRE_H
#define GPUHEALTH_SIM_WIRE_H

#include <stdint.h>

#define SIM_WIRE_VERSION 1
#define SIM_STR 96
#define SIM_VALUES 8
#define SIM_SOCKET_NAME "gpuhealth-sim-driver.sock"

/* A device on the wire: GPU index * SIM_MIG_SLOTS + MIG slot (0: the GPU itself, 1..7: its MIG
 * devices by index + 1). */
#define SIM_MIG_SLOTS 8

struct sim_req {
	uint32_t op;
	uint32_t dev;
	uint32_t a;
	uint32_t b;
	uint64_t c;
	char s[SIM_STR];
};

struct sim_resp {
	int32_t ret; /* an nvmlReturn_t */
	uint32_t n;
	uint64_t v[SIM_VALUES];
	char s[SIM_STR];
};

enum sim_op {
	SIM_OP_HELLO = 1,
	SIM_OP_INIT,
	SIM_OP_SHUTDOWN,
	SIM_OP_COUNT,
	SIM_OP_BY_UUID,
	SIM_OP_BY_PCI,
	SIM_OP_UUID,
	SIM_OP_NAME,
	SIM_OP_SERIAL,
	SIM_OP_MINOR,
	SIM_OP_PCI,
	SIM_OP_MEMORY,
	SIM_OP_CUDA_CC,
	SIM_OP_BRAND,
	SIM_OP_ARCH,
	SIM_OP_TEMP,
	SIM_OP_TEMP_THRESHOLD,
	SIM_OP_ECC_MODE,
	SIM_OP_ECC_TOTAL,
	SIM_OP_REMAPPED_ROWS,
	SIM_OP_RETIRED_PENDING,
	SIM_OP_POWER,
	SIM_OP_CLOCK_REASONS,
	SIM_OP_PCIE_REPLAYS,
	SIM_OP_NVLINK_STATE,
	SIM_OP_NVLINK_ERRORS,
	SIM_OP_FIELD,
	SIM_OP_MIG_MODE,
	SIM_OP_MIG_MAX,
	SIM_OP_MIG_HANDLE,
	SIM_OP_MIG_IDS,
	SIM_OP_FABRIC,
	SIM_OP_EVENTSET_CREATE,
	SIM_OP_EVENTSET_FREE,
	SIM_OP_REGISTER_EVENTS,
	SIM_OP_SUPPORTED_EVENTS,
	SIM_OP_EVENTSET_WAIT,
	SIM_OP_UNSUPPORTED, /* s: the function's name; logged once by the simulator */
	SIM_OP_INJECT,      /* from `sim-driver inject`: c bytes of YAML follow the request; the node's only */
	SIM_OP_RESET,       /* nvidia-smi --gpu-reset of dev: the node's only; refused while another process holds it */
	SIM_OP_ROW_REMAP_HISTOGRAM,
	SIM_OP_SRAM_STATUS,
	SIM_OP_PCIE_LINK, /* a: 0 current generation, 1 current width, 2 maximum generation, 3 maximum width, 4 the GPU's own maximum generation */
	SIM_OP_DIAG,      /* from the simulated dcgmi (Go only): a DCGM diagnostic of dev, level a, timeout b s; c bytes follow */
	SIM_OP_DISCOVERY, /* from the simulated dcgmi (Go only): the GPUs as dcgmi discovery -l lists them */
	SIM_OP_VBIOS,     /* nvmlDeviceGetVbiosVersion: the scenario's gpus.vbios */
	SIM_OP_LAST
};

#endif
