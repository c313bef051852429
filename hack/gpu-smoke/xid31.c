// xid31 provokes one real XID 31 (GPU memory page fault, an application error) on GPU 0: it
// loads a one-thread kernel that stores to an unmapped GPU address and launches it. The kernel
// is PTX, compiled by the driver's own JIT, and libcuda.so.1 is opened at run time, so neither a
// CUDA toolkit nor CUDA headers are needed, only the driver. The launch fails (700, illegal
// address) and the driver logs "NVRM: Xid (PCI:...): 31, ..." and posts the XID event to NVML.
//
// Build: cc -O2 -o bin/xid31 hack/gpu-smoke/xid31.c -ldl
// Exit status: 0 when the kernel faulted as intended, 2 when the driver API is unusable here,
// 1 when the kernel did not fault.
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUmodule;
typedef void *CUfunction;

static const char ptx[] =
	".version 6.0\n"
	".target sm_50\n"
	".address_size 64\n"
	".visible .entry fault()\n"
	"{\n"
	"  .reg .b64 %rd<2>;\n"
	"  .reg .b32 %r<2>;\n"
	"  mov.u64 %rd1, 0xdead00000000;\n" // far outside any allocation
	"  mov.u32 %r1, 31;\n"
	"  st.global.u32 [%rd1], %r1;\n"
	"  ret;\n"
	"}\n";

#define LOAD(name)                                                     \
	name = dlsym(lib, #name);                                      \
	if (!name) {                                                   \
		fprintf(stderr, "xid31: libcuda.so.1 lacks %s\n", #name); \
		return 2;                                              \
	}

int main(void) {
	void *lib = dlopen("libcuda.so.1", RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "xid31: cannot open libcuda.so.1: %s\n", dlerror());
		return 2;
	}
	CUresult (*cuInit)(unsigned);
	CUresult (*cuDeviceGet)(CUdevice *, int);
	CUresult (*cuCtxCreate_v2)(CUcontext *, unsigned, CUdevice);
	CUresult (*cuModuleLoadData)(CUmodule *, const void *);
	CUresult (*cuModuleGetFunction)(CUfunction *, CUmodule, const char *);
	CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
				   unsigned, void *, void **, void **);
	CUresult (*cuCtxSynchronize)(void);
	LOAD(cuInit) LOAD(cuDeviceGet) LOAD(cuCtxCreate_v2) LOAD(cuModuleLoadData)
	LOAD(cuModuleGetFunction) LOAD(cuLaunchKernel) LOAD(cuCtxSynchronize)

	CUdevice dev;
	CUcontext ctx;
	CUmodule mod;
	CUfunction fn;
	CUresult r;
	if ((r = cuInit(0)) || (r = cuDeviceGet(&dev, 0)) || (r = cuCtxCreate_v2(&ctx, 0, dev))) {
		fprintf(stderr, "xid31: CUDA init failed: %d\n", r);
		return 2;
	}
	if ((r = cuModuleLoadData(&mod, ptx)) || (r = cuModuleGetFunction(&fn, mod, "fault"))) {
		fprintf(stderr, "xid31: loading the PTX failed: %d\n", r);
		return 2;
	}
	r = cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
	if (!r)
		r = cuCtxSynchronize();
	printf("xid31: kernel finished with CUDA error %d (700 = illegal address: the fault happened)\n", r);
	return r == 700 ? 0 : 1;
}
