/*
 * gpuhealth's simulated libnvidia-ml.so.1: NVML's C ABI as nvml.h (go-nvml's copy) declares it,
 * each call forwarded to the one simulator of the node (`gpuhealth sim-driver serve`) over the
 * Unix socket beside this library. A thin C library and not Go: a Go c-shared library loaded by a
 * Go program puts two Go runtimes in one process, which Go does not support (golang/go#18976).
 *
 * Built once per driver profile by hack/sim-driver.sh: SIM_DRIVER_VERSION names the branch, a
 * linker version script exports exactly that branch's functions (read from NVIDIA's real
 * libraries), and every exported function this file does not implement is a generated stub that
 * answers NVML_ERROR_NOT_SUPPORTED and has the simulator log its name once.
 *
 * Without a simulator listening, nvmlInit answers NVML_ERROR_DRIVER_NOT_LOADED, as the real
 * library does without its kernel module; a call in a session whose simulator went away answers
 * NVML_ERROR_UNKNOWN, and the next connection finds a simulator that came back.
 */
#define _GNU_SOURCE
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "nvml.h"
#include "sim_wire.h"

#ifndef SIM_DRIVER_VERSION
#error "SIM_DRIVER_VERSION must name the driver profile"
#endif
#ifndef SIM_NVML_MAJOR
#define SIM_NVML_MAJOR 12
#endif
#ifndef SIM_CUDA_VERSION
#define SIM_CUDA_VERSION 12020
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_GPUS 64

/* Handles are addresses of these, as the real library hands out pointers to its own memory. */
struct nvmlDevice_st {
	unsigned int magic;
	unsigned int wire; /* gpu * SIM_MIG_SLOTS + slot */
};
struct nvmlEventSet_st {
	unsigned int magic;
	unsigned int id;
};
#define DEVICE_MAGIC 0x6e766d6cu
#define SET_MAGIC 0x65767374u

static struct nvmlDevice_st devices[MAX_GPUS * SIM_MIG_SLOTS];
static char socket_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;
static pthread_key_t conn_key;
static pthread_once_t conn_once = PTHREAD_ONCE_INIT;
static __thread int conn_fd = -1;

static void close_conn(void *p) {
	int fd = (int)(intptr_t)p - 1;
	if (fd >= 0)
		close(fd);
}

static void make_key(void) { pthread_key_create(&conn_key, close_conn); }

__attribute__((constructor)) static void sim_setup(void) {
	for (unsigned int i = 0; i < MAX_GPUS * SIM_MIG_SLOTS; i++) {
		devices[i].magic = DEVICE_MAGIC;
		devices[i].wire = i;
	}
	const char *env = getenv("GPUHEALTH_SIM_DRIVER_SOCKET");
	if (env && *env) {
		snprintf(socket_path, sizeof socket_path, "%s", env);
		return;
	}
	Dl_info info;
	if (dladdr((void *)sim_setup, &info) && info.dli_fname) {
		const char *slash = strrchr(info.dli_fname, '/');
		int dir = slash ? (int)(slash - info.dli_fname) : 1;
		snprintf(socket_path, sizeof socket_path, "%.*s/%s", dir, slash ? info.dli_fname : ".", SIM_SOCKET_NAME);
	}
}

