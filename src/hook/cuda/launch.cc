// Launches: every launch path (kernels, Ex, cooperative, graphs) is paced against the container's GPU-time
// budget (docs/isolation.md, "Compute"). The fast path is one mode load, one device lookup, one cost-table
// lookup and one atomic subtraction: no lock, no allocation, no system call. A launch finds the budget empty
// only when the container is over its share; then it waits (the slow path), and that is the throttling.
#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

namespace {

inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

inline uint64_t KernelKey(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shmem) {
  uint64_t h = reinterpret_cast<uint64_t>(f);
  h = Mix(h, (static_cast<uint64_t>(gx) << 32) | gy);
  h = Mix(h, (static_cast<uint64_t>(gz) << 32) | bx);
  h = Mix(h, (static_cast<uint64_t>(by) << 32) | bz);
  return Mix(h, shmem);
}

}  // namespace

// Whether `stream` is being captured. A _ptsz call's stream 0 is the thread's per-thread default stream,
// not the legacy one: asked as such (through the _ptsz query, or CU_STREAM_PER_THREAD).
bool StreamIsCapturing(CUstream stream, bool ptsz) {
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  CUresult r;
  if (ptsz && g_cu.real_cuStreamIsCapturing_ptsz != nullptr) {
    r = g_cu.real_cuStreamIsCapturing_ptsz(stream, &status);
  } else if (g_cu.real_cuStreamIsCapturing != nullptr) {
    r = g_cu.real_cuStreamIsCapturing(ptsz && stream == nullptr ? CU_STREAM_PER_THREAD : stream, &status);
  } else {
    return false;
  }
  return r == CUDA_SUCCESS && status != CU_STREAM_CAPTURE_STATUS_NONE;
}

namespace {

bool Capturing(CUstream stream, bool ptsz) {
  return StreamIsCapturing(stream, ptsz);
}

template <typename Call>
__attribute__((noinline)) CUresult SlowLaunch(int ordinal, hook::BucketState* b, uint64_t key,
                                              hook::KernelCostTable::Lookup look, CUstream stream, bool ptsz,
                                              Call call) {
  if (b->tokens_ns.load(std::memory_order_relaxed) <= 0) hook::TokenBucket::WaitForBudget(b);
  hook::TokenBucket::Take(b, look.estimate_ns);
  if (!look.sample || g_cu.real_cuEventCreate == nullptr || g_cu.real_cuEventRecord == nullptr ||
      g_state.samples.InFlight() >= hook::SampleRing::kCapacity / 2 ||
      (g_state.capturing.load(std::memory_order_relaxed) != 0 && Capturing(stream, ptsz))) {
    return call();
  }
  // A timed launch: events before and after, measured later by the limiter thread.
  CUevent start = nullptr;
  CUevent end = nullptr;
  if (g_cu.real_cuEventCreate(&start, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return call();
  if (g_cu.real_cuEventCreate(&end, CU_EVENT_DEFAULT) != CUDA_SUCCESS) {
    g_cu.real_cuEventDestroy_v2(start);
    return call();
  }
  CUstream event_stream = stream == nullptr && ptsz ? CU_STREAM_PER_THREAD : stream;
  const bool recorded = g_cu.real_cuEventRecord(start, event_stream) == CUDA_SUCCESS;
  const CUresult r = call();
  if (recorded && r == CUDA_SUCCESS && g_cu.real_cuEventRecord(end, event_stream) == CUDA_SUCCESS) {
    hook::SampleRing::Sample s{key, reinterpret_cast<uint64_t>(start), reinterpret_cast<uint64_t>(end),
                               ordinal, look.estimate_ns};
    if (g_state.samples.Push(s)) return r;
  }
  g_cu.real_cuEventDestroy_v2(start);
  g_cu.real_cuEventDestroy_v2(end);
  return r;
}

template <typename Call>
inline __attribute__((always_inline)) CUresult Paced(uint64_t key, CUstream stream, bool ptsz, Call call) {
  const Mode mode = CurrentMode();
  if (mode != Mode::kLimited) {
    const Mode now = mode == Mode::kUninitialized ? EnsureInit() : mode;
    if (now == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
    if (now != Mode::kLimited) return call();
  }
  const int ordinal = CurrentDevice();
  if (ordinal < 0 || ordinal >= g_state.device_count.load(std::memory_order_relaxed)) return call();
  HookDevice& d = g_state.devices[ordinal];
  if (d.shared == nullptr) return call();
  if (!d.has_limits) return CUDA_ERROR_NOT_PERMITTED;
  hook::BucketState* b = &d.shared->bucket;
  if (hook::TokenBucket::Unlimited(b)) return call();
  if (g_state.capturing.load(std::memory_order_relaxed) != 0 && Capturing(stream, ptsz))
    return call();  // not run now
  const hook::KernelCostTable::Lookup look = g_state.costs.Find(key);
  if (!look.sample && hook::TokenBucket::TryTake(b, look.estimate_ns)) return call();
  return SlowLaunch(ordinal, b, key, look, stream, ptsz, call);
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

extern "C" CUresult tessera_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                           unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                                           void** params, void** extra) {
  return Paced(KernelKey(f, gx, gy, gz, bx, by, bz, shmem), stream, false, [&] {
    return g_cu.real_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
  });
}

extern "C" CUresult tessera_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                CUstream stream, void** params, void** extra) {
  return Paced(KernelKey(f, gx, gy, gz, bx, by, bz, shmem), stream, true, [&] {
    return g_cu.real_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
  });
}

extern "C" CUresult tessera_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                             void** extra) {
  if (config == nullptr) return g_cu.real_cuLaunchKernelEx(config, f, params, extra);
  const CUlaunchConfig& c = *config;
  return Paced(KernelKey(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                         c.sharedMemBytes),
               c.hStream, false, [&] { return g_cu.real_cuLaunchKernelEx(config, f, params, extra); });
}

extern "C" CUresult tessera_cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                                  void** extra) {
  if (config == nullptr) return g_cu.real_cuLaunchKernelEx_ptsz(config, f, params, extra);
  const CUlaunchConfig& c = *config;
  return Paced(KernelKey(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                         c.sharedMemBytes),
               c.hStream, true, [&] { return g_cu.real_cuLaunchKernelEx_ptsz(config, f, params, extra); });
}

extern "C" CUresult tessera_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                      unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                      CUstream stream, void** params) {
  return Paced(KernelKey(f, gx, gy, gz, bx, by, bz, shmem) ^ 0xc0, stream, false, [&] {
    return g_cu.real_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
  });
}

