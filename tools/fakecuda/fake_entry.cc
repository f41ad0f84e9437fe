// The fake CUDA driver (libcuda.so.1), its start: initialization, devices (CUDA_VISIBLE_DEVICES), error
// strings and cuGetProcAddress (both signatures), which resolves names by version and per-thread-stream flag
// as the real driver does. The other API families are in fake_context.cc, fake_memory.cc, fake_pools.cc,
// fake_launch.cc and fake_graph.cc; what they share is fake_cuda.h.
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "fake_cuda.h"
#include "hook/common/base.h"

using namespace fakecuda;  // NOLINT: the driver's internals (fake_cuda.h)

namespace fakecuda {

std::mutex g_mu;
bool g_initialized = false;
int g_visible[kMaxGpus];
int g_visible_count = 0;
Ctx* g_primary[kMaxGpus] = {};
std::unordered_map<uint64_t, Alloc>* g_allocs = nullptr;
std::unordered_map<uint64_t, int>* g_handle_refs = nullptr;
std::unordered_map<uint64_t, Mapping>* g_mappings = nullptr;
uint64_t g_next_va = 0x200000000ull;
uint64_t g_next_low_va = 0x10000000ull;
thread_local Ctx* t_ctx = nullptr;
thread_local std::vector<Ctx*>* t_stack = nullptr;

bool ValidDevice(CUdevice d) {
  return d >= 0 && d < g_visible_count;
}

}  // namespace fakecuda

namespace {

void ParseVisible(State* s) {
  const char* v = getenv("CUDA_VISIBLE_DEVICES");
  g_visible_count = 0;
  if (v == nullptr) {
    for (uint32_t i = 0; i < s->gpu_count; ++i) g_visible[g_visible_count++] = static_cast<int>(i);
    return;
  }
  const char* p = v;
  while (*p != 0 && g_visible_count < fakecuda::kMaxGpus) {
    const char* comma = strchr(p, ',');
    const size_t len = comma != nullptr ? static_cast<size_t>(comma - p) : strlen(p);
    int found = -1;
    if (len > 0 && p[0] >= '0' && p[0] <= '9') {
      const int idx = atoi(p);
      if (idx >= 0 && idx < static_cast<int>(s->gpu_count)) found = idx;
    } else if (len >= 4) {
      for (uint32_t i = 0; i < s->gpu_count; ++i) {
        if (strncmp(s->gpus[i].uuid, p, len) == 0) found = static_cast<int>(i);
      }
    }
    if (found < 0) break;  // the driver stops at the first entry that names no GPU
    g_visible[g_visible_count++] = found;
    if (comma == nullptr) break;
    p = comma + 1;
  }
}

}  // namespace

// --- Initialization, devices
// -------------------------------------------------------------------------------------

// Every entry point that writes through a pointer refuses a null one with CUDA_ERROR_INVALID_VALUE before
// doing anything, as the real driver does (a tenant's cuMemAlloc(NULL, n) used to crash the fake, so tests
// could not show what the hook does with it). The NVML fake does the same with NVML_ERROR_INVALID_ARGUMENT.
FAKE_EXPORT CUresult cuInit(unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) {
    ParseVisible(Shared());
    g_initialized = true;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDriverGetVersion(int* v) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = g_visible_count;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= g_visible_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  strncpy(name, Shared()->gpus[g_visible[d]].name, static_cast<size_t>(len));
  if (len > 0) name[len - 1] = 0;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice d) {
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  // Parse "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes.
  const char* u = Shared()->gpus[g_visible[d]].uuid + 4;
  int b = 0;
  for (const char* p = u; *p != 0 && b < 16;) {
    if (*p == '-') {
      ++p;
      continue;
    }
    char hex[3] = {p[0], p[1], 0};
    uuid->bytes[b++] = static_cast<char>(strtol(hex, nullptr, 16));
    p += 2;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice d) {
  if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuDeviceGetUuid_v2(uuid, d);
}
FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = Shared()->gpus[g_visible[d]].total_bytes;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice d) {
  if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t b = 0;
  const CUresult r = cuDeviceTotalMem_v2(&b, d);
  *bytes = static_cast<unsigned>(b > 0xffffffffu ? 0xffffffffu : b);
  return r;
}
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 1;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult r, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *s = r == CUDA_SUCCESS ? "no error" : r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake error";
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorName(CUresult r, const char** s) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *s = r == CUDA_SUCCESS               ? "CUDA_SUCCESS"
       : r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY"
                                       : "CUDA_ERROR";
  return CUDA_SUCCESS;
}