static int write_all(int fd, const void *buf, size_t n) {
	const char *p = buf;
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static int read_all(int fd, void *buf, size_t n) {
	char *p = buf;
	while (n > 0) {
		ssize_t r = recv(fd, p, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static void drop_conn(void) {
	if (conn_fd >= 0) {
		close(conn_fd);
		conn_fd = -1;
		pthread_setspecific(conn_key, NULL);
	}
}

/* conn returns this thread's connection to the simulator, connecting (and saying hello) first.
 * When the simulator refuses the hello (a simulator of another driver version: the kernel
 * module's LIB_RM_VERSION_MISMATCH) it returns -1 and sets *refused to its answer. */
static int conn(nvmlReturn_t *refused) {
	if (conn_fd >= 0)
		return conn_fd;
	pthread_once(&conn_once, make_key);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_un addr = {.sun_family = AF_UNIX};
	snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
	if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
		close(fd);
		return -1;
	}
	struct sim_req hello = {.op = SIM_OP_HELLO, .a = (uint32_t)getpid(), .b = SIM_WIRE_VERSION};
	snprintf(hello.s, sizeof hello.s, "%s", SIM_DRIVER_VERSION);
	struct sim_resp resp;
	if (write_all(fd, &hello, sizeof hello) != 0 || read_all(fd, &resp, sizeof resp) != 0) {
		close(fd);
		return -1;
	}
	if (resp.ret != NVML_SUCCESS) {
		close(fd);
		if (resp.ret == NVML_ERROR_LIB_RM_VERSION_MISMATCH)
			*refused = NVML_ERROR_LIB_RM_VERSION_MISMATCH;
		return -1;
	}
	conn_fd = fd;
	pthread_setspecific(conn_key, (void *)(intptr_t)(fd + 1));
	return fd;
}

/* call sends one request; a simulator that cannot be reached answers unreachable. */
static nvmlReturn_t call_or(struct sim_req *req, struct sim_resp *resp, nvmlReturn_t unreachable) {
	for (int attempt = 0; attempt < 2; attempt++) {
		nvmlReturn_t refused = unreachable;
		int fd = conn(&refused);
		if (fd < 0)
			return refused;
		if (write_all(fd, req, sizeof *req) == 0 && read_all(fd, resp, sizeof *resp) == 0)
			return (nvmlReturn_t)resp->ret;
		drop_conn(); /* the simulator restarted: try a new connection once */
	}
	return unreachable;
}

static int initialised(void) {
	pthread_mutex_lock(&init_lock);
	int n = init_count;
	pthread_mutex_unlock(&init_lock);
	return n > 0;
}

static nvmlReturn_t call(struct sim_req *req, struct sim_resp *resp) {
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	return call_or(req, resp, NVML_ERROR_UNKNOWN);
}

/* go-nvml's nvml.h wraps each handle in a one-pointer struct, which the ABI passes as the pointer
 * NVIDIA's own header declares. */
static int wire_of(nvmlDevice_t d, unsigned int *wire) {
	struct nvmlDevice_st *h = d.handle;
	if (!h || h < devices || h >= devices + MAX_GPUS * SIM_MIG_SLOTS || h->magic != DEVICE_MAGIC)
		return 0;
	*wire = h->wire;
	return 1;
}

/* dev_call is call on a device handle. */
static nvmlReturn_t dev_call(nvmlDevice_t d, unsigned int op, unsigned int a, unsigned int b, struct sim_resp *resp) {
	struct sim_req req = {.op = op, .a = a, .b = b};
	if (!wire_of(d, &req.dev))
		return NVML_ERROR_INVALID_ARGUMENT;
	return call(&req, resp);
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length) {
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	size_t n = strnlen(s, SIM_STR);
	if (length < n + 1)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(out, s, n);
	out[n] = 0;
	return NVML_SUCCESS;
}

/* unsupported reports a function the simulator does not implement: NOT_SUPPORTED, logged once by
 * name there. The generated stubs call it. */
nvmlReturn_t gpuhealth_sim_unsupported(const char *name);
nvmlReturn_t gpuhealth_sim_unsupported(const char *name) {
	struct sim_req req = {.op = SIM_OP_UNSUPPORTED};
	struct sim_resp resp;
	snprintf(req.s, sizeof req.s, "%s", name);
	if (initialised())
		call_or(&req, &resp, NVML_ERROR_NOT_SUPPORTED);
	return initialised() ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_UNINITIALIZED;
}

/* --- Initialisation ------------------------------------------------------------------------ */

static nvmlReturn_t do_init(void) {
	struct sim_req req = {.op = SIM_OP_INIT};
	struct sim_resp resp;
	nvmlReturn_t ret = call_or(&req, &resp, NVML_ERROR_DRIVER_NOT_LOADED);
	if (ret == NVML_SUCCESS) {
		pthread_mutex_lock(&init_lock);
		init_count++;
		pthread_mutex_unlock(&init_lock);
	}
	return ret;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
	(void)flags;
	return do_init();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
	pthread_mutex_lock(&init_lock);
	if (init_count == 0) {
		pthread_mutex_unlock(&init_lock);
		return NVML_ERROR_UNINITIALIZED;
	}
	init_count--;
	pthread_mutex_unlock(&init_lock);
	struct sim_req req = {.op = SIM_OP_SHUTDOWN};
	struct sim_resp resp;
	call_or(&req, &resp, NVML_SUCCESS);
	return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
	switch (r) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_IN_USE: return "In use by another client";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_RESET_REQUIRED: return "GPU requires reset";
	case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
	default: return "Unknown Error";
	}
}

/* --- System ---------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	return copy_string(SIM_DRIVER_VERSION, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
	char v[SIM_STR];
	snprintf(v, sizeof v, "%d.%s", SIM_NVML_MAJOR, SIM_DRIVER_VERSION);
	return copy_string(v, version, length);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
	if (!v)
		return NVML_ERROR_INVALID_ARGUMENT;
	*v = SIM_CUDA_VERSION;
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

/* --- Inventory ----------------------------------------------------------------------------- */

static nvmlReturn_t get_count(unsigned int *count) {
	struct sim_req req = {.op = SIM_OP_COUNT};
	struct sim_resp resp;
	if (!count)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = call(&req, &resp);
	if (ret == NVML_SUCCESS)
		*count = (unsigned int)resp.v[0];
	return ret;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *c) { return get_count(c); }
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *c) { return get_count(c); }

static nvmlReturn_t by_index(unsigned int index, nvmlDevice_t *device) {
	unsigned int count;
	if (!device)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = get_count(&count);
	if (ret != NVML_SUCCESS)
		return ret;
	if (index >= count || index >= MAX_GPUS)
		return NVML_ERROR_INVALID_ARGUMENT;
	device->handle = &devices[index * SIM_MIG_SLOTS];
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *d) { return by_index(i, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *d) { return by_index(i, d); }

static nvmlReturn_t by_string(unsigned int op, const char *s, nvmlDevice_t *device) {
	struct sim_req req = {.op = op};
	struct sim_resp resp;
	if (!s || !device)
		return NVML_ERROR_INVALID_ARGUMENT;
	snprintf(req.s, sizeof req.s, "%s", s);
	nvmlReturn_t ret = call(&req, &resp);
	if (ret == NVML_SUCCESS) {
		if (resp.v[0] >= MAX_GPUS * SIM_MIG_SLOTS)
			return NVML_ERROR_UNKNOWN;
		device->handle = &devices[resp.v[0]];
	}
	return ret;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *d) { return by_string(SIM_OP_BY_UUID, uuid, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *id, nvmlDevice_t *d) { return by_string(SIM_OP_BY_PCI, id, d); }
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *id, nvmlDevice_t *d) { return by_string(SIM_OP_BY_PCI, id, d); }

static nvmlReturn_t dev_string(nvmlDevice_t d, unsigned int op, char *out, unsigned int length) {
	struct sim_resp resp;
	nvmlReturn_t ret = dev_call(d, op, 0, 0, &resp);
	return ret == NVML_SUCCESS ? copy_string(resp.s, out, length) : ret;
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int n) { return dev_string(d, SIM_OP_UUID, uuid, n); }
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int n) { return dev_string(d, SIM_OP_NAME, name, n); }
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t d, char *serial, unsigned int n) { return dev_string(d, SIM_OP_SERIAL, serial, n); }
EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t d, char *version, unsigned int n) { return dev_string(d, SIM_OP_VBIOS, version, n); }

