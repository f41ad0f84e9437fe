// Memory the driver keeps after the program freed it, and memory moved onto a GPU without an allocation call
// (docs/isolation.md, "What is charged"):
//
// - Stream-ordered pools. cuMemFreeAsync gives memory back to its pool, not to the device; the pool releases
//   what it keeps above its release threshold at synchronizations, and down to a floor at cuMemPoolTrimTo
//   (PyTorch's cudaMallocAsync backend sets the threshold to UINT64_MAX: it keeps everything). A pool is
//   charged what it holds from the device: max(its allocations in use, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
//   trued up after every allocation and free, after trims, threshold changes and synchronizations, and by the
//   limiter thread.
// - Graph memory. An allocation node takes no memory when it is added; a launch maps it from the device's
//   graph memory pool, which keeps it after it is freed, until cuDeviceGraphMemTrim. A launch of a graph with
//   allocation nodes reserves what the graph pool may have to grow (refused past the limit: the graph is not
//   launched), then the graph pool is charged CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT.
// - Prefetches of pageable memory (HMM/ATS systems) to a GPU are charged until the range is prefetched back
//   to the host (or the process ends); managed memory is charged when allocated already.
#include <pthread.h>

#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

std::atomic<int> g_graph_memory_execs{0};
std::atomic<int> g_releasing{0};
std::atomic<uint64_t> g_releases_started{0};

namespace {

struct PoolState {
  uint64_t pool = 0;
  int ordinal = -1;
  uint64_t in_use = 0;  // charged through its allocations' records
  uint64_t kept = 0;    // charged for what it keeps (freed, not released)
};

constexpr int kMaxPools = 128;
// One pool operation at a time in the process: each reads the driver's figure and moves charges.
pthread_mutex_t g_pool_mutex = PTHREAD_MUTEX_INITIALIZER;
PoolState g_pools[kMaxPools];
std::atomic<int> g_pool_count{0};

PoolState* FindPoolLocked(uint64_t pool) {
  const int n = g_pool_count.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) {
    if (g_pools[i].pool == pool) return &g_pools[i];
  }
  return nullptr;
}

PoolState* PoolLocked(uint64_t pool, int ordinal) {
  if (PoolState* p = FindPoolLocked(pool)) return p;
  const int n = g_pool_count.load(std::memory_order_relaxed);
  if (n == kMaxPools) return nullptr;
  g_pools[n] = PoolState{pool, ordinal, 0, 0};
  g_pool_count.store(n + 1, std::memory_order_release);
  return &g_pools[n];
}

// Calls that may give pool memory back to the device run inside Releasing (hook.h): synchronizations, trims,
// frees, pool destruction, in any thread. While one runs, the driver's figures may already count memory as
// given back that the device still holds (the fake driver lowers a pool's figure before it returns the
// memory, and nothing says a real one does not), so a charge is lowered only from a figure read while no
// release ran and none started: the thread whose call gave memory back lowers the charge after its call
// returns (when several overlap, the last one out). Raising is always safe.
//
// Reads a driver figure of what a pool holds; `*settled` says whether no release overlapped the read.
template <typename Read>
bool ReadPoolFigure(Read read, uint64_t* out, bool* settled) {
  const uint64_t started = g_releases_started.load(std::memory_order_seq_cst);
  const bool quiet = g_releasing.load(std::memory_order_seq_cst) == 0;
  cuuint64_t value = 0;
  const bool ok = read(&value);
  *settled = quiet && g_releases_started.load(std::memory_order_seq_cst) == started;
  *out = value;
  return ok;
}

