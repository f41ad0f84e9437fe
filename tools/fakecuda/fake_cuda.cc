// A fake CUDA driver (libcuda.so.1) for tests without a GPU: the driver API that libtessera-cuda.so and its
// tests use, over the simulated GPUs of fake_state.h. Kernels are "spin" kernels whose duration in
// nanoseconds is the first kernel parameter (a uint64_t); they occupy the simulated GPU for that long.
// Every versioned entry point the hook intercepts exists under its own name, and cuGetProcAddress (both
// signatures) resolves names by version and per-thread-stream flag as the real driver does.
#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "fake_state.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using fakecuda::Lock;
using fakecuda::NowNs;
using fakecuda::Shared;
using fakecuda::State;
using fakecuda::Unlock;

struct Stream {
  int gpu = 0;
  uint64_t last_end = 0;
};
struct Ctx {
  int gpu = 0;
  bool primary = false;
  int refs = 0;
  Stream default_stream;
};
struct Event {
  uint64_t ts = 0;
  bool recorded = false;
};
struct Function {
  char name[64];
};
struct Graph {
  uint64_t duration_ns = 0;
  std::vector<std::pair<CUdeviceptr, uint64_t>> allocations;
  int gpu = 0;
};
struct Alloc {
  uint64_t bytes;
  int gpu;
};

std::mutex g_mu;
bool g_initialized = false;
int g_visible[fakecuda::kMaxGpus];
int g_visible_count = 0;
Ctx* g_primary[fakecuda::kMaxGpus] = {};
std::unordered_map<uint64_t, Alloc>* g_allocs = nullptr;  // device pointers, arrays, VMM handles
uint64_t g_next_va = 0x200000000ull;
thread_local Ctx* t_ctx = nullptr;
thread_local std::vector<Ctx*>* t_stack = nullptr;

void SleepUntil(uint64_t t) {
  for (;;) {
    const uint64_t now = NowNs();
    if (now >= t) return;
    const uint64_t d = t - now;
    timespec ts{static_cast<time_t>(d / 1000000000ull), static_cast<long>(d % 1000000000ull)};
    nanosleep(&ts, nullptr);
  }
}

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

bool ValidDevice(CUdevice d) {
  return d >= 0 && d < g_visible_count;
}

Stream* StreamOf(CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY || s == CU_STREAM_PER_THREAD) {
    return t_ctx != nullptr ? &t_ctx->default_stream : nullptr;
  }
  return reinterpret_cast<Stream*>(s);
}

CUresult Charge(int gpu, int64_t bytes) {
  State* s = Shared();
  Lock(s);
  const bool ok = fakecuda::ChargeLocked(s, gpu, bytes);
  Unlock(s);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

CUresult AllocDevice(uint64_t bytes, int gpu, uint64_t* out) {
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = Charge(gpu, static_cast<int64_t>(bytes));
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_allocs == nullptr) g_allocs = new std::unordered_map<uint64_t, Alloc>();
  const uint64_t va = g_next_va;
  g_next_va += (bytes + (2ull << 20) - 1) / (2ull << 20) * (2ull << 20) + (2ull << 20);
  (*g_allocs)[va] = Alloc{bytes, gpu};
  *out = va;
  return CUDA_SUCCESS;
}

CUresult FreeDevice(uint64_t key) {
  Alloc a{0, 0};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_allocs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = g_allocs->find(key);
    if (it == g_allocs->end()) return CUDA_ERROR_INVALID_VALUE;
    a = it->second;
    g_allocs->erase(it);
  }
  return Charge(a.gpu, -static_cast<int64_t>(a.bytes));
}

int CurrentGpu() {
  return t_ctx != nullptr ? t_ctx->gpu : -1;
}

// Puts a kernel of `ns` on the stream's GPU timeline.
CUresult Submit(CUstream hs, uint64_t ns) {
  Stream* st = StreamOf(hs);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  State* s = Shared();
  fakecuda::Gpu& g = s->gpus[g_visible[st->gpu]];
  const uint64_t now = NowNs();
  Lock(s);
  uint64_t start = now;
  if (st->last_end > start) start = st->last_end;
  if (g.busy_until_ns > start) start = g.busy_until_ns;
  const uint64_t end = start + ns;
  if (ns > 0) {
    g.busy_until_ns = end;
    fakecuda::Kernel& k = g.ring[g.ring_head];
    k.start_ns = start;
    k.end_ns = end;
    k.pid = static_cast<uint32_t>(getpid());
    g.ring_head = (g.ring_head + 1) % fakecuda::kRing;
    if (g.ring_count < fakecuda::kRing) ++g.ring_count;
  }
  Unlock(s);
  st->last_end = ns > 0 ? end : (st->last_end > now ? st->last_end : now);
  return CUDA_SUCCESS;
}