/* dev_u32 asks op and stores v[0] in *out. */
static nvmlReturn_t dev_u32(nvmlDevice_t d, unsigned int op, unsigned int a, unsigned int b, unsigned int *out) {
	struct sim_resp resp;
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, op, a, b, &resp);
	if (ret == NVML_SUCCESS)
		*out = (unsigned int)resp.v[0];
	return ret;
}

static nvmlReturn_t dev_u64(nvmlDevice_t d, unsigned int op, unsigned int a, unsigned int b, unsigned long long *out) {
	struct sim_resp resp;
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, op, a, b, &resp);
	if (ret == NVML_SUCCESS)
		*out = resp.v[0];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *m) { return dev_u32(d, SIM_OP_MINOR, 0, 0, m); }

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
	unsigned int wire;
	if (!index || !wire_of(d, &wire))
		return NVML_ERROR_INVALID_ARGUMENT;
	if (!initialised())
		return NVML_ERROR_UNINITIALIZED;
	*index = wire / SIM_MIG_SLOTS;
	return NVML_SUCCESS;
}

/* The layout of nvmlPciInfo_t before NVML 2.285's v2 (what unversioned nvmlDeviceGetPciInfo
 * callers pass): a 16-byte bus ID and four reserved words. */
typedef struct {
	char busId[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	unsigned int reserved0, reserved1, reserved2, reserved3;
} pci_info_v1;

static nvmlReturn_t pci(nvmlDevice_t d, struct sim_resp *resp) { return dev_call(d, SIM_OP_PCI, 0, 0, resp); }

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t d, nvmlPciInfo_t *out) {
	struct sim_resp r;
	pci_info_v1 *p = (pci_info_v1 *)out;
	if (!out)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = pci(d, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	memset(p, 0, sizeof *p);
	snprintf(p->busId, sizeof p->busId, "%04X:%02X:%02X.0", (unsigned)r.v[0], (unsigned)r.v[1], (unsigned)r.v[2]);
	p->domain = (unsigned)r.v[0], p->bus = (unsigned)r.v[1], p->device = (unsigned)r.v[2];
	p->pciDeviceId = (unsigned)r.v[3], p->pciSubSystemId = (unsigned)r.v[4];
	return NVML_SUCCESS;
}

static nvmlReturn_t pci_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
	struct sim_resp r;
	if (!p)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = pci(d, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	memset(p, 0, sizeof *p);
	snprintf(p->busIdLegacy, sizeof p->busIdLegacy, NVML_DEVICE_PCI_BUS_ID_LEGACY_FMT, (unsigned)r.v[0], (unsigned)r.v[1], (unsigned)r.v[2]);
	snprintf(p->busId, sizeof p->busId, NVML_DEVICE_PCI_BUS_ID_FMT, (unsigned)r.v[0], (unsigned)r.v[1], (unsigned)r.v[2]);
	p->domain = (unsigned)r.v[0], p->bus = (unsigned)r.v[1], p->device = (unsigned)r.v[2];
	p->pciDeviceId = (unsigned)r.v[3], p->pciSubSystemId = (unsigned)r.v[4];
	return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_v3(d, p); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) { return pci_v3(d, p); }

EXPORT nvmlReturn_t nvmlDeviceGetPciInfoExt(nvmlDevice_t d, nvmlPciInfoExt_t *p) {
	struct sim_resp r;
	if (!p)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (p->version != nvmlPciInfoExt_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t ret = pci(d, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	unsigned int version = p->version;
	memset(p, 0, sizeof *p);
	p->version = version;
	snprintf(p->busId, sizeof p->busId, NVML_DEVICE_PCI_BUS_ID_FMT, (unsigned)r.v[0], (unsigned)r.v[1], (unsigned)r.v[2]);
	p->domain = (unsigned)r.v[0], p->bus = (unsigned)r.v[1], p->device = (unsigned)r.v[2];
	p->pciDeviceId = (unsigned)r.v[3], p->pciSubSystemId = (unsigned)r.v[4];
	p->baseClass = 0x03, p->subClass = 0x02; /* a 3D controller */
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
	struct sim_resp r;
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_MEMORY, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		m->total = r.v[0], m->free = r.v[1], m->used = r.v[2];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
	struct sim_resp r;
	if (!m)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (m->version != nvmlMemory_v2)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t ret = dev_call(d, SIM_OP_MEMORY, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		m->total = r.v[0], m->free = r.v[1], m->used = r.v[2], m->reserved = r.v[3];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t d, int *major, int *minor) {
	struct sim_resp r;
	if (!major || !minor)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_CUDA_CC, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		*major = (int)r.v[0], *minor = (int)r.v[1];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t d, nvmlBrandType_t *t) { return dev_u32(d, SIM_OP_BRAND, 0, 0, (unsigned int *)t); }
EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t d, nvmlDeviceArchitecture_t *a) { return dev_u32(d, SIM_OP_ARCH, 0, 0, a); }

/* --- Readings ------------------------------------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, nvmlTemperatureSensors_t s, unsigned int *t) {
	return dev_u32(d, SIM_OP_TEMP, (unsigned int)s, 0, t);
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, nvmlTemperatureThresholds_t k, unsigned int *t) {
	return dev_u32(d, SIM_OP_TEMP_THRESHOLD, (unsigned int)k, 0, t);
}

EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t d, nvmlEnableState_t *current, nvmlEnableState_t *pending) {
	struct sim_resp r;
	if (!current || !pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_ECC_MODE, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		*current = (nvmlEnableState_t)r.v[0], *pending = (nvmlEnableState_t)r.v[1];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, nvmlMemoryErrorType_t e, nvmlEccCounterType_t c, unsigned long long *n) {
	return dev_u64(d, SIM_OP_ECC_TOTAL, (unsigned int)e, (unsigned int)c, n);
}

EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc, unsigned int *pending, unsigned int *failure) {
	struct sim_resp r;
	if (!corr || !unc || !pending || !failure)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_REMAPPED_ROWS, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		*corr = (unsigned)r.v[0], *unc = (unsigned)r.v[1], *pending = (unsigned)r.v[2], *failure = (unsigned)r.v[3];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, nvmlEnableState_t *p) {
	return dev_u32(d, SIM_OP_RETIRED_PENDING, 0, 0, (unsigned int *)p);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) { return dev_u32(d, SIM_OP_POWER, 0, 0, mw); }
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *mw) { return dev_u32(d, SIM_OP_POWER, 1, 0, mw); }

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *r) { return dev_u64(d, SIM_OP_CLOCK_REASONS, 0, 0, r); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *r) { return dev_u64(d, SIM_OP_CLOCK_REASONS, 0, 0, r); }

EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_REPLAYS, 0, 0, v); }

/* The PCIe link as trained and the most it can: "this device and system" for the Max calls, the
 * GPU's own for GpuMax (sim_wire.h numbers the parts). */
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_LINK, 0, 0, v); }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_LINK, 1, 0, v); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_LINK, 2, 0, v); }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_LINK, 3, 0, v); }
EXPORT nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t d, unsigned int *v) { return dev_u32(d, SIM_OP_PCIE_LINK, 4, 0, v); }

