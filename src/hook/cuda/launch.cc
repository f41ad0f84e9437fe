// Launches: every launch path (kernels, Ex, cooperative, graphs) is paced against the container's GPU-time
// budget (docs/isolation.md, "Compute"). The fast path (FastLaunch) is a few loads and compares and the
// launch's cost added to the thread's tab with a plain load and store: no atomic read-modify-write, no lock,
// no allocation, no system call; the wrapper then calls the driver directly. Everything else (the first call,
// refusals, captures, sampled launches, settling the tab with the shared bucket, waiting when the bucket is
// empty: that is the throttling) is the slow path, out of line.
#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

namespace {

inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

// A kind of launch: the function and the launch shape. Each pair of dimensions times its own odd constant:
// independent multiplies, which run side by side, where a chain of mixing rounds cost 30 instructions per
// launch; KernelCostTable::Index spreads the result.
inline uint64_t KernelKey(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                          unsigned bz, unsigned shmem) {
  return reinterpret_cast<uint64_t>(f) ^ (((static_cast<uint64_t>(gx) << 32) | gy) * 0x9e3779b97f4a7c15ull) ^
         (((static_cast<uint64_t>(gz) << 32) | bx) * 0xc2b2ae3d27d4eb4full) ^
         (((static_cast<uint64_t>(by) << 32) | bz) * 0x165667b19e3779f9ull) ^
         (static_cast<uint64_t>(shmem) * 0xd6e8feb86659fd93ull);
}

inline uint64_t GraphKey(CUgraphExec exec) {
  return Mix(0x67726170, reinterpret_cast<uint64_t>(exec));
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

// The fast path: true when the launch may go to the driver now with nothing more to do (no limits, a GPU the
// hook does not account, an unpaced GPU, or a launch of a measured kind, not one to time, that the bucket has
// budget for: its cost is then on the thread's tab and the launch counted). False sends the launch to the
// slow path, which decides again from the start; nothing was charged or counted.
inline __attribute__((always_inline)) bool FastLaunch(uint64_t key) {
  const Mode mode = CurrentMode();
  if (mode != Mode::kLimited) return mode == Mode::kPassThrough;
  // One GPU (a container's usual case): no call to ask the driver which.
  const int ordinal = g_state.device_count.load(std::memory_order_relaxed) == 1 ? 0 : CurrentDevice();
  if (ordinal < 0 || ordinal >= g_state.device_count.load(std::memory_order_relaxed)) return true;
  HookDevice& d = g_state.devices[ordinal];
  if (d.shared == nullptr) return true;
  if (!d.has_limits) return false;
  hook::BucketState* b = &d.shared->bucket;
  if (hook::TokenBucket::Unlimited(b)) return true;
  if (g_state.capturing.load(std::memory_order_relaxed) != 0) return false;
  hook::KernelCostTable::Cursor cursor;
  if (!g_state.costs.Peek(key, &cursor)) return false;
  if (!hook::TokenBucket::RunUp(hook::ThreadTab(), b, hook::TabEpoch(), cursor.estimate_ns)) return false;
  hook::KernelCostTable::Counted(cursor);
  return true;
}

// The slow path: every decision of the fast path again, with the waits, the refusals, the captures and the
// timed launches. `call()` makes the real driver call.
template <typename Call>
CUresult PacedSlow(uint64_t key, CUstream stream, bool ptsz, Call call) {
  Mode mode = CurrentMode();
  if (mode == Mode::kUninitialized) mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited) return call();
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
  hook::TokenBucket::ChargeLaunch(b, look.estimate_ns);
  if (!look.sample || g_cu.real_cuEventCreate == nullptr || g_cu.real_cuEventRecord == nullptr ||
      g_state.samples.InFlight() >= hook::SampleRing::kCapacity / 2) {
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

// The slow paths of the entry points: out of line and with the entry point's own parameters, so that the
// wrapper reaches the driver or its slow path by a tail call and its fast path keeps the arguments where they
// came (a lambda capturing them by reference made every launch store all eleven). The driver's entry point is
// read after EnsureInit has filled it.
template <bool kPtsz>
__attribute__((noinline)) CUresult LaunchKernelSlow(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                    unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                    CUstream stream, void** params, void** extra) {
  return PacedSlow(KernelKey(f, gx, gy, gz, bx, by, bz, shmem), stream, kPtsz, [&] {
    return (kPtsz ? g_cu.real_cuLaunchKernel_ptsz : g_cu.real_cuLaunchKernel)(f, gx, gy, gz, bx, by, bz,
                                                                              shmem, stream, params, extra);
  });
}

template <bool kPtsz>
__attribute__((noinline)) CUresult LaunchKernelExSlow(const CUlaunchConfig* config, CUfunction f,
                                                      void** params, void** extra) {
  const CUlaunchConfig& c = *config;
  return PacedSlow(KernelKey(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY, c.blockDimZ,
                             c.sharedMemBytes),
                   c.hStream, kPtsz, [&] {
                     return (kPtsz ? g_cu.real_cuLaunchKernelEx_ptsz : g_cu.real_cuLaunchKernelEx)(
                         config, f, params, extra);
                   });
}

template <bool kPtsz>
__attribute__((noinline)) CUresult LaunchCooperativeSlow(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                         unsigned bx, unsigned by, unsigned bz,
                                                         unsigned shmem, CUstream stream, void** params) {
  return PacedSlow(KernelKey(f, gx, gy, gz, bx, by, bz, shmem) ^ 0xc0, stream, kPtsz, [&] {
    return (kPtsz ? g_cu.real_cuLaunchCooperativeKernel_ptsz : g_cu.real_cuLaunchCooperativeKernel)(
        f, gx, gy, gz, bx, by, bz, shmem, stream, params);
  });
}

template <bool kPtsz>
__attribute__((noinline)) CUresult GraphLaunchSlow(CUgraphExec exec, CUstream stream) {
  return PacedSlow(GraphKey(exec), stream, kPtsz, [&] {
    return (kPtsz ? g_cu.real_cuGraphLaunch_ptsz : g_cu.real_cuGraphLaunch)(exec, stream);
  });
}

// A graph with memory nodes: its allocations are mapped by the launch (pools.cc). Off the fast path: only
// while such a graph exists.
template <bool kPtsz>
__attribute__((noinline)) CUresult LaunchGraphWithMemory(CUgraphExec exec, CUstream stream) {
  GraphLaunchTicket ticket;
  const CUresult c = GraphMemoryBeforeLaunch(exec, &ticket);
  if (c != CUDA_SUCCESS) return c;
  const CUresult r = GraphLaunchSlow<kPtsz>(exec, stream);
  GraphMemoryAfterLaunch(ticket, r == CUDA_SUCCESS);
  return r;
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

extern "C" CUresult tessera_cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                           unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                                           void** params, void** extra) {
  if (__builtin_expect(FastLaunch(KernelKey(f, gx, gy, gz, bx, by, bz, shmem)), 1))
    return g_cu.real_cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
  return LaunchKernelSlow<false>(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

extern "C" CUresult tessera_cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                CUstream stream, void** params, void** extra) {
  if (__builtin_expect(FastLaunch(KernelKey(f, gx, gy, gz, bx, by, bz, shmem)), 1))
    return g_cu.real_cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
  return LaunchKernelSlow<true>(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra);
}

extern "C" CUresult tessera_cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** params,
                                             void** extra) {
  if (config == nullptr) return g_cu.real_cuLaunchKernelEx(config, f, params, extra);
  const CUlaunchConfig& c = *config;
  if (__builtin_expect(FastLaunch(KernelKey(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY,
                                            c.blockDimZ, c.sharedMemBytes)),
                       1))
    return g_cu.real_cuLaunchKernelEx(config, f, params, extra);
  return LaunchKernelExSlow<false>(config, f, params, extra);
}

extern "C" CUresult tessera_cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f, void** params,
                                                  void** extra) {
  if (config == nullptr) return g_cu.real_cuLaunchKernelEx_ptsz(config, f, params, extra);
  const CUlaunchConfig& c = *config;
  if (__builtin_expect(FastLaunch(KernelKey(f, c.gridDimX, c.gridDimY, c.gridDimZ, c.blockDimX, c.blockDimY,
                                            c.blockDimZ, c.sharedMemBytes)),
                       1))
    return g_cu.real_cuLaunchKernelEx_ptsz(config, f, params, extra);
  return LaunchKernelExSlow<true>(config, f, params, extra);
}

extern "C" CUresult tessera_cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                      unsigned bx, unsigned by, unsigned bz, unsigned shmem,
                                                      CUstream stream, void** params) {
  if (__builtin_expect(FastLaunch(KernelKey(f, gx, gy, gz, bx, by, bz, shmem) ^ 0xc0), 1))
    return g_cu.real_cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
  return LaunchCooperativeSlow<false>(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
}

extern "C" CUresult tessera_cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                           unsigned gz, unsigned bx, unsigned by, unsigned bz,
                                                           unsigned shmem, CUstream stream, void** params) {
  if (__builtin_expect(FastLaunch(KernelKey(f, gx, gy, gz, bx, by, bz, shmem) ^ 0xc0), 1))
    return g_cu.real_cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
  return LaunchCooperativeSlow<true>(f, gx, gy, gz, bx, by, bz, shmem, stream, params);
}

extern "C" CUresult tessera_cuGraphLaunch(CUgraphExec exec, CUstream stream) {
  if (g_graph_memory_execs.load(std::memory_order_relaxed) != 0)
    return LaunchGraphWithMemory<false>(exec, stream);
  if (__builtin_expect(FastLaunch(GraphKey(exec)), 1)) return g_cu.real_cuGraphLaunch(exec, stream);
  return GraphLaunchSlow<false>(exec, stream);
}

extern "C" CUresult tessera_cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  if (g_graph_memory_execs.load(std::memory_order_relaxed) != 0)
    return LaunchGraphWithMemory<true>(exec, stream);
  if (__builtin_expect(FastLaunch(GraphKey(exec)), 1)) return g_cu.real_cuGraphLaunch_ptsz(exec, stream);
  return GraphLaunchSlow<true>(exec, stream);
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