// Charges the pool what the driver says it keeps (lowered only when `lower` and the figure is settled).
// Without the driver's figure, nothing is kept (as before pools were understood: freed memory is given back
// at once).
void TrueUpPoolLocked(PoolState* p, bool lower) {
  uint64_t reserved = 0;
  bool settled = false;
  const bool known = g_cu.real_cuMemPoolGetAttribute != nullptr &&
                     ReadPoolFigure(
                         [&](cuuint64_t* v) {
                           return g_cu.real_cuMemPoolGetAttribute(reinterpret_cast<CUmemoryPool>(p->pool),
                                                                  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                                                                  v) == CUDA_SUCCESS;
                         },
                         &reserved, &settled);
  const uint64_t want = known && reserved > p->in_use ? reserved - p->in_use : 0;
  HookDevice* d = DeviceAt(p->ordinal);
  if (d == nullptr || d->region_index < 0) return;
  if (want > p->kept) {
    if (g_state.session.region.ForceCharge(d->region_index, want - p->kept)) p->kept = want;
  } else if (want < p->kept && lower && (settled || !known)) {
    Uncharge(p->ordinal, p->kept - want);
    p->kept = want;
  }
}

void TrueUpGraphPoolLocked(int ordinal, bool may_lower) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || d->region_index < 0 || g_cu.real_cuDeviceGetGraphMemAttribute == nullptr) return;
  uint64_t reserved = 0;
  bool settled = false;
  if (!ReadPoolFigure(
          [&](cuuint64_t* v) {
            return g_cu.real_cuDeviceGetGraphMemAttribute(static_cast<CUdevice>(ordinal),
                                                          CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, v) == CUDA_SUCCESS;
          },
          &reserved, &settled)) {
    return;
  }
  may_lower = may_lower && settled;
  if (reserved > d->graph_pool_bytes) {
    if (g_state.session.region.ForceCharge(d->region_index, reserved - d->graph_pool_bytes)) {
      d->graph_pool_bytes = reserved;
    }
  } else if (reserved < d->graph_pool_bytes && may_lower) {
    Uncharge(ordinal, d->graph_pool_bytes - reserved);
    d->graph_pool_bytes = reserved;
  }
}

// An allocation from `pool` on `ordinal`: what the pool keeps is used first (no new charge), the rest is
// reserved before the driver is asked, and the pool is trued up after.
template <typename Call>
CUresult PoolAllocate(CUdeviceptr* dptr, size_t bytes, uint64_t pool, int ordinal, Call call) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr) return call();
  pthread_mutex_lock(&g_pool_mutex);
  PoolState* p = PoolLocked(pool, ordinal);
  if (p == nullptr) {
    pthread_mutex_unlock(&g_pool_mutex);
    hook::WriteStderrLine("more than %d memory pools: allocation refused", kMaxPools);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  const uint64_t reuse = bytes < p->kept ? bytes : p->kept;
  const CUresult c = ChargeBefore(ordinal, bytes - reuse);
  if (c != CUDA_SUCCESS) {
    pthread_mutex_unlock(&g_pool_mutex);
    return c;
  }
  const CUresult r = call();
  if (r != CUDA_SUCCESS) {
    Uncharge(ordinal, bytes - reuse);
    pthread_mutex_unlock(&g_pool_mutex);
    return r;
  }
  p->kept -= reuse;
  p->in_use += bytes;
  AllocRecord rec;
  rec.bytes = bytes;
  rec.ordinal = ordinal;
  rec.owner = pool;
  RecordAlloc(AllocKind::kPoolAlloc, *dptr, rec);
  TrueUpPoolLocked(p, true);
  pthread_mutex_unlock(&g_pool_mutex);
  return r;
}

uint64_t CurrentPool(int ordinal) {
  CUmemoryPool pool = nullptr;
  if (g_cu.real_cuDeviceGetMemPool == nullptr ||
      g_cu.real_cuDeviceGetMemPool(&pool, static_cast<CUdevice>(ordinal)) != CUDA_SUCCESS) {
    return 0;
  }
  return reinterpret_cast<uint64_t>(pool);
}

int PoolOrdinal(CUmemoryPool pool) {
  AllocRecord rec;
  if (FindAlloc(AllocKind::kPool, reinterpret_cast<uint64_t>(pool), &rec)) return rec.ordinal;
  return CurrentDevice();
}