EXPORT nvmlReturn_t nvmlDeviceGetRowRemapperHistogram(nvmlDevice_t d, nvmlRowRemapperHistogramValues_t *h) {
	struct sim_resp r;
	if (!h)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_ROW_REMAP_HISTOGRAM, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		h->max = (unsigned)r.v[0], h->high = (unsigned)r.v[1], h->partial = (unsigned)r.v[2], h->low = (unsigned)r.v[3], h->none = (unsigned)r.v[4];
	return ret;
}

/* nvmlEccSramErrorStatus_v1 only, as NVML refuses another version. */
EXPORT nvmlReturn_t nvmlDeviceGetSramEccErrorStatus(nvmlDevice_t d, nvmlEccSramErrorStatus_t *st) {
	struct sim_resp r;
	if (!st)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (st->version != nvmlEccSramErrorStatus_v1)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t ret = dev_call(d, SIM_OP_SRAM_STATUS, 0, 0, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	unsigned int version = st->version;
	memset(st, 0, sizeof *st);
	st->version = version;
	st->aggregateUncParity = r.v[0];
	st->aggregateUncSecDed = r.v[1];
	st->aggregateCor = r.v[2];
	st->bThresholdExceeded = (unsigned int)r.v[3];
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t d, unsigned int link, nvmlEnableState_t *active) {
	return dev_u32(d, SIM_OP_NVLINK_STATE, link, 0, (unsigned int *)active);
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t d, unsigned int link, nvmlNvLinkErrorCounter_t c, unsigned long long *v) {
	return dev_u64(d, SIM_OP_NVLINK_ERRORS, link, (unsigned int)c, v);
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t d, int count, nvmlFieldValue_t *values) {
	if (count < 0 || (count > 0 && !values))
		return NVML_ERROR_INVALID_ARGUMENT;
	for (int i = 0; i < count; i++) {
		struct sim_resp r;
		nvmlReturn_t ret = dev_call(d, SIM_OP_FIELD, values[i].fieldId, values[i].scopeId, &r);
		if (ret == NVML_ERROR_UNINITIALIZED || ret == NVML_ERROR_INVALID_ARGUMENT || ret == NVML_ERROR_UNKNOWN)
			return ret;
		values[i].nvmlReturn = ret;
		values[i].timestamp = (long long)r.v[2];
		values[i].latencyUsec = 0;
		values[i].valueType = (nvmlValueType_t)r.v[1];
		values[i].value.ullVal = r.v[0];
	}
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t d, nvmlGpuFabricInfo_t *f) {
	struct sim_resp r;
	if (!f)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_FABRIC, 0, 0, &r);
	if (ret == NVML_SUCCESS) {
		memset(f, 0, sizeof *f);
		f->state = (nvmlGpuFabricState_t)r.v[0];
		f->status = (nvmlReturn_t)r.v[1];
		f->cliqueId = (unsigned int)r.v[2];
		memcpy(f->clusterUuid, r.s, NVML_GPU_FABRIC_UUID_LEN);
	}
	return ret;
}

