// The fake CUDA driver: device memory (linear, pitched, the legacy 32-bit calls, host memory), arrays and
// mipmapped arrays, and virtual memory management (handles, reservations, mappings).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "fake_cuda.h"
#include "hook/common/base.h"

using namespace fakecuda;  // NOLINT: the driver's internals (fake_cuda.h)

namespace fakecuda {

CUresult Charge(int gpu, int64_t bytes) {
  State* s = Shared();
  Lock(s);
  const bool ok = fakecuda::ChargeLocked(s, gpu, bytes);
  Unlock(s);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// `low`: an address below 4 GiB, for the legacy 32-bit entry points.
CUresult AllocDevice(uint64_t bytes, int gpu, uint64_t* out, bool low) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = Charge(gpu, static_cast<int64_t>(bytes));
  if (r != CUDA_SUCCESS) return r;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_allocs == nullptr) g_allocs = new std::unordered_map<uint64_t, Alloc>();
  uint64_t& next = low ? g_next_low_va : g_next_va;
  const uint64_t va = next;
  next += (bytes + 4095) / 4096 * 4096 + 4096;
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

}  // namespace fakecuda

// --- Memory
// ----------------------------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
  size_t f = 0;
  size_t t = 0;
  const CUresult r = cuMemGetInfo_v2(&f, &t);
  *free = static_cast<unsigned>(f > 0xffffffffu ? 0xffffffffu : f);
  *total = static_cast<unsigned>(t > 0xffffffffu ? 0xffffffffu : t);
  return r;
}
FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytes, g_visible[t_ctx->gpu], &p);
  if (r == CUDA_SUCCESS) *dptr = p;
  return r;
}
FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytes) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t p = 0;
  const CUresult r = AllocDevice(bytes, g_visible[t_ctx->gpu], &p, /*low=*/true);
  if (r == CUDA_SUCCESS) *dptr = static_cast<CUdeviceptr_v1>(p);
  return r;
}
FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t w, size_t h, unsigned int) {
  if (dptr == nullptr || pitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (w == 0 || h == 0) return CUDA_ERROR_INVALID_VALUE;
  *pitch = (w + 511) / 512 * 512;
  return cuMemAlloc_v2(dptr, *pitch * h);
}
FAKE_EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int w,
                                     unsigned int h, unsigned int) {
  if (dptr == nullptr || pitch == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  const uint64_t p = (static_cast<uint64_t>(w) + 511) / 512 * 512;
  uint64_t d = 0;
  const CUresult r = AllocDevice(p * h, g_visible[t_ctx->gpu], &d, /*low=*/true);
  if (r != CUDA_SUCCESS) return r;
  *pitch = static_cast<unsigned>(p);
  *dptr = static_cast<CUdeviceptr_v1>(d);
  return r;
}
FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr* dptr, size_t bytes, unsigned int) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAlloc_v2(dptr, bytes);
}
FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr p) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  if (PoolFree(p)) {
    ReleaseAtSynchronization();  // cuMemFree synchronizes
    return CUDA_SUCCESS;
  }
  if (GraphFree(p)) return CUDA_SUCCESS;
  return FreeDevice(p);
}
FAKE_EXPORT CUresult cuMemFree(CUdeviceptr_v1 p) {
  return FreeDevice(p);
}
FAKE_EXPORT CUresult cuMemAllocHost_v2(void** p, size_t bytes) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *p = malloc(bytes == 0 ? 1 : bytes);
  return *p != nullptr ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_EXPORT CUresult cuMemFreeHost(void* p) {
  free(p);
  return CUDA_SUCCESS;
}