template <typename Call>
CUresult AllocAsync(CUdeviceptr* dptr, size_t bytes, uint64_t pool, int ordinal, CUstream stream, bool ptsz,
                    Call call) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || bytes == 0 || dptr == nullptr) return call();
  // Into a capture: an allocation node of the captured graph, charged when the graph is launched.
  if (g_state.capturing.load(std::memory_order_relaxed) != 0 && StreamIsCapturing(stream, ptsz)) return call();
  HookDevice* d = DeviceAt(ordinal);
  if (d != nullptr && !d->has_limits) return RefusalFor(ordinal);
  return PoolAllocate(dptr, bytes, pool, ordinal, call);
}

template <typename Call>
CUresult Synchronizing(Call call) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = Releasing(call);
  if (r == CUDA_SUCCESS && g_pool_count.load(std::memory_order_relaxed) != 0 &&
      CurrentMode() == Mode::kLimited) {
    TrueUpPools();
  }
  return r;
}

// The GPU a graph's allocation nodes are on, and their bytes (nodes of child graphs are not walked).
uint64_t GraphAllocationBytes(CUgraph graph, int* ordinal) {
  if (g_cu.real_cuGraphGetNodes == nullptr || g_cu.real_cuGraphNodeGetType == nullptr ||
      g_cu.real_cuGraphMemAllocNodeGetParams == nullptr) {
    return 0;
  }
  size_t n = 0;
  if (g_cu.real_cuGraphGetNodes(graph, nullptr, &n) != CUDA_SUCCESS || n == 0) return 0;
  // Graphs with more than 256 nodes are walked in their first 256 (the rest is charged by the driver's figure
  // after the launch and at the trims).
  CUgraphNode nodes[256];
  size_t count = n < 256 ? n : 256;
  if (g_cu.real_cuGraphGetNodes(graph, nodes, &count) != CUDA_SUCCESS) return 0;
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) {
    CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
    if (g_cu.real_cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS || type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
      continue;
    }
    CUDA_MEM_ALLOC_NODE_PARAMS params{};
    if (g_cu.real_cuGraphMemAllocNodeGetParams(nodes[i], &params) != CUDA_SUCCESS) continue;
    if (params.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) continue;
    total += params.bytesize;
    *ordinal = params.poolProps.location.id;
  }
  return total;
}

template <typename Instantiate>
CUresult Instantiated(CUgraphExec* exec, CUgraph graph, Instantiate instantiate) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = instantiate();
  if (r != CUDA_SUCCESS || mode != Mode::kLimited || exec == nullptr) return r;
  int ordinal = -1;
  const uint64_t bytes = GraphAllocationBytes(graph, &ordinal);
  if (bytes == 0) return r;
  AllocRecord rec;
  rec.bytes = bytes;
  rec.ordinal = ordinal;
  RecordAlloc(AllocKind::kGraphExec, reinterpret_cast<uint64_t>(*exec), rec);
  g_graph_memory_execs.fetch_add(1, std::memory_order_relaxed);
  return r;
}

bool ToDevice(const CUmemLocation& l) {
  return l.type == CU_MEM_LOCATION_TYPE_DEVICE;
}

bool AlreadyCharged(uint64_t ptr) {
  AllocRecord rec;
  return FindAlloc(AllocKind::kLinear, ptr, &rec) || FindAlloc(AllocKind::kPoolAlloc, ptr, &rec) ||
         FindAlloc(AllocKind::kPrefetched, ptr, &rec);
}