uint64_t KernelNs(void** params) {
  if (params == nullptr || params[0] == nullptr) return 0;
  return *static_cast<uint64_t*>(params[0]);
}

CUresult NewContext(CUcontext* pctx, CUdevice dev, bool primary) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  State* s = Shared();
  const CUresult r = Charge(g_visible[dev], static_cast<int64_t>(s->context_bytes));
  if (r != CUDA_SUCCESS) return r;
  Ctx* c = new Ctx();
  c->gpu = dev;
  c->primary = primary;
  c->default_stream.gpu = dev;
  *pctx = reinterpret_cast<CUcontext>(c);
  return CUDA_SUCCESS;
}

void DeleteContext(Ctx* c) {
  Charge(g_visible[c->gpu], -static_cast<int64_t>(Shared()->context_bytes));
  if (t_ctx == c) t_ctx = nullptr;
  delete c;
}

}  // namespace

// --- Initialization, devices -------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuInit(unsigned int) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized) {
    ParseVisible(Shared());
    g_initialized = true;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDriverGetVersion(int* v) {
  *v = CUDA_VERSION;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetCount(int* n) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *n = g_visible_count;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= g_visible_count) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d) {
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  strncpy(name, Shared()->gpus[g_visible[d]].name, static_cast<size_t>(len));
  if (len > 0) name[len - 1] = 0;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid* uuid, CUdevice d) {
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
  return cuDeviceGetUuid_v2(uuid, d);
}
FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice d) {
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = Shared()->gpus[g_visible[d]].total_bytes;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceTotalMem(unsigned int* bytes, CUdevice d) {
  size_t b = 0;
  const CUresult r = cuDeviceTotalMem_v2(&b, d);
  *bytes = static_cast<unsigned>(b > 0xffffffffu ? 0xffffffffu : b);
  return r;
}
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (!ValidDevice(d)) return CUDA_ERROR_INVALID_DEVICE;
  *v = a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT ? 132 : 1;
  return CUDA_SUCCESS;
}

// --- Contexts ------------------------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (g_primary[dev] == nullptr) {
    CUcontext c = nullptr;
    const CUresult r = NewContext(&c, dev, true);
    if (r != CUDA_SUCCESS) return r;
    g_primary[dev] = reinterpret_cast<Ctx*>(c);
  }
  ++g_primary[dev]->refs;
  *pctx = reinterpret_cast<CUcontext>(g_primary[dev]);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!ValidDevice(dev) || g_primary[dev] == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (--g_primary[dev]->refs == 0) {
    DeleteContext(g_primary[dev]);
    g_primary[dev] = nullptr;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev) {
  return cuDevicePrimaryCtxRelease_v2(dev);
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return ValidDevice(dev) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev) {
  return cuDevicePrimaryCtxReset_v2(dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v2(CUcontext* pctx, unsigned int, CUdevice dev) {
  const CUresult r = NewContext(pctx, dev, false);
  if (r == CUDA_SUCCESS) t_ctx = reinterpret_cast<Ctx*>(*pctx);
  return r;
}
FAKE_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int flags, CUdevice dev) {
  return cuCtxCreate_v2(pctx, flags, dev);
}
FAKE_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx) {
  if (ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  DeleteContext(reinterpret_cast<Ctx*>(ctx));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxDestroy(CUcontext ctx) {
  return cuCtxDestroy_v2(ctx);
}
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  t_ctx = reinterpret_cast<Ctx*>(ctx);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = reinterpret_cast<CUcontext>(t_ctx);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
  if (t_stack == nullptr) t_stack = new std::vector<Ctx*>();
  t_stack->push_back(t_ctx);
  t_ctx = reinterpret_cast<Ctx*>(ctx);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
  if (ctx != nullptr) *ctx = reinterpret_cast<CUcontext>(t_ctx);
  if (t_stack == nullptr || t_stack->empty()) {
    t_ctx = nullptr;
    return CUDA_SUCCESS;
  }
  t_ctx = t_stack->back();
  t_stack->pop_back();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetDevice(CUdevice* dev) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = t_ctx->gpu;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSynchronize() {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  SleepUntil(Shared()->gpus[g_visible[t_ctx->gpu]].busy_until_ns);
  return CUDA_SUCCESS;
}

// --- Memory ----------------------------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  State* s = Shared();
  Lock(s);
  fakecuda::ReapDeadLocked(s);
  const fakecuda::Gpu& g = s->gpus[g_visible[t_ctx->gpu]];
  *free = g.total_bytes - g.used_bytes;
  *total = g.total_bytes;
  Unlock(s);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemGetInfo(unsigned int* free, unsigned int* total) {
  size_t f = 0;
  size_t t = 0;
  const CUresult r = cuMemGetInfo_v2(&f, &t);
  *free = static_cast<unsigned>(f > 0xffffffffu ? 0xffffffffu : f);
  *total = static_cast<unsigned>(t > 0xffffffffu ? 0xffffffffu : t);
  return r;
}
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytes, g_visible[t_ctx->gpu], &p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}
FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytes) {
  CUdeviceptr p = 0;
  const CUresult r = cuMemAlloc_v2(&p, bytes);
  if (r == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr_v1>(p);  // truncated, as the legacy ABI is
  return r;
}
FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t w, size_t h, unsigned int) {
  if (w == 0 || h == 0) return CUDA_ERROR_INVALID_VALUE;
  *pitch = (w + 511) / 512 * 512;
  return cuMemAlloc_v2(dptr, *pitch * h);
}
FAKE_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int w, unsigned int h,
                                     unsigned int e) {
  size_t p = 0;
  CUdeviceptr d = 0;
  const CUresult r = cuMemAllocPitch_v2(&d, &p, w, h, e);
  *pitch = static_cast<unsigned>(p);
  *dptr = static_cast<CUdeviceptr_v1>(d);
  return r;
}
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int) {
  return cuMemAlloc_v2(dptr, bytes);
}
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  return FreeDevice(p);
}
FAKE_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
  return FreeDevice(p);
}
FAKE_EXPORT CUresult cuMemAllocHost_v2(void** p, size_t bytes) {
  *p = malloc(bytes == 0 ? 1 : bytes);
  return *p != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  free(p);
  return CUDA_SUCCESS;
}