/* 550's versioned call: nvmlGpuFabricInfo_v2 adds the version before and the health mask after;
 * _v3 also the health summary, after them (v2 is a prefix of v3). Any other version is refused,
 * as NVML refuses it. The simulator answers the mask in v[3] and the summary in v[4]. */
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t d, nvmlGpuFabricInfoV_t *f) {
	struct sim_resp r;
	if (!f)
		return NVML_ERROR_INVALID_ARGUMENT;
	unsigned int version = f->version;
	if (version != nvmlGpuFabricInfo_v2 && version != nvmlGpuFabricInfo_v3)
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	nvmlReturn_t ret = dev_call(d, SIM_OP_FABRIC, 0, 0, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	nvmlGpuFabricInfo_v3_t full;
	memset(&full, 0, sizeof full);
	full.version = version;
	full.state = (nvmlGpuFabricState_t)r.v[0];
	full.status = (nvmlReturn_t)r.v[1];
	full.cliqueId = (unsigned int)r.v[2];
	memcpy(full.clusterUuid, r.s, NVML_GPU_FABRIC_UUID_LEN);
	full.healthMask = (unsigned int)r.v[3];
	full.healthSummary = (unsigned char)r.v[4];
	memcpy(f, &full, version == nvmlGpuFabricInfo_v2 ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof full);
	return NVML_SUCCESS;
}

/* --- MIG ----------------------------------------------------------------------------------- */

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
	struct sim_resp r;
	if (!current || !pending)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_call(d, SIM_OP_MIG_MODE, 0, 0, &r);
	if (ret == NVML_SUCCESS)
		*current = (unsigned)r.v[0], *pending = (unsigned)r.v[1];
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *n) { return dev_u32(d, SIM_OP_MIG_MAX, 0, 0, n); }

EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
	unsigned int wire;
	if (!mig)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = dev_u32(d, SIM_OP_MIG_HANDLE, index, 0, &wire);
	if (ret == NVML_SUCCESS) {
		if (wire >= MAX_GPUS * SIM_MIG_SLOTS)
			return NVML_ERROR_UNKNOWN;
		mig->handle = &devices[wire];
	}
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) { return dev_u32(d, SIM_OP_MIG_IDS, 0, 0, id); }
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) { return dev_u32(d, SIM_OP_MIG_IDS, 1, 0, id); }

EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *isMig) {
	unsigned int wire;
	if (!isMig || !wire_of(d, &wire))
		return NVML_ERROR_INVALID_ARGUMENT;
	*isMig = wire % SIM_MIG_SLOTS != 0;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t mig, nvmlDevice_t *d) {
	unsigned int wire;
	if (!d || !wire_of(mig, &wire) || wire % SIM_MIG_SLOTS == 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	d->handle = &devices[wire - wire % SIM_MIG_SLOTS];
	return NVML_SUCCESS;
}

/* --- Events -------------------------------------------------------------------------------- */

static int set_id(nvmlEventSet_t set, unsigned int *id) {
	if (!set.handle || set.handle->magic != SET_MAGIC)
		return 0;
	*id = set.handle->id;
	return 1;
}

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
	struct sim_req req = {.op = SIM_OP_EVENTSET_CREATE};
	struct sim_resp r;
	if (!set)
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = call(&req, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	struct nvmlEventSet_st *s = malloc(sizeof *s);
	if (!s)
		return NVML_ERROR_MEMORY;
	s->magic = SET_MAGIC;
	s->id = (unsigned int)r.v[0];
	set->handle = s;
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
	struct sim_req req = {.op = SIM_OP_EVENTSET_FREE};
	struct sim_resp r;
	if (!set_id(set, &req.a))
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = call(&req, &r);
	set.handle->magic = 0;
	free(set.handle);
	return ret;
}

EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
	struct sim_req req = {.op = SIM_OP_REGISTER_EVENTS, .c = types};
	struct sim_resp r;
	if (!wire_of(d, &req.dev) || !set_id(set, &req.a))
		return NVML_ERROR_INVALID_ARGUMENT;
	return call(&req, &r);
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
	return dev_u64(d, SIM_OP_SUPPORTED_EVENTS, 0, 0, types);
}

