// The fake CUDA driver: stream-ordered pools and allocations, graph memory (the device's graph pool) and
// prefetching pageable memory to a device (the hook's pools.cc charges them).
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

// Graph memory, as cuda.h describes it: an allocation node reserves an address when it is added; physical
// memory is mapped when the graph is launched, from the device's graph memory pool (per process), which keeps
// it after the allocation is freed (by a free node, cuMemFree or cuMemFreeAsync) until cuDeviceGraphMemTrim.
// An allocation that is never freed stays allocated after the graph is destroyed.
struct GraphPool {
  uint64_t reserved = 0;
  uint64_t used = 0;
  uint64_t reserved_high = 0;
  uint64_t used_high = 0;
};
GraphPool g_graph_pool[fakecuda::kMaxGpus];  // by physical GPU, under g_mu
std::unordered_map<uint64_t, std::pair<int, uint64_t>>* g_graph_live = nullptr;  // ptr -> (gpu, bytes)

// Maps an allocation node's memory at launch (reusing what the pool keeps). Not under g_mu.
CUresult GraphMap(int gpu, CUdeviceptr ptr, uint64_t bytes) {
  uint64_t grow = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_graph_live != nullptr && g_graph_live->count(ptr) != 0) return CUDA_SUCCESS;  // still allocated
    GraphPool& p = g_graph_pool[gpu];
    const uint64_t idle = p.reserved - p.used;
    grow = bytes > idle ? bytes - idle : 0;
  }
  if (grow > 0 && Charge(gpu, static_cast<int64_t>(grow)) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(g_mu);
  GraphPool& p = g_graph_pool[gpu];
  p.reserved += grow;
  p.used += bytes;
  if (p.reserved > p.reserved_high) p.reserved_high = p.reserved;
  if (p.used > p.used_high) p.used_high = p.used;
  if (g_graph_live == nullptr) g_graph_live = new std::unordered_map<uint64_t, std::pair<int, uint64_t>>();
  (*g_graph_live)[ptr] = {gpu, bytes};
  return CUDA_SUCCESS;
}
// A graph allocation freed: back to the graph pool. False when `ptr` is not a live graph allocation.
bool GraphFree(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_graph_live == nullptr) return false;
  auto it = g_graph_live->find(ptr);
  if (it == g_graph_live->end()) return false;
  g_graph_pool[it->second.first].used -= it->second.second;
  g_graph_live->erase(it);
  return true;
}

}  // namespace fakecuda

// Stream-ordered allocation, as cuda.h describes pools: a pool reserves device memory and hands it out;
// cuMemFreeAsync gives it back to the pool, not to the device; at a synchronization (stream, context, event)
// the pool releases what it keeps above its release threshold (default 0); cuMemPoolTrimTo releases down to
// a given amount. Each device has a default pool, its current pool until cuDeviceSetMemPool.
namespace {
struct Pool {
  int gpu = 0;  // physical GPU
  uint64_t reserved = 0;
  uint64_t used = 0;
  uint64_t reserved_high = 0;
  uint64_t used_high = 0;
  uint64_t threshold = 0;
};
struct PoolAlloc {
  Pool* pool;
  uint64_t bytes;
};
std::vector<Pool*>* g_pools = nullptr;          // under g_mu
Pool* g_default_pool[fakecuda::kMaxGpus] = {};  // by visible ordinal, under g_mu
Pool* g_current_pool[fakecuda::kMaxGpus] = {};
std::unordered_map<uint64_t, PoolAlloc>* g_pool_allocs = nullptr;  // under g_mu

Pool* NewPoolLocked(int ordinal) {
  Pool* p = new Pool();
  p->gpu = g_visible[ordinal];
  if (g_pools == nullptr) g_pools = new std::vector<Pool*>();
  g_pools->push_back(p);
  return p;
}
Pool* CurrentPoolLocked(int ordinal) {
  if (g_default_pool[ordinal] == nullptr) g_default_pool[ordinal] = NewPoolLocked(ordinal);
  return g_current_pool[ordinal] != nullptr ? g_current_pool[ordinal] : g_default_pool[ordinal];
}
// Gives back to the device what the pool keeps above `keep` (never what is in use). Under g_mu.
uint64_t ReleaseLocked(Pool* p, uint64_t keep) {
  const uint64_t floor = p->used > keep ? p->used : keep;
  if (p->reserved <= floor) return 0;
  const uint64_t give = p->reserved - floor;
  p->reserved = floor;
  return give;
}
CUresult PoolAllocate(Pool* p, uint64_t bytes, CUdeviceptr* dptr) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (bytes == 0 || dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t grow = 0;
  int gpu = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    const uint64_t idle = p->reserved - p->used;
    grow = bytes > idle ? bytes - idle : 0;
    gpu = p->gpu;
  }
  if (grow > 0 && Charge(gpu, static_cast<int64_t>(grow)) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
  std::lock_guard<std::mutex> lock(g_mu);
  p->reserved += grow;
  p->used += bytes;
  if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
  if (p->used > p->used_high) p->used_high = p->used;
  if (g_pool_allocs == nullptr) g_pool_allocs = new std::unordered_map<uint64_t, PoolAlloc>();
  const uint64_t va = g_next_va;
  g_next_va += (bytes + 4095) / 4096 * 4096 + 4096;
  (*g_pool_allocs)[va] = PoolAlloc{p, bytes};
  *dptr = va;
  return CUDA_SUCCESS;
}
}  // namespace

