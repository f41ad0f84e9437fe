// A fake CUDA driver (libcuda.so.1) for tests without a GPU: the driver API that libtessera-cuda.so and its
// tests use, over the simulated GPUs of fake_state.h. Kernels are "spin" kernels whose duration in
// nanoseconds is the first kernel parameter (a uint64_t); they occupy the simulated GPU for that long.
// Every versioned entry point the hook intercepts exists under its own name, and cuGetProcAddress (both
// signatures) resolves names by version and per-thread-stream flag as the real driver does.
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "fake_state.h"
#include "hook/common/base.h"
#include "hook/cuda/cuda_api.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

using fakecuda::Lock;
using fakecuda::NowNs;
using fakecuda::Shared;
using fakecuda::State;
using fakecuda::Unlock;

struct Graph;
// A stream capture in progress (cuStreamBeginCapture*): its graph, mode and thread.
struct CaptureState {
  Graph* graph = nullptr;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool invalidated = false;
  bool to_existing_graph = false;
  unsigned long thread = 0;
};
struct Stream {
  int gpu = 0;
  uint64_t last_end = 0;
  Graph* capture = nullptr;  // the graph being captured (launches go into it instead of running)
  CaptureState capture_state;
};
struct Ctx {
  int gpu = 0;
  bool primary = false;
  int refs = 0;
  uint64_t stack_bytes = 0;  // cuCtxSetLimit
  uint64_t heap_bytes = 0;
  Stream default_stream;
};
struct Event {
  uint64_t ts = 0;
  bool recorded = false;
};
struct Function {
  char name[64];
  void* module = nullptr;  // the Module it came from (loaded lazily: its code arrives at the first launch)
  bool loaded = false;
};
struct GraphNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_KERNEL;
  CUDA_MEM_ALLOC_NODE_PARAMS alloc{};  // memory allocation nodes
  CUdeviceptr free_ptr = 0;            // memory free nodes
};
struct Graph {
  uint64_t duration_ns = 0;
  std::vector<std::pair<CUdeviceptr, uint64_t>> allocations;  // allocation nodes: address, size
  std::vector<CUdeviceptr> frees;                             // free nodes
  std::vector<GraphNode*> nodes;
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
struct Mapping {
  CUmemGenericAllocationHandle handle;
  uint64_t size;
};
std::unordered_map<uint64_t, int>* g_handle_refs = nullptr;   // VMM handle -> references, under g_mu
std::unordered_map<uint64_t, Mapping>* g_mappings = nullptr;  // va -> mapping, under g_mu
uint64_t g_next_va = 0x200000000ull;
uint64_t g_next_low_va = 0x10000000ull;
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

// --- The capture rules of cuda.h (cuThreadExchangeStreamCaptureMode): a thread in GLOBAL mode may not make
// potentially unsafe calls while any other thread captures in GLOBAL mode, nor while it captures itself
// (other than RELAXED); THREAD_LOCAL only for its own captures; RELAXED never. A prohibited call fails with
// CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the captures it interfered with.
thread_local CUstreamCaptureMode t_capture_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
std::vector<Stream*>* g_capturing = nullptr;  // under g_mu

unsigned long ThreadId() {
  return static_cast<unsigned long>(pthread_self());
}

// Whether the calling thread may make a potentially unsafe call now; invalidates what it would break.
bool UnsafeCallProhibited() {
  if (t_capture_mode == CU_STREAM_CAPTURE_MODE_RELAXED) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_capturing == nullptr) return false;
  bool prohibited = false;
  const unsigned long me = ThreadId();
  for (Stream* st : *g_capturing) {
    CaptureState& c = st->capture_state;
    const bool mine = c.thread == me && c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
    const bool others_global = c.thread != me && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                               t_capture_mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
    if (mine || others_global) {
      c.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited;
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

// Stream 0 and CU_STREAM_LEGACY are the context's legacy default stream; CU_STREAM_PER_THREAD (and stream 0
// in the _ptsz entry points) is the calling thread's own default stream: a different stream, captured apart.
thread_local Stream t_per_thread;
thread_local Ctx* t_per_thread_ctx = nullptr;
Stream* StreamOf(CUstream s) {
  if (s == nullptr || s == CU_STREAM_LEGACY) return t_ctx != nullptr ? &t_ctx->default_stream : nullptr;
  if (s == CU_STREAM_PER_THREAD) {
    if (t_ctx == nullptr) return nullptr;
    if (t_per_thread_ctx != t_ctx) {
      t_per_thread = Stream();
      t_per_thread.gpu = t_ctx->gpu;
      t_per_thread_ctx = t_ctx;
    }
    return &t_per_thread;
  }
  return reinterpret_cast<Stream*>(s);
}
CUstream Ptsz(CUstream s) {
  return s == nullptr ? CU_STREAM_PER_THREAD : s;
}

CUresult Charge(int gpu, int64_t bytes) {
  State* s = Shared();
  Lock(s);
  const bool ok = fakecuda::ChargeLocked(s, gpu, bytes);
  Unlock(s);
  return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

// `low`: an address below 4 GiB, for the legacy 32-bit entry points.
CUresult AllocDevice(uint64_t bytes, int gpu, uint64_t* out, bool low = false) {
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

// Stream-ordered pools (defined with the pool entry points below).
bool PoolFree(uint64_t ptr);
void ReleaseAtSynchronization();

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
GraphPool g_graph_pool[fakecuda::kMaxGpus];                    // by physical GPU, under g_mu
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

CUresult Capture(Stream* st, uint64_t ns);

// Puts a kernel of `ns` on the stream's GPU timeline.
CUresult Submit(CUstream hs, uint64_t ns) {
  Stream* st = StreamOf(hs);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (st->capture != nullptr) return Capture(st, ns);
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
  Charge(g_visible[c->gpu],
         -static_cast<int64_t>(Shared()->context_bytes + c->stack_bytes + c->heap_bytes));
  if (t_ctx == c) t_ctx = nullptr;
  delete c;
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

// --- Contexts
// ------------------------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUresult r = NewContext(pctx, dev, false);
  if (r == CUDA_SUCCESS) t_ctx = reinterpret_cast<Ctx*>(*pctx);
  return r;
}
FAKE_EXPORT CUresult cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuCtxCreate_v2(pctx, flags, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam*, int, unsigned int flags,
                                    CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuCtxCreate_v2(pctx, flags, dev);
}
FAKE_EXPORT CUresult cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams*, unsigned int flags, CUdevice dev) {
  if (pctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  if (ctx == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = t_ctx->gpu;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSynchronize() {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  SleepUntil(Shared()->gpus[g_visible[t_ctx->gpu]].busy_until_ns);
  ReleaseAtSynchronization();
  return CUDA_SUCCESS;
}
// CUDA 13: the context is named (null: the current one).
FAKE_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx) {
  if (dev == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Ctx* c = ctx != nullptr ? reinterpret_cast<Ctx*>(ctx) : t_ctx;
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  *dev = c->gpu;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSynchronize_v2(CUcontext ctx) {
  Ctx* c = ctx != nullptr ? reinterpret_cast<Ctx*>(ctx) : t_ctx;
  if (c == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  SleepUntil(Shared()->gpus[g_visible[c->gpu]].busy_until_ns);
  ReleaseAtSynchronization();
  return CUDA_SUCCESS;
}
// A context grows with what it is asked to keep: the stack of every resident thread and the malloc heap.
FAKE_EXPORT CUresult cuCtxSetLimit(CUlimit limit, size_t value) {
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  uint64_t* current = nullptr;
  uint64_t bytes = 0;
  if (limit == CU_LIMIT_STACK_SIZE) {
    current = &t_ctx->stack_bytes;
    bytes = static_cast<uint64_t>(value) * 2048;  // 2048 resident threads, to keep numbers small
  } else if (limit == CU_LIMIT_MALLOC_HEAP_SIZE) {
    current = &t_ctx->heap_bytes;
    bytes = value;
  } else {
    return CUDA_SUCCESS;
  }
  const CUresult r = Charge(g_visible[t_ctx->gpu], static_cast<int64_t>(bytes) - static_cast<int64_t>(*current));
  if (r == CUDA_SUCCESS) *current = bytes;
  return r;
}

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
  if (a == nullptr || d == nullptr) return CUDA_ERROR_INVALID_VALUE;
  uint64_t h = 0;
  const CUresult r = NewArray(FakeArrayBytes(d->Width, d->Height, 1, d->NumChannels), &h);
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
  const CUresult r = NewArray(FakeArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels), &h);
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
  const CUresult r =
      NewArray(FakeArrayBytes(d->Width, d->Height, d->Depth, d->NumChannels) * 2 * (n > 0 ? 1 : 1), &h);
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
std::vector<Pool*>* g_pools = nullptr;                            // under g_mu
Pool* g_default_pool[fakecuda::kMaxGpus] = {};                    // by visible ordinal, under g_mu
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
// A pool pointer goes back to its pool. False when `ptr` is not one.
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
}  // namespace

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
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD: *v = p->threshold; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: *v = p->reserved; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH: *v = p->reserved_high; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT: *v = p->used; return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH: *v = p->used_high; return CUDA_SUCCESS;
    default: *static_cast<int*>(value) = 1; return CUDA_SUCCESS;
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

// --- Modules, streams, events, launches
// ----------------------------------------------------------------------------

// A module (or library) takes device memory in its context for its code and data: FAKECUDA_MODULE_BYTES
// (default 4 MiB), given back when it is unloaded.
namespace {
struct Module {
  int gpu = 0;
  uint64_t bytes = 0;
};
uint64_t ModuleBytes() {
  const char* v = getenv("FAKECUDA_MODULE_BYTES");
  uint64_t out = 4ull << 20;
  if (v != nullptr) tessera::hook::ParseByteSize(v, &out);
  return out;
}
CUresult LoadModule(void** handle) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (t_ctx == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  Module* m = new Module();
  m->gpu = g_visible[t_ctx->gpu];
  m->bytes = ModuleBytes();
  const CUresult r = Charge(m->gpu, static_cast<int64_t>(m->bytes));
  if (r != CUDA_SUCCESS) {
    delete m;
    return r;
  }
  *handle = m;
  return CUDA_SUCCESS;
}
CUresult UnloadModule(void* handle) {
  if (handle == nullptr) return CUDA_ERROR_INVALID_HANDLE;
  Module* m = static_cast<Module*>(handle);
  Charge(m->gpu, -static_cast<int64_t>(m->bytes));
  delete m;
  return CUDA_SUCCESS;
}
}  // namespace

// CUDA_MODULE_LOADING=LAZY (the default since CUDA 12.2): a kernel's code is loaded into the context at its
// first launch; FAKECUDA_LAZY_BYTES (default 0) of device memory each, given back with the module.
static void LoadLazily(CUfunction f) {
  Function* fn = reinterpret_cast<Function*>(f);
  if (fn == nullptr || fn->loaded || fn->module == nullptr) return;
  fn->loaded = true;
  const char* v = getenv("FAKECUDA_LAZY_BYTES");
  uint64_t bytes = 0;
  if (v == nullptr || !tessera::hook::ParseByteSize(v, &bytes) || bytes == 0) return;
  Module* m = static_cast<Module*>(fn->module);
  if (Charge(m->gpu, static_cast<int64_t>(bytes)) == CUDA_SUCCESS) m->bytes += bytes;
}

FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* m, const void*) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(m));
}
FAKE_EXPORT CUresult cuModuleLoad(CUmodule* m, const char*) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(m));
}
FAKE_EXPORT CUresult cuModuleLoadDataEx(CUmodule* m, const void*, unsigned int, CUjit_option*, void**) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(m));
}
FAKE_EXPORT CUresult cuModuleLoadFatBinary(CUmodule* m, const void*) {
  if (m == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(m));
}
FAKE_EXPORT CUresult cuModuleUnload(CUmodule m) {
  return UnloadModule(m);
}
FAKE_EXPORT CUresult cuLibraryLoadData(CUlibrary* l, const void*, CUjit_option*, void**, unsigned int,
                                       CUlibraryOption*, void**, unsigned int) {
  if (l == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(l));
}
FAKE_EXPORT CUresult cuLibraryLoadFromFile(CUlibrary* l, const char*, CUjit_option*, void**, unsigned int,
                                           CUlibraryOption*, void**, unsigned int) {
  if (l == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return LoadModule(reinterpret_cast<void**>(l));
}
FAKE_EXPORT CUresult cuLibraryUnload(CUlibrary l) {
  return UnloadModule(l);
}
// A green context: a context of its own on part of the GPU (a quarter of a context's memory here).
FAKE_EXPORT CUresult cuGreenCtxCreate(CUgreenCtx* g, CUdevResourceDesc, CUdevice dev, unsigned int) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (!ValidDevice(dev)) return CUDA_ERROR_INVALID_DEVICE;
  Module* m = new Module();
  m->gpu = g_visible[dev];
  m->bytes = Shared()->context_bytes / 4;
  const CUresult r = Charge(m->gpu, static_cast<int64_t>(m->bytes));
  if (r != CUDA_SUCCESS) {
    delete m;
    return r;
  }
  *g = reinterpret_cast<CUgreenCtx>(m);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGreenCtxDestroy(CUgreenCtx g) {
  return UnloadModule(g);
}
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name) {
  if (f == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Function* fn = new Function();
  fn->module = m;
  snprintf(fn->name, sizeof(fn->name), "%s", name);
  *f = reinterpret_cast<CUfunction>(fn);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int) {
  if (s == nullptr) return CUDA_ERROR_INVALID_VALUE;
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
  ReleaseAtSynchronization();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream s) {
  return cuStreamSynchronize(s == nullptr ? CU_STREAM_PER_THREAD : s);
}
FAKE_EXPORT CUresult cuStreamIsCapturing(CUstream s, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = StreamOf(s);
  *status = st == nullptr || st->capture == nullptr ? CU_STREAM_CAPTURE_STATUS_NONE
            : st->capture_state.invalidated           ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                                      : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventCreate(CUevent* e, unsigned int) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *e = reinterpret_cast<CUevent>(new Event());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent e) {
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
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
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  Event* ev = reinterpret_cast<Event*>(e);
  return NowNs() >= ev->ts ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent e) {
  if (UnsafeCallProhibited()) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
  SleepUntil(reinterpret_cast<Event*>(e)->ts);
  ReleaseAtSynchronization();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) {
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Event* x = reinterpret_cast<Event*>(a);
  Event* y = reinterpret_cast<Event*>(b);
  if (!x->recorded || !y->recorded) return CUDA_ERROR_INVALID_HANDLE;
  if (NowNs() < y->ts || NowNs() < x->ts) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>((static_cast<double>(y->ts) - static_cast<double>(x->ts)) / 1e6);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  if (ms == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuEventElapsedTime_v2(ms, a, b);
}
FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                    unsigned, CUstream s, void** params, void**) {
  LoadLazily(f);
  return Submit(s, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c, unsigned d,
                                         unsigned e, unsigned g, unsigned h, CUstream s, void** params,
                                         void** x) {
  return cuLaunchKernel(f, a, b, c, d, e, g, h, Ptsz(s), params, x);
}
FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void**) {
  LoadLazily(f);
  return Submit(c->hStream, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f, void** p, void** x) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  CUlaunchConfig copy = *c;
  copy.hStream = Ptsz(c->hStream);
  return cuLaunchKernelEx(&copy, f, p, x);
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel(CUfunction f, unsigned, unsigned, unsigned, unsigned, unsigned,
                                               unsigned, unsigned, CUstream s, void** params) {
  LoadLazily(f);
  return Submit(s, KernelNs(params));
}
FAKE_EXPORT CUresult cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned a, unsigned b, unsigned c,
                                                    unsigned d, unsigned e, unsigned g, unsigned h,
                                                    CUstream s, void** p) {
  return cuLaunchCooperativeKernel(f, a, b, c, d, e, g, h, Ptsz(s), p);
}

// --- Graphs: a graph runs its kernels back to back
// -------------------------------------------------------------------

FAKE_EXPORT CUresult cuGraphCreate(CUgraph* g, unsigned int) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* gr = new Graph();
  gr->gpu = CurrentGpu() < 0 ? 0 : CurrentGpu();
  *g = reinterpret_cast<CUgraph>(gr);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                             const CUDA_KERNEL_NODE_PARAMS* p) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  reinterpret_cast<Graph*>(g)->duration_ns += KernelNs(p->kernelParams);
  *n = reinterpret_cast<CUgraphNode>(new int(0));
  return CUDA_SUCCESS;
}
namespace {
CUresult AddAllocNode(CUgraphNode* n, CUgraph g, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (g == nullptr || p == nullptr || p->bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
  const int dev = p->poolProps.location.id;
  if (p->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !ValidDevice(dev)) {
    return CUDA_ERROR_INVALID_DEVICE;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    p->dptr = g_next_va;  // an address only: no memory until a launch maps it
    g_next_va += (p->bytesize + 4095) / 4096 * 4096 + 4096;
  }
  Graph* gr = reinterpret_cast<Graph*>(g);
  gr->allocations.emplace_back(p->dptr, p->bytesize);
  GraphNode* node = new GraphNode();
  node->type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
  node->alloc = *p;
  gr->nodes.push_back(node);
  *n = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}
CUresult AddFreeNode(CUgraphNode* n, CUgraph g, CUdeviceptr ptr) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* gr = reinterpret_cast<Graph*>(g);
  gr->frees.push_back(ptr);
  GraphNode* node = new GraphNode();
  node->type = CU_GRAPH_NODE_TYPE_MEM_FREE;
  node->free_ptr = ptr;
  gr->nodes.push_back(node);
  *n = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                            CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AddAllocNode(n, g, p);
}
FAKE_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t, CUdeviceptr ptr) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AddFreeNode(n, g, ptr);
}
// The generic form (CUDA 12.2/12.3): memory nodes as above; other node types add nothing to run here.
FAKE_EXPORT CUresult cuGraphAddNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t, CUgraphNodeParams* p) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (p->type == CU_GRAPH_NODE_TYPE_MEM_ALLOC) {
    CUDA_MEM_ALLOC_NODE_PARAMS a{p->alloc.poolProps, p->alloc.accessDescs, p->alloc.accessDescCount,
                                 p->alloc.bytesize, 0};
    const CUresult r = AddAllocNode(n, g, &a);
    if (r == CUDA_SUCCESS) p->alloc.dptr = a.dptr;
    return r;
  }
  if (p->type == CU_GRAPH_NODE_TYPE_MEM_FREE) {
    CUdeviceptr ptr = 0;
    memcpy(&ptr, &p->alloc, sizeof(ptr));  // CUDA_MEM_FREE_NODE_PARAMS { CUdeviceptr dptr; }
    return AddFreeNode(n, g, ptr);
  }
  GraphNode* node = new GraphNode();
  node->type = p->type;
  reinterpret_cast<Graph*>(g)->nodes.push_back(node);
  *n = reinterpret_cast<CUgraphNode>(node);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode* d, const CUgraphEdgeData*,
                                       size_t nd, CUgraphNodeParams* p) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuGraphAddNode(n, g, d, nd, p);
}
FAKE_EXPORT CUresult cuGraphGetNodes(CUgraph g, CUgraphNode* nodes, size_t* count) {
  if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (g == nullptr || count == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* gr = reinterpret_cast<Graph*>(g);
  if (nodes == nullptr) {
    *count = gr->nodes.size();
    return CUDA_SUCCESS;
  }
  const size_t n = *count < gr->nodes.size() ? *count : gr->nodes.size();
  for (size_t i = 0; i < n; ++i) nodes[i] = reinterpret_cast<CUgraphNode>(gr->nodes[i]);
  *count = n;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphNodeGetType(CUgraphNode n, CUgraphNodeType* type) {
  if (type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (n == nullptr || type == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *type = reinterpret_cast<GraphNode*>(n)->type;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphMemAllocNodeGetParams(CUgraphNode n, CUDA_MEM_ALLOC_NODE_PARAMS* p) {
  if (p == nullptr) return CUDA_ERROR_INVALID_VALUE;
  GraphNode* node = reinterpret_cast<GraphNode*>(n);
  if (node == nullptr || p == nullptr || node->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC) return CUDA_ERROR_INVALID_VALUE;
  *p = node->alloc;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec* e, CUgraph g, unsigned long long) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Graph* src = reinterpret_cast<Graph*>(g);
  Graph* copy = new Graph();
  copy->duration_ns = src->duration_ns;
  copy->allocations = src->allocations;
  copy->frees = src->frees;
  copy->gpu = src->gpu;
  *e = reinterpret_cast<CUgraphExec>(copy);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec* e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS*) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuGraphInstantiateWithFlags(e, g, 0);
}
FAKE_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* e, CUgraph g, CUDA_GRAPH_INSTANTIATE_PARAMS*) {
  if (e == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuGraphInstantiateWithFlags(e, g, 0);
}
FAKE_EXPORT CUresult cuGraphLaunch(CUgraphExec e, CUstream s) {
  Graph* gr = reinterpret_cast<Graph*>(e);
  Stream* st = StreamOf(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  for (const auto& [ptr, bytes] : gr->allocations) {
    const CUresult r = GraphMap(g_visible[st->gpu], ptr, bytes);
    if (r != CUDA_SUCCESS) return r;
  }
  for (CUdeviceptr ptr : gr->frees) GraphFree(ptr);
  return Submit(s, gr->duration_ns);
}
FAKE_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec e, CUstream s) {
  return cuGraphLaunch(e, Ptsz(s));
}
FAKE_EXPORT CUresult cuGraphExecDestroy(CUgraphExec e) {
  delete reinterpret_cast<Graph*>(e);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g) {
  Graph* gr = reinterpret_cast<Graph*>(g);
  for (GraphNode* n : gr->nodes) delete n;
  delete gr;  // allocations it made and nobody freed stay allocated
  return CUDA_SUCCESS;
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
    case CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT: *v = p.used; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_USED_MEM_HIGH: *v = p.used_high; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT: *v = p.reserved; return CUDA_SUCCESS;
    case CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH: *v = p.reserved_high; return CUDA_SUCCESS;
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
FAKE_EXPORT CUresult cuMemPrefetchAsync_v2(CUdeviceptr ptr, size_t count, CUmemLocation to, unsigned int, CUstream) {
  return Prefetch(ptr, count, to);
}
FAKE_EXPORT CUresult cuMemPrefetchAsync_v2_ptsz(CUdeviceptr ptr, size_t count, CUmemLocation to, unsigned int,
                                                CUstream) {
  return Prefetch(ptr, count, to);
}
FAKE_EXPORT CUresult cuMemPrefetchBatchAsync(CUdeviceptr* ptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                                             size_t* loc_idx, size_t nlocs, unsigned long long, CUstream) {
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
                                                            CUmemLocation* locs, size_t* loc_idx, size_t nlocs,
                                                            unsigned long long flags, CUstream s) {
  return cuMemPrefetchBatchAsync(ptrs, sizes, count, locs, loc_idx, nlocs, flags, s);
}
FAKE_EXPORT CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice) {
  return g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}
FAKE_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr, size_t, CUmem_advise, CUmemLocation) {
  return g_initialized ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

// --- Stream capture: launches on a capturing stream become the captured graph's kernels
// ------------------------------

namespace {
CUresult Capture(Stream* st, uint64_t ns) {
  st->capture->duration_ns += ns;
  return CUDA_SUCCESS;
}
}  // namespace

namespace {
CUresult BeginCapture(CUstream s, Graph* into, CUstreamCaptureMode mode) {
  Stream* st = StreamOf(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (s == nullptr || s == CU_STREAM_LEGACY) return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;  // legacy stream
  if (st->capture != nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  st->capture = into != nullptr ? into : new Graph();
  st->capture->gpu = st->gpu;
  st->capture_state = CaptureState{st->capture, mode, false, into != nullptr, ThreadId()};
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_capturing == nullptr) g_capturing = new std::vector<Stream*>();
  g_capturing->push_back(st);
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUresult cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return BeginCapture(s, nullptr, mode);
}
FAKE_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return BeginCapture(s == nullptr ? CU_STREAM_PER_THREAD : s, nullptr, mode);
}
FAKE_EXPORT CUresult cuStreamBeginCapture(CUstream s) {
  return BeginCapture(s, nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream s) {
  return BeginCapture(s == nullptr ? CU_STREAM_PER_THREAD : s, nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode*, const CUgraphEdgeData*,
                                                 size_t, CUstreamCaptureMode mode) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return BeginCapture(s, reinterpret_cast<Graph*>(g), mode);
}
FAKE_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* d,
                                                      const CUgraphEdgeData* e, size_t n, CUstreamCaptureMode mode) {
  return cuStreamBeginCaptureToGraph(s == nullptr ? CU_STREAM_PER_THREAD : s, g, d, e, n, mode);
}
FAKE_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const CUstreamCaptureMode old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamEndCapture(CUstream s, CUgraph* graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  Stream* st = StreamOf(s);
  if (st == nullptr) return CUDA_ERROR_INVALID_CONTEXT;
  if (st->capture == nullptr) return CUDA_ERROR_ILLEGAL_STATE;
  if (st->capture_state.thread != ThreadId() && st->capture_state.mode != CU_STREAM_CAPTURE_MODE_RELAXED) {
    return CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    for (size_t i = 0; g_capturing != nullptr && i < g_capturing->size(); ++i) {
      if ((*g_capturing)[i] == st) {
        g_capturing->erase(g_capturing->begin() + static_cast<long>(i));
        break;
      }
    }
  }
  Graph* g = st->capture;
  const bool invalidated = st->capture_state.invalidated;
  const bool existing = st->capture_state.to_existing_graph;
  st->capture = nullptr;
  st->capture_state = CaptureState{};
  if (invalidated) {
    if (!existing) delete g;
    *graph = nullptr;
    return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  }
  *graph = reinterpret_cast<CUgraph>(g);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream s, CUgraph* graph) {
  if (graph == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuStreamEndCapture(s == nullptr ? CU_STREAM_PER_THREAD : s, graph);
}
FAKE_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream s, CUstreamCaptureStatus* status) {
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return cuStreamIsCapturing(s == nullptr ? CU_STREAM_PER_THREAD : s, status);
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