/* wait asks for the next event of set; full says whether data has the GPU and compute instance
 * IDs (32 bytes, _v2) or ends after eventData (24 bytes, the unversioned function). */
static nvmlReturn_t wait_event(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms, int full) {
	struct sim_req req = {.op = SIM_OP_EVENTSET_WAIT, .b = timeoutms};
	struct sim_resp r;
	if (!data || !set_id(set, &req.a))
		return NVML_ERROR_INVALID_ARGUMENT;
	nvmlReturn_t ret = call(&req, &r);
	if (ret != NVML_SUCCESS)
		return ret;
	if (r.v[0] >= MAX_GPUS * SIM_MIG_SLOTS)
		return NVML_ERROR_UNKNOWN;
	data->device.handle = &devices[r.v[0]];
	data->eventType = r.v[1];
	data->eventData = r.v[2];
	if (full) {
		data->gpuInstanceId = (unsigned int)r.v[3];
		data->computeInstanceId = (unsigned int)r.v[4];
	}
	return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int t) { return wait_event(set, data, t, 0); }
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int t) { return wait_event(set, data, t, 1); }

/* --- Small answers consumers ask for at start ------------------------------------------------ */

EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t d, nvmlEnableState_t *mode) {
	unsigned int wire;
	if (!mode || !wire_of(d, &wire))
		return NVML_ERROR_INVALID_ARGUMENT;
	*mode = NVML_FEATURE_ENABLED;
	return initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t d, nvmlComputeMode_t *mode) {
	unsigned int wire;
	if (!mode || !wire_of(d, &wire))
		return NVML_ERROR_INVALID_ARGUMENT;
	*mode = NVML_COMPUTEMODE_DEFAULT;
	return initialised() ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
}

/* --- nvidia-smi's private table ------------------------------------------------------------
 * nvidia-smi checks that it runs with its own driver's library through an undocumented export,
 * nvmlInternalGetExportTable(table, guid), and fails with "Mismatch in versions between
 * nvidia-smi and NVML" without it. What is known of it (NVIDIA's k8s-test-infra mock recovered
 * it; facts, observed with nvidia-smi 580): for the GUID 6c3efec4-8fc9-4e6c-a327-ee696e12f7c4 it
 * answers a table of function pointers whose first word is the table's size (more than 648
 * bytes). nvidia-smi takes device handles through one entry, called (index, nvmlDevice_t *out,
 * 0x22), and resets a GPU through entry 20, called with the device. Everything else answered
 * SUCCESS, with nothing written, keeps it going. Each entry here is a trampoline that knows its
 * slot, so the simulator can log which ones run. */

#define TABLE_SLOTS 256
#define TABLE_SLOT_GPU_RESET 20 /* called with the device by --gpu-reset (seen on 550 and 580) */
static const unsigned char smi_guid[16] = {0xc4, 0xfe, 0x3e, 0x6c, 0xc9, 0x8f, 0x6c, 0x4e,
					   0xa3, 0x27, 0xee, 0x69, 0x6e, 0x12, 0xf7, 0xc4};