// Prefetches of `count` ranges: those moving pageable memory onto a GPU are charged first (all or none);
// those moving back to the host give their charge back after.
template <typename Call>
CUresult Prefetching(const CUdeviceptr* ptrs, const size_t* sizes, size_t count, const CUmemLocation* locs,
                     const size_t* loc_index, size_t nlocs, Call call) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || ptrs == nullptr || sizes == nullptr || locs == nullptr || nlocs == 0) return call();
  auto location = [&](size_t i) {
    size_t k = 0;
    while (loc_index != nullptr && k + 1 < nlocs && loc_index[k + 1] <= i) ++k;
    return locs[k];
  };
  size_t charged = 0;
  CUresult refused = CUDA_SUCCESS;
  for (; charged < count; ++charged) {
    const CUmemLocation l = location(charged);
    if (!ToDevice(l) || AlreadyCharged(ptrs[charged])) continue;
    refused = ChargeBefore(l.id, sizes[charged]);
    if (refused != CUDA_SUCCESS) break;
  }
  auto undo = [&](size_t upto) {
    for (size_t i = 0; i < upto; ++i) {
      const CUmemLocation l = location(i);
      if (ToDevice(l) && !AlreadyCharged(ptrs[i])) Uncharge(l.id, sizes[i]);
    }
  };
  if (refused != CUDA_SUCCESS) {
    undo(charged);
    return refused;
  }
  const CUresult r = call();
  if (r != CUDA_SUCCESS) {
    undo(count);
    return r;
  }
  for (size_t i = 0; i < count; ++i) {
    const CUmemLocation l = location(i);
    if (ToDevice(l)) {
      if (AlreadyCharged(ptrs[i])) continue;
      AllocRecord rec;
      rec.bytes = sizes[i];
      rec.ordinal = l.id;
      RecordAlloc(AllocKind::kPrefetched, ptrs[i], rec);
    } else {
      AllocRecord rec;
      if (TakeAlloc(AllocKind::kPrefetched, ptrs[i], &rec)) Uncharge(rec.ordinal, rec.bytes);
    }
  }
  return r;
}

CUmemLocation LegacyLocation(CUdevice dev) {
  CUmemLocation l{};
  l.type = dev < 0 ? CU_MEM_LOCATION_TYPE_HOST : CU_MEM_LOCATION_TYPE_DEVICE;  // CU_DEVICE_CPU is -1
  l.id = dev < 0 ? 0 : dev;
  return l;
}

}  // namespace

void ResetPoolsInChild() {
  pthread_mutex_init(&g_pool_mutex, nullptr);
  g_pool_count.store(0, std::memory_order_relaxed);
  g_graph_memory_execs.store(0, std::memory_order_relaxed);
  g_releasing.store(0, std::memory_order_relaxed);  // the child's only thread is in no call
}

bool ReturnToPool(uint64_t dptr) {
  AllocRecord rec;
  if (!TakeAlloc(AllocKind::kPoolAlloc, dptr, &rec)) return false;
  pthread_mutex_lock(&g_pool_mutex);
  PoolState* p = FindPoolLocked(rec.owner);
  if (p == nullptr) {
    pthread_mutex_unlock(&g_pool_mutex);
    Uncharge(rec.ordinal, rec.bytes);
    return true;
  }
  p->in_use -= rec.bytes < p->in_use ? rec.bytes : p->in_use;
  p->kept += rec.bytes;  // the charge moves with the memory: from the allocation to what the pool keeps
  TrueUpPoolLocked(p, true);
  pthread_mutex_unlock(&g_pool_mutex);
  return true;
}

void TrueUpPools(bool from_limiter) {
  // The limiter thread does not wait (a graph launch may hold the lock while it waits for compute budget),
  // and only raises: it runs whenever, possibly in the middle of another thread's release.
  if (from_limiter) {
    if (pthread_mutex_trylock(&g_pool_mutex) != 0) return;
  } else {
    pthread_mutex_lock(&g_pool_mutex);
  }
  const int n = g_pool_count.load(std::memory_order_relaxed);
  for (int i = 0; i < n; ++i) TrueUpPoolLocked(&g_pools[i], !from_limiter);
  if (g_graph_memory_execs.load(std::memory_order_relaxed) != 0) {
    const int devices = g_state.device_count.load(std::memory_order_acquire);
    for (int i = 0; i < devices; ++i) TrueUpGraphPoolLocked(i, false);
  }
  pthread_mutex_unlock(&g_pool_mutex);
}