namespace fakecuda {
bool PoolFree(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_pool_allocs == nullptr) return false;
  auto it = g_pool_allocs->find(ptr);
  if (it == g_pool_allocs->end()) return false;
  it->second.pool->used -= it->second.bytes;
  g_pool_allocs->erase(it);
  return true;
}
// A synchronization: every pool releases what it keeps above its threshold. A pool's figure
// (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) drops before its memory is back on the device: nothing in cuda.h
// orders the two, so a caller must not rely on either order. FAKECUDA_SLOW_RELEASE_MS (fault injection)
// widens the gap between them.
void ReleaseAtSynchronization() {
  std::vector<std::pair<int, uint64_t>> gives;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_pools == nullptr) return;
    for (Pool* p : *g_pools) {
      const uint64_t give = ReleaseLocked(p, p->threshold);
      if (give > 0) gives.emplace_back(p->gpu, give);
    }
  }
  if (!gives.empty()) fakecuda::SleepAsConfigured("FAKECUDA_SLOW_RELEASE_MS");
  for (const auto& [gpu, give] : gives) Charge(gpu, -static_cast<int64_t>(give));
}
}  // namespace fakecuda

FAKE_EXPORT CUresult cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  if (pool == nullptr || props == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (pool == nullptr || props == nullptr || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      !ValidDevice(props->location.id)) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  std::lock_guard<std::mutex> lock(g_mu);
  *pool = reinterpret_cast<CUmemoryPool>(NewPoolLocked(props->location.id));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  Pool* p = reinterpret_cast<Pool*>(pool);
  uint64_t give = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    give = ReleaseLocked(p, 0);  // memory still allocated from it is freed when freed
  }
  if (give > 0) Charge(p->gpu, -static_cast<int64_t>(give));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  Pool* p = reinterpret_cast<Pool*>(pool);
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t give = 0;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    give = ReleaseLocked(p, keep);
  }
  if (give > 0) Charge(p->gpu, -static_cast<int64_t>(give));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Pool* p = reinterpret_cast<Pool*>(pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      p->threshold = *static_cast<cuuint64_t*>(value);
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      p->reserved_high = p->reserved;  // only 0 may be set: resets to the current value
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      p->used_high = p->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
      return CUDA_SUCCESS;
    default:
      return CUDA_ERROR_INVALID_VALUE;  // the current values are read-only
  }
}
FAKE_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Pool* p = reinterpret_cast<Pool*>(pool);
  if (p == nullptr || value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  cuuint64_t* v = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
      *v = p->threshold;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
      *v = p->reserved;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
      *v = p->reserved_high;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
      *v = p->used;
      return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
      *v = p->used_high;
      return CUDA_SUCCESS;
    default:
      *static_cast<int*>(value) = 1;
      return CUDA_SUCCESS;
  }
}
FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_mu);
  CurrentPoolLocked(dev);
  *pool = reinterpret_cast<CUmemoryPool>(g_default_pool[dev]);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice dev) {
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_mu);
  *pool = reinterpret_cast<CUmemoryPool>(CurrentPoolLocked(dev));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  std::lock_guard<std::mutex> lock(g_mu);
  g_current_pool[dev] = reinterpret_cast<Pool*>(pool);
  return CUDA_SUCCESS;
}
// Stream-ordered calls on a capturing stream are recorded, not run: an allocation becomes an allocation node
// of the captured graph (an address now, memory when the graph is launched), a free a free node.
namespace {
bool CapturedAlloc(CUstream s, uint64_t bytes, CUdeviceptr* dptr, CUresult* r) {
  Stream* st = StreamOf(s);
  if (st == nullptr || st->capture == nullptr) return false;
  if (bytes == 0 || dptr == nullptr) {
    *r = CUDA_ERROR_INVALID_VALUE;
    return true;
  }
  GraphNode* node = new GraphNode();
  node->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  node->alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  node->alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  node->alloc.poolProps.location.id = st->gpu;
  node->alloc.bytesize = bytes;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    node->alloc.dptr = g_next_va;
    g_next_va += (bytes + 4095) / 4096 * 4096 + 4096;
  }
  st->capture->allocations.emplace_back(node->alloc.dptr, bytes);
  st->capture->nodes.push_back(node);
  *dptr = node->alloc.dptr;
  *r = CUDA_SUCCESS;
  return true;
}
bool CapturedFree(CUstream s, CUdeviceptr ptr) {
  Stream* st = StreamOf(s);
  if (st == nullptr || st->capture == nullptr) return false;
  GraphNode* node = new GraphNode();
  node->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  node->free_ptr = ptr;
  st->capture->frees.push_back(ptr);
  st->capture->nodes.push_back(node);
  return true;
}
}  // namespace

