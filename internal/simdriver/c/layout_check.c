/*
 * TestLayouts' consumer: loads a simulated libnvidia-ml.so.1 (argv[1]) as a C program would and
 * checks that every versioned variant writes its own struct layout and no byte past it: the
 * unversioned nvmlDeviceGetPciInfo the pre-v2 52-byte nvmlPciInfo_t, the
 * unversioned nvmlEventSetWait the 24-byte nvmlEventData_t of old callers (Volcano's bindings),
 * _v2 the 32-byte one with the MIG instance IDs; the versioned fabric and SRAM ECC status calls
 * the layout their version field names. Between registering and waiting it prints
 * "registered" and reads a line, so that the test injects the events.
 */
#define NVML_NO_UNVERSIONED_FUNC_DEFS
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nvml.h"

#define CANARY 0xAB
#define FAIL(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)

static void *lib;
static void *sym(const char *name) {
	void *p = dlsym(lib, name);
	if (!p)
		FAIL("missing %s", name);
	return p;
}

static void canary_intact(const unsigned char *buf, size_t from, size_t to, const char *what) {
	for (size_t i = from; i < to; i++)
		if (buf[i] != CANARY)
			FAIL("%s wrote byte %zu, past its %zu-byte struct", what, i, from);
}

int main(int argc, char **argv) {
	if (argc != 2)
		FAIL("usage: layout_check LIBRARY");
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib)
		FAIL("dlopen: %s", dlerror());
	nvmlReturn_t (*init)(void) = sym("nvmlInit_v2");
	nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t *) = sym("nvmlDeviceGetHandleByIndex_v2");
	nvmlReturn_t (*pci_v1)(nvmlDevice_t, void *) = sym("nvmlDeviceGetPciInfo");
	nvmlReturn_t (*pci_v3)(nvmlDevice_t, nvmlPciInfo_t *) = sym("nvmlDeviceGetPciInfo_v3");
	nvmlReturn_t (*create)(nvmlEventSet_t *) = sym("nvmlEventSetCreate");
	nvmlReturn_t (*reg)(nvmlDevice_t, unsigned long long, nvmlEventSet_t) = sym("nvmlDeviceRegisterEvents");
	nvmlReturn_t (*wait_v1)(nvmlEventSet_t, void *, unsigned int) = sym("nvmlEventSetWait");
	nvmlReturn_t (*wait_v2)(nvmlEventSet_t, nvmlEventData_t *, unsigned int) = sym("nvmlEventSetWait_v2");
	nvmlReturn_t (*uuid)(nvmlDevice_t, char *, unsigned int) = sym("nvmlDeviceGetUUID");

	nvmlReturn_t ret;
	if ((ret = init()) != NVML_SUCCESS)
		FAIL("nvmlInit_v2: %d", ret);
	nvmlDevice_t dev;
	if ((ret = by_index(0, &dev)) != NVML_SUCCESS)
		FAIL("handle: %d", ret);

	char small[8];
	if ((ret = uuid(dev, small, sizeof small)) != NVML_ERROR_INSUFFICIENT_SIZE)
		FAIL("nvmlDeviceGetUUID into 8 bytes: %d, want INSUFFICIENT_SIZE", ret);

	unsigned char buf[256];
	memset(buf, CANARY, sizeof buf);
	if ((ret = pci_v1(dev, buf)) != NVML_SUCCESS)
		FAIL("nvmlDeviceGetPciInfo: %d", ret);
	canary_intact(buf, 52, sizeof buf, "nvmlDeviceGetPciInfo");
	if (strcmp((char *)buf, "0000:10:00.0") != 0)
		FAIL("nvmlDeviceGetPciInfo busId %s", buf);

	memset(buf, CANARY, sizeof buf);
	if ((ret = pci_v3(dev, (nvmlPciInfo_t *)buf)) != NVML_SUCCESS)
		FAIL("nvmlDeviceGetPciInfo_v3: %d", ret);
	canary_intact(buf, sizeof(nvmlPciInfo_t), sizeof buf, "nvmlDeviceGetPciInfo_v3");
	nvmlPciInfo_t *p3 = (nvmlPciInfo_t *)buf;
	if (strcmp(p3->busId, "00000000:10:00.0") != 0 || strcmp(p3->busIdLegacy, "0000:10:00.0") != 0 || p3->bus != 0x10)
		FAIL("nvmlDeviceGetPciInfo_v3: %s %s %u", p3->busId, p3->busIdLegacy, p3->bus);

	/* 550 only: the versioned fabric call writes the layout its version field names. */
	nvmlReturn_t (*fabric_v)(nvmlDevice_t, void *) = dlsym(lib, "nvmlDeviceGetGpuFabricInfoV");
	if (fabric_v) {
		memset(buf, CANARY, sizeof buf);
		((nvmlGpuFabricInfo_v2_t *)buf)->version = nvmlGpuFabricInfo_v2;
		if ((ret = fabric_v(dev, buf)) != NVML_SUCCESS)
			FAIL("nvmlDeviceGetGpuFabricInfoV (v2): %d", ret);
		canary_intact(buf, sizeof(nvmlGpuFabricInfo_v2_t), sizeof buf, "nvmlDeviceGetGpuFabricInfoV (v2)");
		if (((nvmlGpuFabricInfo_v2_t *)buf)->state != NVML_GPU_FABRIC_STATE_IN_PROGRESS)
			FAIL("nvmlDeviceGetGpuFabricInfoV (v2): state %u", ((nvmlGpuFabricInfo_v2_t *)buf)->state);
		memset(buf, CANARY, sizeof buf);
		((nvmlGpuFabricInfo_v3_t *)buf)->version = nvmlGpuFabricInfo_v3;
		if ((ret = fabric_v(dev, buf)) != NVML_SUCCESS)
			FAIL("nvmlDeviceGetGpuFabricInfoV (v3): %d", ret);
		canary_intact(buf, sizeof(nvmlGpuFabricInfo_v3_t), sizeof buf, "nvmlDeviceGetGpuFabricInfoV (v3)");
		if (((nvmlGpuFabricInfo_v3_t *)buf)->healthSummary != NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
			FAIL("nvmlDeviceGetGpuFabricInfoV (v3): health summary %u", ((nvmlGpuFabricInfo_v3_t *)buf)->healthSummary);
		((nvmlGpuFabricInfo_v3_t *)buf)->version = 1;
		if ((ret = fabric_v(dev, buf)) != NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
			FAIL("nvmlDeviceGetGpuFabricInfoV with version 1: %d, want ARGUMENT_VERSION_MISMATCH", ret);
	}

	/* 535 and later: the SRAM ECC status writes nvmlEccSramErrorStatus_v1 and refuses another
	 * version. */
	nvmlReturn_t (*sram)(nvmlDevice_t, void *) = dlsym(lib, "nvmlDeviceGetSramEccErrorStatus");
	if (sram) {
		memset(buf, CANARY, sizeof buf);
		((nvmlEccSramErrorStatus_v1_t *)buf)->version = nvmlEccSramErrorStatus_v1;
		if ((ret = sram(dev, buf)) != NVML_SUCCESS)
			FAIL("nvmlDeviceGetSramEccErrorStatus: %d", ret);
		canary_intact(buf, sizeof(nvmlEccSramErrorStatus_v1_t), sizeof buf, "nvmlDeviceGetSramEccErrorStatus");
		if (((nvmlEccSramErrorStatus_v1_t *)buf)->bThresholdExceeded != 0)
			FAIL("nvmlDeviceGetSramEccErrorStatus: threshold exceeded %u", ((nvmlEccSramErrorStatus_v1_t *)buf)->bThresholdExceeded);
		((nvmlEccSramErrorStatus_v1_t *)buf)->version = nvmlEccSramErrorStatus_v1 + (1u << 24); /* a version 2 */
		if ((ret = sram(dev, buf)) != NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
			FAIL("nvmlDeviceGetSramEccErrorStatus with version 2: %d, want ARGUMENT_VERSION_MISMATCH", ret);
	}
	nvmlReturn_t (*histogram)(nvmlDevice_t, void *) = sym("nvmlDeviceGetRowRemapperHistogram");
	memset(buf, CANARY, sizeof buf);
	if ((ret = histogram(dev, buf)) != NVML_SUCCESS)
		FAIL("nvmlDeviceGetRowRemapperHistogram: %d", ret);
	canary_intact(buf, sizeof(nvmlRowRemapperHistogramValues_t), sizeof buf, "nvmlDeviceGetRowRemapperHistogram");

	nvmlEventSet_t set;
	if ((ret = create(&set)) != NVML_SUCCESS)
		FAIL("nvmlEventSetCreate: %d", ret);
	if ((ret = reg(dev, nvmlEventTypeXidCriticalError, set)) != NVML_SUCCESS)
		FAIL("nvmlDeviceRegisterEvents: %d", ret);
	if ((ret = wait_v1(set, buf, 1)) != NVML_ERROR_TIMEOUT)
		FAIL("nvmlEventSetWait with nothing queued: %d, want TIMEOUT", ret);
	printf("registered\n");
	fflush(stdout);
	char line[16];
	if (!fgets(line, sizeof line, stdin))
		FAIL("stdin closed");

	memset(buf, CANARY, sizeof buf);
	if ((ret = wait_v1(set, buf, 5000)) != NVML_SUCCESS)
		FAIL("nvmlEventSetWait: %d", ret);
	canary_intact(buf, 24, sizeof buf, "nvmlEventSetWait");
	unsigned long long type, data;
	memcpy(&type, buf + 8, 8);
	memcpy(&data, buf + 16, 8);
	if (type != nvmlEventTypeXidCriticalError || data != 79)
		FAIL("nvmlEventSetWait: type %llx data %llu", type, data);

	memset(buf, CANARY, sizeof buf);
	if ((ret = wait_v2(set, (nvmlEventData_t *)buf, 5000)) != NVML_SUCCESS)
		FAIL("nvmlEventSetWait_v2: %d", ret);
	canary_intact(buf, sizeof(nvmlEventData_t), sizeof buf, "nvmlEventSetWait_v2");
	nvmlEventData_t *e = (nvmlEventData_t *)buf;
	if (e->eventData != 94 || e->gpuInstanceId != 2 || e->computeInstanceId != 0xFFFFFFFF)
		FAIL("nvmlEventSetWait_v2: data %llu gi %u ci %u", e->eventData, e->gpuInstanceId, e->computeInstanceId);
	printf("ok\n");
	return 0;
}