CUresult GraphMemoryBeforeLaunch(CUgraphExec exec, GraphLaunchTicket* t) {
  if (CurrentMode() != Mode::kLimited) return CUDA_SUCCESS;
  AllocRecord rec;
  if (!FindAlloc(AllocKind::kGraphExec, reinterpret_cast<uint64_t>(exec), &rec)) return CUDA_SUCCESS;
  HookDevice* d = DeviceAt(rec.ordinal);
  if (d == nullptr || d->region_index < 0) return CUDA_SUCCESS;
  pthread_mutex_lock(&g_pool_mutex);  // held until after the launch: launches of such graphs go one by one
  cuuint64_t reserved = 0;
  cuuint64_t used = 0;
  const CUdevice dev = static_cast<CUdevice>(rec.ordinal);
  uint64_t idle = 0;
  if (g_cu.real_cuDeviceGetGraphMemAttribute != nullptr &&
      g_cu.real_cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) ==
          CUDA_SUCCESS &&
      g_cu.real_cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT, &used) == CUDA_SUCCESS) {
    idle = reserved > used ? reserved - used : 0;
  }
  const uint64_t grow = rec.bytes > idle ? rec.bytes - idle : 0;
  const CUresult c = ChargeBefore(rec.ordinal, grow);
  if (c != CUDA_SUCCESS) {
    pthread_mutex_unlock(&g_pool_mutex);
    return c;
  }
  t->ordinal = rec.ordinal;
  t->reserved = grow;
  t->locked = true;
  return CUDA_SUCCESS;
}

void GraphMemoryAfterLaunch(const GraphLaunchTicket& t, bool launched) {
  if (!t.locked) return;
  HookDevice* d = DeviceAt(t.ordinal);
  if (!launched) {
    Uncharge(t.ordinal, t.reserved);
  } else {
    // The reservation becomes part of the graph pool's charge; the driver's figure may only raise it (it
    // may not show an asynchronous mapping yet; it is lowered at cuDeviceGraphMemTrim).
    d->graph_pool_bytes += t.reserved;
    TrueUpGraphPoolLocked(t.ordinal, false);
  }
  pthread_mutex_unlock(&g_pool_mutex);
}

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

// --- Stream-ordered allocation and pools ---------------------------------------------------------------------

extern "C" CUresult tessera_cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  const int ordinal = CurrentDevice();
  return AllocAsync(dptr, bytesize, CurrentPool(ordinal), ordinal, stream, false,
                    [&] { return g_cu.real_cuMemAllocAsync == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemAllocAsync(dptr, bytesize, stream); });
}
extern "C" CUresult tessera_cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  const int ordinal = CurrentDevice();
  return AllocAsync(dptr, bytesize, CurrentPool(ordinal), ordinal, stream, true,
                    [&] { return g_cu.real_cuMemAllocAsync_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemAllocAsync_ptsz(dptr, bytesize, stream); });
}
extern "C" CUresult tessera_cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                    CUstream stream) {
  return AllocAsync(dptr, bytesize, reinterpret_cast<uint64_t>(pool), PoolOrdinal(pool), stream, false,
                    [&] { return g_cu.real_cuMemAllocFromPoolAsync == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream); });
}
extern "C" CUresult tessera_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                         CUstream stream) {
  return AllocAsync(dptr, bytesize, reinterpret_cast<uint64_t>(pool), PoolOrdinal(pool), stream, true,
                    [&] { return g_cu.real_cuMemAllocFromPoolAsync_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream); });
}

namespace {
template <typename Call>
CUresult FreeAsync(CUdeviceptr dptr, Call call) {
  const CUresult r = call();
  if (r != CUDA_SUCCESS || CurrentMode() != Mode::kLimited) return r;
  if (ReturnToPool(dptr)) return r;
  AllocRecord rec;
  if (TakeAlloc(AllocKind::kLinear, dptr, &rec)) Uncharge(rec.ordinal, rec.bytes);  // from cuMemAlloc
  return r;
}
}  // namespace