FAKE_EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream s) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  CUresult captured = CUDA_SUCCESS;
  if (CapturedAlloc(s, bytes, dptr, &captured)) return captured;
  Pool* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    p = CurrentPoolLocked(t_ctx->gpu);
  }
  return PoolAllocate(p, bytes, dptr);
}
FAKE_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUstream s) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAllocAsync(dptr, bytes, s);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool, CUstream s) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (pool == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUresult captured = CUDA_SUCCESS;
  if (CapturedAlloc(s, bytes, dptr, &captured)) return captured;
  return PoolAllocate(reinterpret_cast<Pool*>(pool), bytes, dptr);
}
FAKE_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytes, CUmemoryPool pool,
                                                  CUstream s) {
  if (dptr == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuMemAllocFromPoolAsync(dptr, bytes, pool, s);
}
FAKE_EXPORT CUresult cuMemFreeAsync(CUdeviceptr p, CUstream s) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (CapturedFree(s, p)) return CUDA_SUCCESS;
  if (PoolFree(p)) return CUDA_SUCCESS;
  return FreeDevice(p);  // memory from cuMemAlloc may be freed in stream order too
}
FAKE_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, CUstream s) {
  return cuMemFreeAsync(p, s);
}

FAKE_EXPORT CUresult cuDeviceGraphMemTrim(CUdevice dev) {
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t give = 0;
  const int gpu = g_visible[dev];
  {
    std::lock_guard<std::mutex> lock(g_mu);
    GraphPool& p = g_graph_pool[gpu];
    give = p.reserved - p.used;
    p.reserved = p.used;
  }
  if (give > 0) Charge(gpu, -static_cast<int64_t>(give));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetGraphMemAttribute(CUdevice dev, CUgraphMem_attribute attr, void* value) {
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::lock_guard<std::mutex> lock(g_mu);
  const GraphPool& p = g_graph_pool[g_visible[dev]];
  cuuint64_t* v = static_cast<cuuint64_t*>(value);
  switch (attr) {
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT:
      *v = p.used;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH:
      *v = p.used_high;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT:
      *v = p.reserved;
      return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH:
      *v = p.reserved_high;
      return CUDA_SUCCESS;
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// Prefetching managed memory costs nothing more here (it is device memory from the start); pageable memory
// (HMM) prefetched to a device takes device memory for the process until it is prefetched back to the host.
namespace {
std::unordered_map<uint64_t, std::pair<int, uint64_t>>* g_migrated = nullptr;  // host range -> (gpu, bytes)
bool IsDeviceMemory(uint64_t ptr) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_allocs != nullptr) {
    for (const auto& [base, a] : *g_allocs) {
      if (ptr >= base && ptr < base + a.bytes) return true;
    }
  }
  return g_pool_allocs != nullptr && g_pool_allocs->count(ptr) != 0;
}
CUresult Prefetch(CUdeviceptr ptr, size_t count, CUmemLocation to) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (count == 0) return CUDA_ERROR_INVALID_VALUE;
  if (IsDeviceMemory(ptr)) return CUDA_SUCCESS;
  if (to.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    if (!ValidDevice(to.id)) return CUDA_ERROR_INVALID_DEVICE;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      if (g_migrated != nullptr && g_migrated->count(ptr) != 0) return CUDA_SUCCESS;
    }
    const int gpu = g_visible[to.id];
    if (Charge(gpu, static_cast<int64_t>(count)) != CUDA_SUCCESS) return CUDA_ERROR_OUT_OF_MEMORY;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_migrated == nullptr) g_migrated = new std::unordered_map<uint64_t, std::pair<int, uint64_t>>();
    (*g_migrated)[ptr] = {gpu, count};
    return CUDA_SUCCESS;
  }
  std::pair<int, uint64_t> back{0, 0};
  {
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_migrated == nullptr || g_migrated->count(ptr) == 0) return CUDA_SUCCESS;
    back = (*g_migrated)[ptr];
    g_migrated->erase(ptr);
  }
  Charge(back.first, -static_cast<int64_t>(back.second));
  return CUDA_SUCCESS;
}
CUmemLocation DeviceOrHost(CUdevice d) {
  CUmemLocation l{};
  l.type = d < 0 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;  // CU_DEVICE_CPU is -1
  l.id = d < 0 ? 0 : d;
  return l;
}
}  // namespace