extern "C" CUresult tessera_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                           unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                           unsigned shmem, CUstream stream, void** params) {
  return Paced(KernelKey(f, gx, gy, gz, bx, by, bz, shmem) ^ 0xc0, stream, true, [&] {
    return g_cu.real_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
  });
}

namespace {
// A graph with memory nodes: its allocations are mapped by the launch (pools.cc). Off the fast path: only
// while such a graph exists.
template <typename Call>
__attribute__((noinline)) CUresult LaunchGraphWithMemory(CUgraphExec exec, CUstream stream, bool ptsz, Call call) {
  GraphLaunchTicket ticket;
  const CUresult c = GraphMemoryBeforeLaunch(exec, &ticket);
  if (c != CUDA_SUCCESS) return c;
  const CUresult r = Paced(Mix(0x67726170, reinterpret_cast<uint64_t>(exec)), stream, ptsz, call);
  GraphMemoryAfterLaunch(ticket, r == CUDA_SUCCESS);
  return r;
}
}  // namespace

extern "C" CUresult tessera_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  auto call = [&] { return g_cu.real_cuGraphLaunch(exec, stream); };
  if (g_graph_memory_execs.load(std::memory_order_relaxed) != 0) {
    return LaunchGraphWithMemory(exec, stream, false, call);
  }
  return Paced(Mix(0x67726170, reinterpret_cast<uint64_t>(exec)), stream, false, call);
}

extern "C" CUresult tessera_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  auto call = [&] { return g_cu.real_cuGraphLaunch_ptsz(exec, stream); };
  if (g_graph_memory_execs.load(std::memory_order_relaxed) != 0) {
    return LaunchGraphWithMemory(exec, stream, true, call);
  }
  return Paced(Mix(0x67726170, reinterpret_cast<uint64_t>(exec)), stream, true, call);
}

// --- Stream capture: launches into a capture are recorded, not run, so they are not charged
// ---------------------

namespace {
template <typename Call>
CUresult BeginCapture(Call call) {
  const CUresult r = call();
  if (r == CUDA_SUCCESS) g_state.capturing.fetch_add(1, std::memory_order_relaxed);
  return r;
}
template <typename Call>
CUresult EndCapture(Call call) {
  const CUresult r = call();
  // Not capturing (ILLEGAL_STATE) or another thread's capture (WRONG_THREAD): no capture ended.
  if (r != CUDA_ERROR_ILLEGAL_STATE && r != CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD) {
    int n = g_state.capturing.load(std::memory_order_relaxed);
    while (n > 0 && !g_state.capturing.compare_exchange_weak(n, n - 1)) {
    }
  }
  return r;
}
}  // namespace

extern "C" CUresult tessera_cuStreamBeginCapture(CUstream stream) {
  return BeginCapture([&] { return g_cu.real_cuStreamBeginCapture(stream); });
}
extern "C" CUresult tessera_cuStreamBeginCapture_ptsz(CUstream stream) {
  return BeginCapture([&] { return g_cu.real_cuStreamBeginCapture_ptsz(stream); });
}
extern "C" CUresult tessera_cuStreamBeginCapture_v2(CUstream stream, CUstreamCaptureMode mode) {
  return BeginCapture([&] { return g_cu.real_cuStreamBeginCapture_v2(stream, mode); });
}
extern "C" CUresult tessera_cuStreamBeginCapture_v2_ptsz(CUstream stream, CUstreamCaptureMode mode) {
  return BeginCapture([&] { return g_cu.real_cuStreamBeginCapture_v2_ptsz(stream, mode); });
}
extern "C" CUresult tessera_cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                        const CUgraphEdgeData* edges, size_t ndeps,
                                                        CUstreamCaptureMode mode) {
  return BeginCapture([&] { return g_cu.real_cuStreamBeginCaptureToGraph(stream, graph, deps, edges, ndeps, mode); });
}
extern "C" CUresult tessera_cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph, const CUgraphNode* deps,
                                                             const CUgraphEdgeData* edges, size_t ndeps,
                                                             CUstreamCaptureMode mode) {
  return BeginCapture(
      [&] { return g_cu.real_cuStreamBeginCaptureToGraph_ptsz(stream, graph, deps, edges, ndeps, mode); });
}
extern "C" CUresult tessera_cuStreamEndCapture(CUstream stream, CUgraph* graph) {
  return EndCapture([&] { return g_cu.real_cuStreamEndCapture(stream, graph); });
}
extern "C" CUresult tessera_cuStreamEndCapture_ptsz(CUstream stream, CUgraph* graph) {
  return EndCapture([&] { return g_cu.real_cuStreamEndCapture_ptsz(stream, graph); });
}