extern "C" CUresult tessera_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  return FreeAsync(dptr, [&] {
    return g_cu.real_cuMemFreeAsync != nullptr ? g_cu.real_cuMemFreeAsync(dptr, stream) : CUDA_ERROR_NOT_INITIALIZED;
  });
}
extern "C" CUresult tessera_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  return FreeAsync(dptr, [&] {
    return g_cu.real_cuMemFreeAsync_ptsz != nullptr ? g_cu.real_cuMemFreeAsync_ptsz(dptr, stream)
                                                    : CUDA_ERROR_NOT_INITIALIZED;
  });
}

extern "C" CUresult tessera_cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (g_cu.real_cuMemPoolCreate == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = g_cu.real_cuMemPoolCreate(pool, props);
  if (r == CUDA_SUCCESS && mode == Mode::kLimited && pool != nullptr && props != nullptr &&
      props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    AllocRecord rec;
    rec.ordinal = props->location.id;
    RecordAlloc(AllocKind::kPool, reinterpret_cast<uint64_t>(*pool), rec);
  }
  return r;
}

extern "C" CUresult tessera_cuMemPoolDestroy(CUmemoryPool pool) {
  const CUresult r = Releasing([&] {
    return g_cu.real_cuMemPoolDestroy != nullptr ? g_cu.real_cuMemPoolDestroy(pool) : CUDA_ERROR_NOT_INITIALIZED;
  });
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) TrueUpPools();
  return r;
}

extern "C" CUresult tessera_cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  const CUresult r = Releasing([&] {
    return g_cu.real_cuMemPoolTrimTo != nullptr ? g_cu.real_cuMemPoolTrimTo(pool, keep) : CUDA_ERROR_NOT_INITIALIZED;
  });
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) TrueUpPools();
  return r;
}

extern "C" CUresult tessera_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void* value) {
  const CUresult r = Releasing([&] {
    return g_cu.real_cuMemPoolSetAttribute != nullptr ? g_cu.real_cuMemPoolSetAttribute(pool, attr, value)
                                                      : CUDA_ERROR_NOT_INITIALIZED;
  });
  // A lower release threshold takes effect at the next synchronization, which trues the pool up.
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) TrueUpPools();
  return r;
}

// --- Synchronization points ------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuCtxSynchronize(void) {
  return Synchronizing([] { return g_cu.real_cuCtxSynchronize == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuCtxSynchronize(); });
}
extern "C" CUresult tessera_cuCtxSynchronize_v2(CUcontext ctx) {
  return Synchronizing([&] { return g_cu.real_cuCtxSynchronize_v2 == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuCtxSynchronize_v2(ctx); });
}
extern "C" CUresult tessera_cuStreamSynchronize(CUstream stream) {
  return Synchronizing([&] { return g_cu.real_cuStreamSynchronize == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuStreamSynchronize(stream); });
}
extern "C" CUresult tessera_cuStreamSynchronize_ptsz(CUstream stream) {
  return Synchronizing([&] { return g_cu.real_cuStreamSynchronize_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuStreamSynchronize_ptsz(stream); });
}
extern "C" CUresult tessera_cuEventSynchronize(CUevent event) {
  return Synchronizing([&] { return g_cu.real_cuEventSynchronize == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuEventSynchronize(event); });
}