namespace {
uint64_t FakeArrayBytes(size_t w, size_t h, size_t d, unsigned ch) {
  return (w == 0 ? 1 : w) * (h == 0 ? 1 : h) * (d == 0 ? 1 : d) * (ch == 0 ? 1 : ch) * 4;
}
CUresult NewArray(uint64_t bytes, uint64_t* handle) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  return AllocDevice(bytes, g_visible[t_ctx->gpu], handle);
}
}  // namespace

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  uint64_t h = 0;
  const CUresult r = NewArray(FakeArrayBytes(d->Width, d->Height, 1, d->NumChannels), &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(h);
  return r;
}
FAKE_EXPORT CUresult cuArrayCreate(CUarray* a, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  CUDA_ARRAY_DESCRIPTOR d2{d->Width, d->Height, d->Format, d->NumChannels};
  return cuArrayCreate_v2(a, &d2);
}
FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  uint64_t h = 0;
  const CUresult r = NewArray(FakeArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels), &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(h);
  return r;
}
FAKE_EXPORT CUresult cuArray3DCreate(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  CUDA_ARRAY3D_DESCRIPTOR d2{d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
  return cuArray3DCreate_v2(a, &d2);
}
FAKE_EXPORT CUresult cuArrayDestroy(CUarray a) {
  return FreeDevice(reinterpret_cast<uint64_t>(a));
}
FAKE_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* d, unsigned int n) {
  uint64_t h = 0;
  const CUresult r = NewArray(FakeArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels) * 2 * (n > 0 ? 1 : 1), &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUmipmappedArray>(h);
  return r;
}
FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
  return FreeDevice(reinterpret_cast<uint64_t>(a));
}

// Virtual memory management: a handle is physical memory; mapping it costs nothing more.
FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*,
                                                   CUmemAllocationGranularity_flags) {
  *g = 2ull << 20;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size, const CUmemAllocationProp* prop,
                                 unsigned long long) {
  if (prop == nullptr || size == 0 || size % (2ull << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    *h = reinterpret_cast<CUmemGenericAllocationHandle>(malloc(1));
    return CUDA_SUCCESS;
  }
  if (!ValidDevice(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t k = 0;
  const CUresult r = AllocDevice(size, g_visible[prop->location.id], &k);
  if (r == CUDA_SUCCESS) *h = k;
  return r;
}
FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  return FreeDevice(h) == CUDA_SUCCESS ? CUDA_SUCCESS : CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr, unsigned long long) {
  std::lock_guard<std::mutex> lock(g_mu);
  *p = g_next_va;
  g_next_va += size + (2ull << 20);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemMap(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle*, void*) {
  return CUDA_ERROR_NOT_SUPPORTED;
}

// Stream-ordered allocation.
FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  *pool = reinterpret_cast<CUmemoryPool>(new int(props->location.id));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  delete reinterpret_cast<int*>(pool);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream) {
  return cuMemAlloc_v2(dptr, bytes);
}
FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream s) {
  return cuMemAllocAsync(dptr, bytes, s);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream) {
  const int dev = *reinterpret_cast<int*>(pool);
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytes, g_visible[dev], &p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
  return cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
}
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream) {
  return FreeDevice(p);
}
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return cuMemFreeAsync(p, s);
}