FAKE_EXPORT CUresult cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice dev, CUstream) {
  return Prefetch(ptr, count, DeviceOrHost(dev));
}
FAKE_EXPORT CUresult cuMemPrefetchAsync_ptsz(CUdeviceptr ptr, size_t count, CUdevice dev, CUstream) {
  return Prefetch(ptr, count, DeviceOrHost(dev));
}
FAKE_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t count, CUmemLocation to, unsigned int,
                                           CUstream) {
  return Prefetch(ptr, count, to);
}
FAKE_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr ptr, size_t count, CUmemLocation to, unsigned int,
                                                CUstream) {
  return Prefetch(ptr, count, to);
}
FAKE_EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr* ptrs, size_t* sizes, size_t count,
                                             CUmemLocation* locs, size_t* loc_idx, size_t nlocs,
                                             unsigned long long, CUstream) {
  if (ptrs == nullptr || sizes == nullptr || locs == nullptr || loc_idx == nullptr || nlocs == 0) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  // Location k applies from operation loc_idx[k] until the next location's index.
  for (size_t i = 0; i < count; ++i) {
    size_t k = 0;
    while (k + 1 < nlocs && loc_idx[k + 1] <= i) ++k;
    const CUresult r = Prefetch(ptrs[i], sizes[i], locs[k]);
    if (r != CUDA_SUCCESS) return r;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemPrefetchBatchAsync_ptsz(CUdeviceptr* ptrs, size_t* sizes, size_t count,
                                                  CUmemLocation* locs, size_t* loc_idx, size_t nlocs,
                                                  unsigned long long flags, CUstream s) {
  return cuMemPrefetchBatchAsync(ptrs, sizes, count, locs, loc_idx, nlocs, flags, s);
}
FAKE_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync(CUdeviceptr* ptrs, size_t* sizes, size_t count,
                                                       CUmemLocation* locs, size_t* loc_idx, size_t nlocs,
                                                       unsigned long long flags, CUstream s) {
  return cuMemPrefetchBatchAsync(ptrs, sizes, count, locs, loc_idx, nlocs, flags, s);
}
FAKE_EXPORT CUresult cuMemDiscardAndPrefetchBatchAsync_ptsz(CUdeviceptr* ptrs, size_t* sizes, size_t count,
                                                            CUmemLocation* locs, size_t* loc_idx,
                                                            size_t nlocs, unsigned long long flags,
                                                            CUstream s) {
  return cuMemPrefetchBatchAsync(ptrs, sizes, count, locs, loc_idx, nlocs, flags, s);
}
FAKE_EXPORT CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice) {
  return g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr, size_t, CUmem_advise, CUmemLocation) {
  return g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