// --- Graph memory --------------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuGraphInstantiateWithFlags(CUgraphExec* exec, CUgraph graph, unsigned long long flags) {
  return Instantiated(exec, graph, [&] { return g_cu.real_cuGraphInstantiateWithFlags == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuGraphInstantiateWithFlags(exec, graph, flags); });
}
extern "C" CUresult tessera_cuGraphInstantiateWithParams(CUgraphExec* exec, CUgraph graph,
                                                         CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return Instantiated(exec, graph, [&] { return g_cu.real_cuGraphInstantiateWithParams == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuGraphInstantiateWithParams(exec, graph, params); });
}
extern "C" CUresult tessera_cuGraphInstantiateWithParams_ptsz(CUgraphExec* exec, CUgraph graph,
                                                              CUDA_GRAPH_INSTANTIATE_PARAMS* params) {
  return Instantiated(exec, graph,
                      [&] { return g_cu.real_cuGraphInstantiateWithParams_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuGraphInstantiateWithParams_ptsz(exec, graph, params); });
}
extern "C" CUresult tessera_cuGraphExecDestroy(CUgraphExec exec) {
  const CUresult r = g_cu.real_cuGraphExecDestroy != nullptr ? g_cu.real_cuGraphExecDestroy(exec)
                                                             : CUDA_ERROR_NOT_INITIALIZED;
  AllocRecord rec;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited &&
      TakeAlloc(AllocKind::kGraphExec, reinterpret_cast<uint64_t>(exec), &rec)) {
    g_graph_memory_execs.fetch_sub(1, std::memory_order_relaxed);
  }
  return r;
}
extern "C" CUresult tessera_cuDeviceGraphMemTrim(CUdevice dev) {
  const CUresult r = Releasing([&] {
    return g_cu.real_cuDeviceGraphMemTrim != nullptr ? g_cu.real_cuDeviceGraphMemTrim(dev) : CUDA_ERROR_NOT_INITIALIZED;
  });
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) {
    pthread_mutex_lock(&g_pool_mutex);
    TrueUpGraphPoolLocked(static_cast<int>(dev), true);
    pthread_mutex_unlock(&g_pool_mutex);
  }
  return r;
}

// --- Prefetch ----------------------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuMemPrefetchAsync(CUdeviceptr ptr, size_t count, CUdevice dev, CUstream stream) {
  const CUmemLocation l = LegacyLocation(dev);
  return Prefetching(&ptr, &count, 1, &l, nullptr, 1,
                     [&] { return g_cu.real_cuMemPrefetchAsync == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemPrefetchAsync(ptr, count, dev, stream); });
}
extern "C" CUresult tessera_cuMemPrefetchAsync_ptsz(CUdeviceptr ptr, size_t count, CUdevice dev, CUstream stream) {
  const CUmemLocation l = LegacyLocation(dev);
  return Prefetching(&ptr, &count, 1, &l, nullptr, 1,
                     [&] { return g_cu.real_cuMemPrefetchAsync_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemPrefetchAsync_ptsz(ptr, count, dev, stream); });
}
extern "C" CUresult tessera_cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t count, CUmemLocation to, unsigned int flags,
                                                  CUstream stream) {
  return Prefetching(&ptr, &count, 1, &to, nullptr, 1,
                     [&] { return g_cu.real_cuMemPrefetchAsync_v2 == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemPrefetchAsync_v2(ptr, count, to, flags, stream); });
}
extern "C" CUresult tessera_cuMemPrefetchAsync_v2_ptsz(CUdeviceptr ptr, size_t count, CUmemLocation to,
                                                       unsigned int flags, CUstream stream) {
  return Prefetching(&ptr, &count, 1, &to, nullptr, 1,
                     [&] { return g_cu.real_cuMemPrefetchAsync_v2_ptsz == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuMemPrefetchAsync_v2_ptsz(ptr, count, to, flags, stream); });
}
#define TS_BATCH(name)                                                                                          \
  extern "C" CUresult tessera_##name(CUdeviceptr* ptrs, size_t* sizes, size_t count, CUmemLocation* locs,       \
                                     size_t* loc_index, size_t nlocs, unsigned long long flags, CUstream s) {   \
    return Prefetching(ptrs, sizes, count, locs, loc_index, nlocs,                                              \
                       [&] { return g_cu.real_##name(ptrs, sizes, count, locs, loc_index, nlocs, flags, s); }); \
  }
TS_BATCH(cuMemPrefetchBatchAsync)
TS_BATCH(cuMemPrefetchBatchAsync_ptsz)
TS_BATCH(cuMemDiscardAndPrefetchBatchAsync)
TS_BATCH(cuMemDiscardAndPrefetchBatchAsync_ptsz)
#undef TS_BATCH