// --- Modules, streams, events, launches ----------------------------------------------------------------------------

FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* m, const void*) {
  *m = reinterpret_cast<CUmodule>(new int(1));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleUnload(CUmodule m) {
  delete reinterpret_cast<int*>(m);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  Function* fn = new Function();
  snprintf(fn->name, sizeof(fn->name), "%s", name);
  *f = reinterpret_cast<CUfunction>(fn);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Stream* st = new Stream();
  st->gpu = t_ctx->gpu;
  *s = reinterpret_cast<CUstream>(st);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream s) {
  delete reinterpret_cast<Stream*>(s);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamSynchronize(CUstream s) {
  Stream* st = StreamOf(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  SleepUntil(st->last_end);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus* status) {
  *status = CU_STREAM_CAPTURE_STATUS_NONE;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(new Event());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  delete reinterpret_cast<Event*>(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent e, CUstream s) {
  Stream* st = StreamOf(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Event* ev = reinterpret_cast<Event*>(e);
  const uint64_t now = NowNs();
  ev->ts = st->last_end > now ? st->last_end : now;
  ev->recorded = true;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventQuery(CUevent e) {
  Event* ev = reinterpret_cast<Event*>(e);
  return NowNs() >= ev->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  SleepUntil(reinterpret_cast<Event*>(e)->ts);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  Event* x = reinterpret_cast<Event*>(a);
  Event* y = reinterpret_cast<Event*>(b);
  if (!x->recorded || !y->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (NowNs() < y->ts || NowNs() < x->ts) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((static_cast<double>(y->ts) - static_cast<double>(x->ts)) / 1e6);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  return cuEventElapsedTime_v2(ms, a, b);
}
FAKE_EXPORT CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    CUstream s, void** params, void**) {
  return Submit(s, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d, unsigned e,
                                         unsigned g, unsigned h, CUstream s, void** params, void** x) {
  return cuLaunchKernel(f, a, b, c, d, e, g, h, s, params, x);
}
FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction, void** params, void**) {
  return Submit(c->hStream, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** p, void** x) {
  return cuLaunchKernelEx(c, f, p, x);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, CUstream s, void** params) {
  return Submit(s, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d,
                                                    unsigned e, unsigned g, unsigned h, CUstream s, void** p) {
  return cuLaunchCooperativeKernel(f, a, b, c, d, e, g, h, s, p);
}

// --- Graphs: a graph runs its kernels back to back -------------------------------------------------------------------

FAKE_EXPORT CUresult cuGraphCreate(CUgraph* g, unsigned int) {
  Graph* gr = new Graph();
  gr->gpu = CurrentGpu() < 0 ? 0 : CurrentGpu();
  *g = reinterpret_cast<CUgraph>(gr);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                             const CUDA_KERNEL_NODE_PARAMS* p) {
  reinterpret_cast<Graph*>(g)->duration_ns += KernelNs(p->kernelParams);
  *n = reinterpret_cast<CUgraphNode>(new int(0));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                            CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  const int dev = p->poolProps.location.id;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t ptr = 0;
  const CUresult r = AllocDevice(p->bytesize, g_visible[dev], &ptr);
  if (r != CUDA_SUCCESS) return r;
  p->dptr = ptr;
  reinterpret_cast<Graph*>(g)->allocations.emplace_back(ptr, p->bytesize);
  *n = reinterpret_cast<CUgraphNode>(new int(0));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
  Graph* copy = new Graph();
  copy->duration_ns = reinterpret_cast<Graph*>(g)->duration_ns;
  *e = reinterpret_cast<CUgraphExec>(copy);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  return Submit(s, reinterpret_cast<Graph*>(e)->duration_ns);
}
FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return cuGraphLaunch(e, s);
}
FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  delete reinterpret_cast<Graph*>(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  Graph* gr = reinterpret_cast<Graph*>(g);
  for (auto& a : gr->allocations) FreeDevice(a.first);
  delete gr;
  return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "no error" : r == CUDA_ERROR_OUT_OF_MEMORY ? "out of memory" : "fake error";
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorName(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "CUDA_SUCCESS" : r == CUDA_ERROR_OUT_OF_MEMORY ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR";
  return CUDA_SUCCESS;
}

// --- cuGetProcAddress: by name, version and stream semantics, as the real driver resolves ---------------------------

namespace {
struct ProcEntry {
  const char* base;
  int version;
  int ptsz;
  void* fn;
};
#define P(base, version, ptsz, sym) {#base, version, ptsz, reinterpret_cast<void*>(&sym)}
const ProcEntry kProcs[] = {
    P(cuInit, 2000, 0, cuInit), P(cuDriverGetVersion, 2020, 0, cuDriverGetVersion),
    P(cuDeviceGetCount, 2000, 0, cuDeviceGetCount), P(cuDeviceGet, 2000, 0, cuDeviceGet),
    P(cuDeviceGetName, 2000, 0, cuDeviceGetName), P(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid),
    P(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2), P(cuDeviceTotalMem, 2000, 0, cuDeviceTotalMem),
    P(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2), P(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute),
    P(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain),
    P(cuDevicePrimaryCtxRelease, 7000, 0, cuDevicePrimaryCtxRelease),
    P(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2),
    P(cuDevicePrimaryCtxReset, 7000, 0, cuDevicePrimaryCtxReset),
    P(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2), P(cuCtxCreate, 2000, 0, cuCtxCreate),
    P(cuCtxCreate, 3020, 0, cuCtxCreate_v2), P(cuCtxCreate, 11040, 0, cuCtxCreate_v3),
    P(cuCtxCreate, 12050, 0, cuCtxCreate_v4), P(cuCtxDestroy, 2000, 0, cuCtxDestroy),
    P(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2), P(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent),
    P(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent), P(cuCtxGetDevice, 2000, 0, cuCtxGetDevice),
    P(cuCtxSynchronize, 2000, 0, cuCtxSynchronize), P(cuMemGetInfo, 2000, 0, cuMemGetInfo),
    P(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2), P(cuMemAlloc, 2000, 0, cuMemAlloc),
    P(cuMemAlloc, 3020, 0, cuMemAlloc_v2), P(cuMemAllocPitch, 2000, 0, cuMemAllocPitch),
    P(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2), P(cuMemAllocManaged, 6000, 0, cuMemAllocManaged),
    P(cuMemFree, 2000, 0, cuMemFree), P(cuMemFree, 3020, 0, cuMemFree_v2), P(cuMemCreate, 10020, 0, cuMemCreate),
    P(cuMemRelease, 10020, 0, cuMemRelease), P(cuMemMap, 10020, 0, cuMemMap), P(cuMemUnmap, 10020, 0, cuMemUnmap),
    P(cuMemAddressReserve, 10020, 0, cuMemAddressReserve), P(cuMemAddressFree, 10020, 0, cuMemAddressFree),
    P(cuMemAllocAsync, 11020, 0, cuMemAllocAsync), P(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz),
    P(cuMemFreeAsync, 11020, 0, cuMemFreeAsync), P(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz),
    P(cuModuleLoadData, 2000, 0, cuModuleLoadData), P(cuModuleGetFunction, 2000, 0, cuModuleGetFunction),
    P(cuStreamCreate, 2000, 0, cuStreamCreate), P(cuStreamSynchronize, 2000, 0, cuStreamSynchronize),
    P(cuEventCreate, 2000, 0, cuEventCreate), P(cuEventRecord, 2000, 0, cuEventRecord),
    P(cuEventQuery, 2000, 0, cuEventQuery), P(cuEventElapsedTime, 2000, 0, cuEventElapsedTime),
    P(cuEventDestroy, 4000, 0, cuEventDestroy_v2), P(cuLaunchKernel, 4000, 0, cuLaunchKernel),
    P(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz), P(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx),
    P(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz), P(cuGraphLaunch, 10000, 0, cuGraphLaunch),
    P(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz),
};
#undef P

CUresult Resolve(const char* symbol, void** pfn, int version, cuuint64_t flags, CUdriverProcAddressQueryResult* st) {
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
    if (st != nullptr) *st = any ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = best->fn;
  if (st != nullptr) *st = CU_GET_PROC_ADDRESS_SUCCESS;
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  return Resolve(symbol, pfn, version, flags, nullptr);
}
FAKE_EXPORT CUresult cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                         CUdriverProcAddressQueryResult* status) {
  return Resolve(symbol, pfn, version, flags, status);
}