static int is_device(void *p) {
	unsigned int wire;
	nvmlDevice_t d = {.handle = p};
	return wire_of(d, &wire);
}

static nvmlReturn_t table_entry(unsigned int slot, void *a0, void *a1, void *a2) {
	static unsigned char seen[TABLE_SLOTS];
	if (!seen[slot]) {
		char name[64];
		seen[slot] = 1;
		snprintf(name, sizeof name, "nvmlInternalGetExportTable[%u]", slot);
		struct sim_req req = {.op = SIM_OP_UNSUPPORTED};
		struct sim_resp resp;
		snprintf(req.s, sizeof req.s, "%s", name);
		if (initialised())
			call_or(&req, &resp, NVML_SUCCESS);
	}
	if ((uintptr_t)a2 == 0x22 && (uintptr_t)a0 < MAX_GPUS && a1)
		return by_index((unsigned int)(uintptr_t)a0, (nvmlDevice_t *)a1);
	if (slot == TABLE_SLOT_GPU_RESET && is_device(a0)) {
		/* nvidia-smi --gpu-reset: the simulator resets the GPU, or refuses while another
		 * process holds it ("In use by another client"). */
		struct sim_req req = {.op = SIM_OP_RESET};
		struct sim_resp resp;
		nvmlDevice_t d = {.handle = a0};
		if (!wire_of(d, &req.dev))
			return NVML_ERROR_INVALID_ARGUMENT;
		return call(&req, &resp);
	}
	/* Nothing is written through the arguments of the other entries: their shapes differ by
	 * slot and by driver branch, and a write through one that is not a count pointer ends
	 * nvidia-smi with SIGSEGV (seen with --gpu-reset on 550). */
	(void)a1;
	return NVML_SUCCESS;
}

#define SLOT(n) \
	static nvmlReturn_t slot_##n(void *a0, void *a1, void *a2) { return table_entry(n, a0, a1, a2); }
#define SLOTS16(h)                                                                                   \
	SLOT(h##0) SLOT(h##1) SLOT(h##2) SLOT(h##3) SLOT(h##4) SLOT(h##5) SLOT(h##6) SLOT(h##7) SLOT(h##8) \
	SLOT(h##9) SLOT(h##a) SLOT(h##b) SLOT(h##c) SLOT(h##d) SLOT(h##e) SLOT(h##f)
#define ADDR16(h)                                                                                     \
	(void *)slot_##h##0, (void *)slot_##h##1, (void *)slot_##h##2, (void *)slot_##h##3, (void *)slot_##h##4, \
	(void *)slot_##h##5, (void *)slot_##h##6, (void *)slot_##h##7, (void *)slot_##h##8, (void *)slot_##h##9, \
	(void *)slot_##h##a, (void *)slot_##h##b, (void *)slot_##h##c, (void *)slot_##h##d, (void *)slot_##h##e, \
	(void *)slot_##h##f
SLOTS16(0x0) SLOTS16(0x1) SLOTS16(0x2) SLOTS16(0x3) SLOTS16(0x4) SLOTS16(0x5) SLOTS16(0x6) SLOTS16(0x7)
SLOTS16(0x8) SLOTS16(0x9) SLOTS16(0xa) SLOTS16(0xb) SLOTS16(0xc) SLOTS16(0xd) SLOTS16(0xe) SLOTS16(0xf)
static void *export_table[TABLE_SLOTS] = {ADDR16(0x0), ADDR16(0x1), ADDR16(0x2), ADDR16(0x3), ADDR16(0x4), ADDR16(0x5),
					  ADDR16(0x6), ADDR16(0x7), ADDR16(0x8), ADDR16(0x9), ADDR16(0xa), ADDR16(0xb),
					  ADDR16(0xc), ADDR16(0xd), ADDR16(0xe), ADDR16(0xf)};

EXPORT nvmlReturn_t nvmlInternalGetExportTable(const void **table, const unsigned char *guid) {
	if (!table || !guid)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (memcmp(guid, smi_guid, sizeof smi_guid) != 0)
		return NVML_ERROR_NOT_SUPPORTED;
	export_table[0] = (void *)(uintptr_t)(TABLE_SLOTS * sizeof(void *));
	*table = export_table;
	return NVML_SUCCESS;
}