// --- cuGetProcAddress: by name, version and stream semantics, as the real driver resolves
// ---------------------------

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags);
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status);

namespace {
struct ProcEntry {
  const char* base;
  int version;
  int ptsz;
  void* fn;
};
#define P(base, version, ptsz, sym) \
  { #base, version, ptsz, reinterpret_cast < void*>(&sym) }
const ProcEntry kProcs[] = {
    P(cuInit, 2000, 0, cuInit),
    P(cuDriverGetVersion, 2020, 0, cuDriverGetVersion),
    P(cuDeviceGetCount, 2000, 0, cuDeviceGetCount),
    P(cuDeviceGet, 2000, 0, cuDeviceGet),
    P(cuDeviceGetName, 2000, 0, cuDeviceGetName),
    P(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid),
    P(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2),
    P(cuDeviceTotalMem, 2000, 0, cuDeviceTotalMem),
    P(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2),
    P(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute),
    P(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 7000, 0, cuDevicePrimaryCtxRelease),
    P(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2),
    P(cuDevicePrimaryCtxReset, 7000, 0, cuDevicePrimaryCtxReset),
    P(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2),
    P(cuCtxCreate, 2000, 0, cuCtxCreate),
    P(cuCtxCreate, 3020, 0, cuCtxCreate_v2),
    P(cuCtxCreate, 11040, 0, cuCtxCreate_v3),
    P(cuCtxCreate, 12050, 0, cuCtxCreate_v4),
    P(cuCtxDestroy, 2000, 0, cuCtxDestroy),
    P(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2),
    P(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent),
    P(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent),
    P(cuCtxGetDevice, 2000, 0, cuCtxGetDevice),
    P(cuCtxGetDevice, 13000, 0, cuCtxGetDevice_v2),
    P(cuCtxSynchronize, 13000, 0, cuCtxSynchronize_v2),
    P(cuCtxSetLimit, 3010, 0, cuCtxSetLimit),
    P(cuModuleLoad, 2000, 0, cuModuleLoad),
    P(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx),
    P(cuModuleLoadFatBinary, 2000, 0, cuModuleLoadFatBinary),
    P(cuLibraryLoadData, 12000, 0, cuLibraryLoadData),
    P(cuLibraryLoadFromFile, 12000, 0, cuLibraryLoadFromFile),
    P(cuLibraryUnload, 12000, 0, cuLibraryUnload),
    P(cuGreenCtxCreate, 12040, 0, cuGreenCtxCreate),
    P(cuGreenCtxDestroy, 12040, 0, cuGreenCtxDestroy),
    P(cuThreadExchangeStreamCaptureMode, 10010, 0, cuThreadExchangeStreamCaptureMode),
    P(cuStreamBeginCaptureToGraph, 12030, 0, cuStreamBeginCaptureToGraph),
    P(cuStreamBeginCaptureToGraph, 12030, 1, cuStreamBeginCaptureToGraph_ptsz),
    P(cuStreamIsCapturing, 10000, 1, cuStreamIsCapturing_ptsz),
    P(cuCtxSynchronize, 2000, 0, cuCtxSynchronize),
    P(cuMemGetInfo, 2000, 0, cuMemGetInfo),
    P(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2),
    P(cuMemAlloc, 2000, 0, cuMemAlloc),
    P(cuMemAlloc, 3020, 0, cuMemAlloc_v2),
    P(cuMemAllocPitch, 2000, 0, cuMemAllocPitch),
    P(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2),
    P(cuMemAllocManaged, 6000, 0, cuMemAllocManaged),
    P(cuMemFree, 2000, 0, cuMemFree),
    P(cuMemFree, 3020, 0, cuMemFree_v2),
    P(cuMemCreate, 10020, 0, cuMemCreate),
    P(cuMemRelease, 10020, 0, cuMemRelease),
    P(cuMemMap, 10020, 0, cuMemMap),
    P(cuMemUnmap, 10020, 0, cuMemUnmap),
    P(cuMemAddressReserve, 10020, 0, cuMemAddressReserve),
    P(cuMemAddressFree, 10020, 0, cuMemAddressFree),
    P(cuMemAllocAsync, 11020, 0, cuMemAllocAsync),
    P(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz),
    P(cuMemFreeAsync, 11020, 0, cuMemFreeAsync),
    P(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz),
    P(cuModuleLoadData, 2000, 0, cuModuleLoadData),
    P(cuModuleGetFunction, 2000, 0, cuModuleGetFunction),
    P(cuStreamCreate, 2000, 0, cuStreamCreate),
    P(cuStreamSynchronize, 2000, 0, cuStreamSynchronize),
    P(cuEventCreate, 2000, 0, cuEventCreate),
    P(cuEventRecord, 2000, 0, cuEventRecord),
    P(cuEventQuery, 2000, 0, cuEventQuery),
    P(cuEventElapsedTime, 2000, 0, cuEventElapsedTime),
    P(cuEventDestroy, 4000, 0, cuEventDestroy_v2),
    P(cuLaunchKernel, 4000, 0, cuLaunchKernel),
    P(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz),
    P(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx),
    P(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz),
    P(cuGraphLaunch, 10000, 0, cuGraphLaunch),
    P(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz),
    P(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2),
    P(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2),
    P(cuMemAllocHost, 3020, 0, cuMemAllocHost_v2),
    P(cuMemFreeHost, 2000, 0, cuMemFreeHost),
    P(cuArrayCreate, 2000, 0, cuArrayCreate),
    P(cuArrayCreate, 3020, 0, cuArrayCreate_v2),
    P(cuArray3DCreate, 2000, 0, cuArray3DCreate),
    P(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2),
    P(cuArrayDestroy, 2000, 0, cuArrayDestroy),
    P(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate),
    P(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy),
    P(cuMemGetAllocationGranularity, 10020, 0, cuMemGetAllocationGranularity),
    P(cuMemSetAccess, 10020, 0, cuMemSetAccess),
    P(cuMemRetainAllocationHandle, 11000, 0, cuMemRetainAllocationHandle),
    P(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync),
    P(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz),
    P(cuMemPoolCreate, 11020, 0, cuMemPoolCreate),
    P(cuMemPoolTrimTo, 11020, 0, cuMemPoolTrimTo),
    P(cuMemPoolSetAttribute, 11020, 0, cuMemPoolSetAttribute),
    P(cuMemPoolGetAttribute, 11020, 0, cuMemPoolGetAttribute),
    P(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool),
    P(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool),
    P(cuDeviceSetMemPool, 11020, 0, cuDeviceSetMemPool),
    P(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz),
    P(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy),
    P(cuModuleUnload, 2000, 0, cuModuleUnload),
    P(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2),
    P(cuStreamIsCapturing, 10000, 0, cuStreamIsCapturing),
    P(cuEventSynchronize, 2000, 0, cuEventSynchronize),
    P(cuEventElapsedTime, 12080, 0, cuEventElapsedTime_v2),
    P(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel),
    P(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz),
    P(cuGraphCreate, 10000, 0, cuGraphCreate),
    P(cuGraphAddKernelNode, 12000, 0, cuGraphAddKernelNode_v2),
    P(cuGraphAddMemAllocNode, 11040, 0, cuGraphAddMemAllocNode),
    P(cuGraphAddMemFreeNode, 11040, 0, cuGraphAddMemFreeNode),
    P(cuGraphAddNode, 12020, 0, cuGraphAddNode),
    P(cuGraphAddNode, 12030, 0, cuGraphAddNode_v2),
    P(cuGraphGetNodes, 10000, 0, cuGraphGetNodes),
    P(cuGraphNodeGetType, 10000, 0, cuGraphNodeGetType),
    P(cuGraphMemAllocNodeGetParams, 11040, 0, cuGraphMemAllocNodeGetParams),
    P(cuDeviceGraphMemTrim, 11040, 0, cuDeviceGraphMemTrim),
    P(cuDeviceGetGraphMemAttribute, 11040, 0, cuDeviceGetGraphMemAttribute),
    P(cuMemPrefetchAsync, 8000, 0, cuMemPrefetchAsync),
    P(cuMemPrefetchAsync, 8000, 1, cuMemPrefetchAsync_ptsz),
    P(cuMemPrefetchAsync, 12020, 0, cuMemPrefetchAsync_v2),
    P(cuMemPrefetchAsync, 12020, 1, cuMemPrefetchAsync_v2_ptsz),
    P(cuMemPrefetchBatchAsync, 13000, 0, cuMemPrefetchBatchAsync),
    P(cuMemPrefetchBatchAsync, 13000, 1, cuMemPrefetchBatchAsync_ptsz),
    P(cuMemDiscardAndPrefetchBatchAsync, 13000, 0, cuMemDiscardAndPrefetchBatchAsync),
    P(cuMemDiscardAndPrefetchBatchAsync, 13000, 1, cuMemDiscardAndPrefetchBatchAsync_ptsz),
    P(cuMemAdvise, 8000, 0, cuMemAdvise),
    P(cuMemAdvise, 12020, 0, cuMemAdvise_v2),
    P(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags),
    P(cuGraphInstantiateWithParams, 12000, 0, cuGraphInstantiateWithParams),
    P(cuGraphInstantiateWithParams, 12000, 1, cuGraphInstantiateWithParams_ptsz),
    P(cuGraphInstantiate, 12000, 0, cuGraphInstantiateWithFlags),
    P(cuEventSynchronize, 2000, 0, cuEventSynchronize),
    P(cuStreamSynchronize, 2000, 0, cuStreamSynchronize),
    P(cuGraphExecDestroy, 10000, 0, cuGraphExecDestroy),
    P(cuGraphDestroy, 10000, 0, cuGraphDestroy),
    P(cuStreamBeginCapture, 10000, 0, cuStreamBeginCapture),
    P(cuStreamBeginCapture, 10000, 1, cuStreamBeginCapture_ptsz),
    P(cuStreamBeginCapture, 10010, 0, cuStreamBeginCapture_v2),
    P(cuStreamBeginCapture, 10010, 1, cuStreamBeginCapture_v2_ptsz),
    P(cuStreamEndCapture, 10000, 0, cuStreamEndCapture),
    P(cuStreamEndCapture, 10000, 1, cuStreamEndCapture_ptsz),
    P(cuGetErrorString, 6000, 0, cuGetErrorString),
    P(cuGetErrorName, 6000, 0, cuGetErrorName),
    P(cuGetProcAddress, 11030, 0, cuGetProcAddress),
    P(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2),
};
#undef P

CUresult Resolve(const char* symbol, void** pfn, int version, cuuint64_t flags,
                 CUdriverProcAddressQueryResult* st) {
  const int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? 1 : 0;
  const ProcEntry* best = nullptr;
  bool any = false;
  for (const ProcEntry& e : kProcs) {
    if (strcmp(e.base, symbol) != 0) continue;
    any = true;
    if (e.version > version) continue;
    if (best == nullptr || (e.ptsz == want_ptsz && best->ptsz != want_ptsz) ||
        (e.ptsz == best->ptsz && e.version > best->version)) {
      if (best != nullptr && best->ptsz == want_ptsz && e.ptsz != want_ptsz) continue;
      best = &e;
    }
  }
  if (best == nullptr) {
    *pfn = nullptr;
    if (st != nullptr)
      *st = any ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (st != nullptr) *st = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Resolve(symbol, pfn, version, flags, nullptr);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status) {
  if (symbol == nullptr || pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return Resolve(symbol, pfn, version, flags, status);
}

// Every entry point the hook intercepts or calls has, in the fake, exactly the type the hook expects.
#define TS_HOOK(sym, pfn, base, version, ptsz) static_assert(std::is_same_v<decltype(&sym), pfn>, #sym);
#include "hook/cuda/cuda_hooks.def"
#undef TS_HOOK
#define TS_REAL(sym, pfn) static_assert(std::is_same_v<decltype(&sym), pfn>, #sym);
#include "hook/cuda/cuda_real.def"
#undef TS_REAL