// Arrays, as cuda.h and the CUDA programming guide describe them: an element is NumChannels (1, 2 or 4)
// components of the format's size; a 1D array has Height 0, a 2D one Depth 0; a layered array's Depth counts
// its layers, a cubemap's 6 (x layers). A mipmapped array holds its levels, level i's extent being level 0's
// halved i times (rounded down, at least 1) in each dimension (not the layers); the levels asked are clamped
// to 1 + floor(log2(largest extent)), as cudaMallocMipmappedArray documents. The memory taken is the
// elements, summed over levels: the least any driver takes (real ones pad rows and levels to their tiled
// layouts; the hook's estimate is an upper bound of that, docs/isolation.md "Arrays").
namespace {
uint64_t AtLeast1(uint64_t v) {
  return v == 0 ? 1 : v;
}
// The elements of a CUDA_ARRAY3D_DESCRIPTOR's array with `levels` mipmap levels (1: a plain array); false for
// a descriptor cuda.h calls invalid (CUDA_ERROR_INVALID_VALUE).
bool ArrayElementsBytes(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, uint64_t* out) {
  const uint64_t component = ArrayFormatBytes(d.Format);
  if (component == 0 || d.Width == 0 || (d.NumChannels != 1 && d.NumChannels != 2 && d.NumChannels != 4)) {
    return false;
  }
  const bool layered = (d.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t w = d.Width;
  uint64_t h = AtLeast1(d.Height);
  uint64_t depth = AtLeast1(d.Depth);
  if ((d.Flags & CUDA_ARRAY3D_CUBEMAP) != 0) depth = d.Depth == 0 ? 6 : d.Depth;
  uint64_t largest = w > h ? w : h;
  if (!layered && depth > largest) largest = depth;
  unsigned most = 1;
  while ((largest >> most) != 0) ++most;  // 1 + floor(log2(largest))
  if (levels == 0) levels = 1;
  if (levels > most) levels = most;
  uint64_t bytes = 0;
  for (unsigned i = 0; i < levels; ++i) {
    bytes += w * h * depth * component * d.NumChannels;
    w = AtLeast1(w / 2);
    h = AtLeast1(h / 2);
    if (!layered) depth = AtLeast1(depth / 2);
  }
  *out = bytes;
  return true;
}
CUresult NewArray(const CUDA_ARRAY3D_DESCRIPTOR& d, unsigned levels, uint64_t* handle) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t bytes = 0;
  if (!ArrayElementsBytes(d, levels, &bytes)) return CUDA_ERROR_INVALID_VALUE;
  return AllocDevice(bytes, g_visible[t_ctx->gpu], handle);
}
}  // namespace

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray* a, const CUDA_ARRAY_DESCRIPTOR* d) {
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  const CUresult r =
      NewArray(CUDA_ARRAY3D_DESCRIPTOR{d->Width, d->Height, 0, d->Format, d->NumChannels, 0}, 1, &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(h);
  return r;
}
FAKE_EXPORT CUresult cuArrayCreate(CUarray* a, const CUDA_ARRAY_DESCRIPTOR_v1* d) {
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY_DESCRIPTOR d2{d->Width, d->Height, d->Format, d->NumChannels};
  return cuArrayCreate_v2(a, &d2);
}
FAKE_EXPORT CUresult cuArray3DCreate_v2(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR* d) {
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  const CUresult r = NewArray(*d, 1, &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUarray>(h);
  return r;
}
FAKE_EXPORT CUresult cuArray3DCreate(CUarray* a, const CUDA_ARRAY3D_DESCRIPTOR_v1* d) {
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUDA_ARRAY3D_DESCRIPTOR d2{d->Width, d->Height, d->Depth, d->Format, d->NumChannels, d->Flags};
  return cuArray3DCreate_v2(a, &d2);
}
FAKE_EXPORT CUresult cuArrayDestroy(CUarray a) {
  return FreeDevice(reinterpret_cast<uint64_t>(a));
}
FAKE_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray* a, const CUDA_ARRAY3D_DESCRIPTOR* d,
                                            unsigned int n) {
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  const CUresult r = NewArray(*d, n, &h);
  if (r == CUDA_SUCCESS) *a = reinterpret_cast<CUmipmappedArray>(h);
  return r;
}
FAKE_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray a) {
  return FreeDevice(reinterpret_cast<uint64_t>(a));
}

// Virtual memory management: a handle is physical memory; mapping it costs nothing more.
FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*,
                                                   CUmemAllocationGranularity_flags) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *g = 2ull << 20;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle* h, size_t size,
                                 const CUmemAllocationProp* prop, unsigned long long) {
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (prop == nullptr || size == 0 || size % (2ull << 20) != 0) return CUDA_ERROR_INVALID_VALUE;
  if (prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    *h = reinterpret_cast<CUmemGenericAllocationHandle>(malloc(1));
    return CUDA_SUCCESS;
  }
  if (!ValidDevice(prop->location.id)) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t k = 0;
  const CUresult r = AllocDevice(size, g_visible[prop->location.id], &k);
  if (r == CUDA_SUCCESS) {
    *h = k;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_handle_refs == nullptr) g_handle_refs = new std::unordered_map<uint64_t, int>();
    (*g_handle_refs)[k] = 1;
  }
  return r;
}
// A physical allocation lives while its handle is referenced (cuMemCreate: 1, each
// cuMemRetainAllocationHandle: +1, each cuMemRelease: -1) or mapped.
namespace {
int MappingsOfLocked(CUmemGenericAllocationHandle h) {
  int n = 0;
  if (g_mappings != nullptr) {
    for (const auto& [va, m] : *g_mappings) n += m.handle == h ? 1 : 0;
  }
  return n;
}
}  // namespace

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  bool free_now = false;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_handle_refs == nullptr) return CUDA_ERROR_INVALID_VALUE;
    auto it = g_handle_refs->find(h);
    if (it == g_handle_refs->end()) return CUDA_ERROR_INVALID_VALUE;
    if (--it->second == 0) {
      g_handle_refs->erase(it);
      free_now = MappingsOfLocked(h) == 0;
    }
  }
  if (free_now) FreeDevice(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr,
                                         unsigned long long) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  *p = g_next_va;
  g_next_va += size + (2ull << 20);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemMap(CUdeviceptr va, size_t size, size_t, CUmemGenericAllocationHandle h,
                              unsigned long long) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_handle_refs == nullptr || g_handle_refs->count(h) == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (g_mappings == nullptr) g_mappings = new std::unordered_map<uint64_t, Mapping>();
  (*g_mappings)[va] = Mapping{h, size};
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  std::vector<CUmemGenericAllocationHandle> orphans;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_mappings == nullptr) return CUDA_ERROR_INVALID_VALUE;
    for (auto it = g_mappings->begin(); it != g_mappings->end();) {
      if (it->first >= va && it->first < va + size) {
        const CUmemGenericAllocationHandle h = it->second.handle;
        it = g_mappings->erase(it);
        if ((g_handle_refs == nullptr || g_handle_refs->count(h) == 0) && MappingsOfLocked(h) == 0) {
          orphans.push_back(h);
        }
      } else {
        ++it;
      }
    }
  }
  for (CUmemGenericAllocationHandle h : orphans) FreeDevice(h);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) {
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* h, void* addr) {
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (h == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  if (g_mappings != nullptr) {
    for (const auto& [va, m] : *g_mappings) {
      if (a >= va && a < va + m.size && g_handle_refs != nullptr && g_handle_refs->count(m.handle) != 0) {
        ++(*g_handle_refs)[m.handle];
        *h = m.handle;
        return CUDA_SUCCESS;
      }
    }
  }
  return CUDA_ERROR_INVALID_VALUE;  // not the start of a mapped allocation
}
