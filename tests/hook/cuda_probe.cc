// cuda_probe: a small CUDA driver API program for the hook's tests and benchmarks. It reaches the driver the
// way real programs do, never by linking: dlopen("libcuda.so.1"), then every entry point either with dlsym()
// or through cuGetProcAddress (CUDA 11.3 signature or CUDA 12 _v2 signature), and runs the operations named
// on its command line, one output line each. Run it under LD_PRELOAD=libtessera-cuda.so against the fake
// driver (LD_LIBRARY_PATH=build/fakecuda) or, for what needs no fake kernel, against a real driver.
//
//   cuda_probe <dlsym|proc11|proc12> init ctx alloc 1048576 meminfo freeall
//   -> "init 0", "ctx 0", "alloc 0 1048576", "meminfo 0 <free> <total>", "freeall 0"
//
// Operations (rc is the CUresult, 0 = success):
//   init | ctx [ordinal] | alloc N | alloc32 N | pitch W H | managed N | host N | array W H | array32 W H
//   | array3d W H D | mipmap W H LEVELS | vmm N | async N | pool N | graphalloc N | ctxcreate
//   | freeall | freeslowly PAUSE_MS | meminfo | meminfo32 | totalmem | nvml | launch COUNT NS | ex COUNT NS
//   | coop COUNT NS | graph COUNT NS | spin SECONDS NS | spinthreads THREADS SECONDS NS | watch NS WINDOW_MS
//   | fill STEP | texfill W H LEVELS FORMAT CHANNELS
//   | retryalloc N TIMEOUT_MS | churn SECONDS MAXBYTES | ready | sleep MS | exit CODE
// "fill STEP" allocates STEP bytes at a time until refused and prints how much it got; "texfill" creates
// W x H arrays (LEVELS 0) or mipmapped arrays of LEVELS levels, of FORMAT (cuda.h's code) x CHANNELS,
// until one is refused, and prints how many it got; "spin" launches
// kernels of NS nanoseconds back to back for SECONDS and prints the kernel time it completed and the wall
// time ("spinthreads" the same from THREADS threads at once); "watch" does the same until stdin closes,
// printing "watch <share> <meminfo total> <rc>" each window; "churn" allocates and frees random sizes through
// every path until SECONDS pass (for kill tests); "ready" prints "ready" and waits for a line on stdin.
#include <dlfcn.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "hook/cuda/cuda_api.h"
#include "hook/cuda/nvml_types.h"

namespace {

enum class Via { kDlsym, kProc11, kProc12 };

Via g_via = Via::kDlsym;
void* g_lib = nullptr;
PFN_cuGetProcAddress_v11030 g_proc11 = nullptr;
PFN_cuGetProcAddress_v12000 g_proc12 = nullptr;

[[noreturn]] void Die(const char* what) {
  fprintf(stderr, "cuda_probe: %s\n", what);
  exit(2);
}

// `symbol` is the exact exported name (for dlsym); `base` and `version` are what the CUDA runtime would ask
// cuGetProcAddress for; `ptsz` asks for the per-thread-default-stream variant.
void* Resolve(const char* symbol, const char* base, int version, bool ptsz = false) {
  void* p = nullptr;
  const cuuint64_t flags = ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : CU_GET_PROC_ADDRESS_DEFAULT;
  switch (g_via) {
    case Via::kDlsym:
      p = dlsym(g_lib, symbol);
      break;
    case Via::kProc11:
      if (g_proc11(base, &p, version, flags) != CUDA_SUCCESS) p = nullptr;
      break;
    case Via::kProc12: {
      CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
      if (g_proc12(base, &p, version, flags, &status) != CUDA_SUCCESS ||
          status != CU_GET_PROC_ADDRESS_SUCCESS) {
        p = nullptr;
      }
      break;
    }
  }
  if (p == nullptr) {
    fprintf(stderr, "cuda_probe: cannot resolve %s\n", symbol);
    exit(2);
  }
  return p;
}

template <typename T>
T Get(const char* symbol, const char* base, int version, bool ptsz = false) {
  return reinterpret_cast<T>(Resolve(symbol, base, version, ptsz));
}

#define CU(sym, base, pfn, version) Get<pfn>(#sym, #base, version)

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

struct Held {
  enum Kind { kLinear, kLinear32, kHost, kArray, kMipmap, kVmm, kAsync, kGraph } kind;
  uint64_t handle;
  uint64_t va;
  uint64_t bytes;
};

std::vector<Held> g_held;
CUfunction g_kernel = nullptr;
CUmemoryPool g_pool = nullptr;

uint64_t Arg(char** argv, int* i, int argc) {
  if (*i + 1 >= argc) Die("missing a number after an operation");
  return strtoull(argv[++*i], nullptr, 0);
}

CUfunction Kernel() {
  if (g_kernel == nullptr) {
    CUmodule m = nullptr;
    if (CU(cuModuleLoadData, cuModuleLoadData, PFN_cuModuleLoadData_v2000, 2000)(&m, "fake") !=
            CUDA_SUCCESS ||
        CU(cuModuleGetFunction, cuModuleGetFunction, PFN_cuModuleGetFunction_v2000, 2000)(
            &g_kernel, m, "spin") != CUDA_SUCCESS) {
      Die("cannot load the spin kernel (is this the fake driver?)");
    }
  }
  return g_kernel;
}

int Alloc(const char* what, uint64_t bytes) {
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  Held h{Held::kLinear, 0, 0, bytes};
  if (strcmp(what, "alloc") == 0) {
    CUdeviceptr p = 0;
    r = CU(cuMemAlloc_v2, cuMemAlloc, PFN_cuMemAlloc_v3020, 3020)(&p, bytes);
    h.handle = p;
  } else if (strcmp(what, "alloc32") == 0) {
    CUdeviceptr_v1 p = 0;
    r = CU(cuMemAlloc, cuMemAlloc, PFN_cuMemAlloc_v2000, 2000)(&p, static_cast<unsigned>(bytes));
    h = {Held::kLinear32, p, 0, bytes};
  } else if (strcmp(what, "managed") == 0) {
    CUdeviceptr p = 0;
    r = CU(cuMemAllocManaged, cuMemAllocManaged, PFN_cuMemAllocManaged_v6000, 6000)(&p, bytes, 1);
    h.handle = p;
  } else if (strcmp(what, "host") == 0) {
    void* p = nullptr;
    r = CU(cuMemAllocHost_v2, cuMemAllocHost, PFN_cuMemAllocHost_v3020, 3020)(&p, bytes);
    h = {Held::kHost, reinterpret_cast<uint64_t>(p), 0, bytes};
  } else if (strcmp(what, "vmm") == 0) {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    CUmemGenericAllocationHandle handle = 0;
    r = CU(cuMemCreate, cuMemCreate, PFN_cuMemCreate_v10020, 10020)(&handle, bytes, &prop, 0);
    if (r == CUDA_SUCCESS) {
      CUdeviceptr va = 0;
      if (CU(cuMemAddressReserve, cuMemAddressReserve, PFN_cuMemAddressReserve_v10020, 10020)(
              &va, bytes, 0, 0, 0) != CUDA_SUCCESS ||
          CU(cuMemMap, cuMemMap, PFN_cuMemMap_v10020, 10020)(va, bytes, 0, handle, 0) != CUDA_SUCCESS) {
        Die("cuMemAddressReserve/cuMemMap failed");
      }
      h = {Held::kVmm, handle, va, bytes};
    }
  } else if (strcmp(what, "async") == 0) {
    CUdeviceptr p = 0;
    r = CU(cuMemAllocAsync, cuMemAllocAsync, PFN_cuMemAllocAsync_v11020, 11020)(&p, bytes, nullptr);
    h = {Held::kAsync, p, 0, bytes};
  } else if (strcmp(what, "pool") == 0) {
    if (g_pool == nullptr) {
      CUmemPoolProps props{};
      props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
      props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      props.location.id = 0;
      if (CU(cuMemPoolCreate, cuMemPoolCreate, PFN_cuMemPoolCreate_v11020, 11020)(&g_pool, &props) !=
          CUDA_SUCCESS) {
        Die("cuMemPoolCreate failed");
      }
    }
    CUdeviceptr p = 0;
    r = CU(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, PFN_cuMemAllocFromPoolAsync_v11020, 11020)(
        &p, bytes, g_pool, nullptr);
    h = {Held::kAsync, p, 0, bytes};
  } else if (strcmp(what, "graphalloc") == 0) {
    CUgraph g = nullptr;
    if (CU(cuGraphCreate, cuGraphCreate, PFN_cuGraphCreate_v10000, 10000)(&g, 0) != CUDA_SUCCESS) {
      Die("cuGraphCreate failed");
    }
    CUDA_MEM_ALLOC_NODE_PARAMS params{};
    params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    params.poolProps.location.id = 0;
    params.bytesize = bytes;
    // Graph memory is mapped when the graph is launched: add the node, instantiate, launch, synchronize.
    CUgraphNode node = nullptr;
    r = CU(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, PFN_cuGraphAddMemAllocNode_v11040, 11040)(
        &node, g, nullptr, 0, &params);
    CUgraphExec e = nullptr;
    if (r == CUDA_SUCCESS) {
      r = CU(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040,
             11040)(&e, g, 0);
    }
    if (r == CUDA_SUCCESS) r = CU(cuGraphLaunch, cuGraphLaunch, PFN_cuGraphLaunch_v10000, 10000)(e, nullptr);
    if (r == CUDA_SUCCESS) CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)();
    if (e != nullptr) CU(cuGraphExecDestroy, cuGraphExecDestroy, PFN_cuGraphExecDestroy_v10000, 10000)(e);
    CU(cuGraphDestroy, cuGraphDestroy, PFN_cuGraphDestroy_v10000, 10000)(g);
    h = {Held::kGraph, params.dptr, 0, bytes};
  } else {
    Die("unknown allocation");
  }
  if (r == CUDA_SUCCESS) g_held.push_back(h);
  return r;
}

int Array(const char* what, uint64_t w, uint64_t hgt, uint64_t d) {
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  Held h{Held::kArray, 0, 0, w * hgt * (d == 0 ? 1 : d) * 4};
  if (strcmp(what, "array") == 0) {
    CUDA_ARRAY_DESCRIPTOR desc{w, hgt, CU_AD_FORMAT_FLOAT, 1};
    CUarray a = nullptr;
    r = CU(cuArrayCreate_v2, cuArrayCreate, PFN_cuArrayCreate_v3020, 3020)(&a, &desc);
    h.handle = reinterpret_cast<uint64_t>(a);
  } else if (strcmp(what, "array32") == 0) {
    CUDA_ARRAY_DESCRIPTOR_v1 desc{static_cast<unsigned>(w), static_cast<unsigned>(hgt), CU_AD_FORMAT_FLOAT,
                                  1};
    CUarray a = nullptr;
    r = CU(cuArrayCreate, cuArrayCreate, PFN_cuArrayCreate_v2000, 2000)(&a, &desc);
    h.handle = reinterpret_cast<uint64_t>(a);
  } else if (strcmp(what, "array3d") == 0) {
    CUDA_ARRAY3D_DESCRIPTOR desc{w, hgt, d, CU_AD_FORMAT_FLOAT, 1, 0};
    CUarray a = nullptr;
    r = CU(cuArray3DCreate_v2, cuArray3DCreate, PFN_cuArray3DCreate_v3020, 3020)(&a, &desc);
    h.handle = reinterpret_cast<uint64_t>(a);
  } else {  // mipmap: d is the number of levels
    CUDA_ARRAY3D_DESCRIPTOR desc{w, hgt, 0, CU_AD_FORMAT_FLOAT, 1, 0};
    CUmipmappedArray a = nullptr;
    r = CU(cuMipmappedArrayCreate, cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000, 5000)(
        &a, &desc, static_cast<unsigned>(d));
    h = {Held::kMipmap, reinterpret_cast<uint64_t>(a), 0, 0};
  }
  if (r == CUDA_SUCCESS) g_held.push_back(h);
  return r;
}

// One array of `format` x `channels` (cuda.h's CUarray_format: 1 uint8, 2 uint16, 16 half, 32 float...):
// cuArray3DCreate when `levels` is 0, else a mipmapped array of that many levels.
int TextureOf(uint64_t w, uint64_t hgt, unsigned levels, unsigned format, unsigned channels) {
  CUDA_ARRAY3D_DESCRIPTOR desc{w, hgt, 0, static_cast<CUarray_format>(format), channels, 0};
  CUresult r = CUDA_ERROR_INVALID_VALUE;
  if (levels == 0) {
    CUarray a = nullptr;
    r = CU(cuArray3DCreate_v2, cuArray3DCreate, PFN_cuArray3DCreate_v3020, 3020)(&a, &desc);
    if (r == CUDA_SUCCESS) g_held.push_back({Held::kArray, reinterpret_cast<uint64_t>(a), 0, 0});
  } else {
    CUmipmappedArray a = nullptr;
    r = CU(cuMipmappedArrayCreate, cuMipmappedArrayCreate, PFN_cuMipmappedArrayCreate_v5000, 5000)(&a, &desc,
                                                                                                   levels);
    if (r == CUDA_SUCCESS) g_held.push_back({Held::kMipmap, reinterpret_cast<uint64_t>(a), 0, 0});
  }
  return r;
}

int FreeOne(const Held& h) {
  switch (h.kind) {
    case Held::kLinear:
      return CU(cuMemFree_v2, cuMemFree, PFN_cuMemFree_v3020, 3020)(h.handle);
    case Held::kLinear32:
      return CU(cuMemFree, cuMemFree, PFN_cuMemFree_v2000, 2000)(static_cast<CUdeviceptr_v1>(h.handle));
    case Held::kHost:
      return CU(cuMemFreeHost, cuMemFreeHost, PFN_cuMemFreeHost_v2000,
                2000)(reinterpret_cast<void*>(h.handle));
    case Held::kArray:
      return CU(cuArrayDestroy, cuArrayDestroy, PFN_cuArrayDestroy_v2000,
                2000)(reinterpret_cast<CUarray>(h.handle));
    case Held::kMipmap:
      return CU(cuMipmappedArrayDestroy, cuMipmappedArrayDestroy, PFN_cuMipmappedArrayDestroy_v5000,
                5000)(reinterpret_cast<CUmipmappedArray>(h.handle));
    case Held::kVmm: {
      CU(cuMemUnmap, cuMemUnmap, PFN_cuMemUnmap_v10020, 10020)(h.va, h.bytes);
      CU(cuMemAddressFree, cuMemAddressFree, PFN_cuMemAddressFree_v10020, 10020)(h.va, h.bytes);
      return CU(cuMemRelease, cuMemRelease, PFN_cuMemRelease_v10020, 10020)(h.handle);
    }
    case Held::kAsync:
      return CU(cuMemFreeAsync, cuMemFreeAsync, PFN_cuMemFreeAsync_v11020, 11020)(h.handle, nullptr);
    case Held::kGraph: {
      // Freed back to the device's graph pool, which keeps it until trimmed.
      const CUresult r = CU(cuMemFree_v2, cuMemFree, PFN_cuMemFree_v3020, 3020)(h.handle);
      CU(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, PFN_cuDeviceGraphMemTrim_v11040, 11040)(0);
      return r;
    }
  }
  return CUDA_ERROR_INVALID_VALUE;
}

// Frees what is held one allocation at a time, `pause_ms` apart (a release spread over time), newest first.
int FreeSlowly(uint64_t pause_ms) {
  int worst = 0;
  while (!g_held.empty()) {
    const int r = FreeOne(g_held.back());
    if (r != 0) worst = r;
    g_held.pop_back();
    usleep(static_cast<useconds_t>(pause_ms) * 1000);
  }
  return worst;
}

int FreeAll() {
  int worst = 0;
  for (const Held& h : g_held) {
    const int r = FreeOne(h);
    if (r != 0) worst = r;
  }
  g_held.clear();
  // Stream-ordered frees reach the device at a synchronization (pools release what they keep above their
  // threshold there).
  CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)();
  return worst;
}

CUmemoryPool DefaultPool() {
  CUmemoryPool p = nullptr;
  if (CU(cuDeviceGetDefaultMemPool, cuDeviceGetDefaultMemPool, PFN_cuDeviceGetDefaultMemPool_v11020, 11020)(
          &p, 0) != CUDA_SUCCESS) {
    Die("cuDeviceGetDefaultMemPool failed");
  }
  return p;
}

struct GraphMem {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  CUdeviceptr ptr = 0;
} g_graphmem;

int Launch(const char* how, uint64_t count, uint64_t ns) {
  CUfunction f = Kernel();
  uint64_t value = ns;
  void* params[] = {&value};
  CUresult r = CUDA_SUCCESS;
  if (strcmp(how, "launch") == 0) {
    auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
    for (uint64_t i = 0; i < count && r == CUDA_SUCCESS; ++i)
      r = launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
  } else if (strcmp(how, "ex") == 0) {
    auto launch = CU(cuLaunchKernelEx, cuLaunchKernelEx, PFN_cuLaunchKernelEx_v11060, 11060);
    CUlaunchConfig config{};
    config.gridDimX = config.gridDimY = config.gridDimZ = 1;
    config.blockDimX = config.blockDimY = config.blockDimZ = 1;
    for (uint64_t i = 0; i < count && r == CUDA_SUCCESS; ++i) r = launch(&config, f, params, nullptr);
  } else if (strcmp(how, "coop") == 0) {
    auto launch =
        CU(cuLaunchCooperativeKernel, cuLaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000, 9000);
    for (uint64_t i = 0; i < count && r == CUDA_SUCCESS; ++i)
      r = launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params);
  } else {  // graph: capture 10 kernels on a stream, launch the graph count/10 times (at least once)
    CUstream s = nullptr;
    CU(cuStreamCreate, cuStreamCreate, PFN_cuStreamCreate_v2000, 2000)(&s, 0);
    CU(cuStreamBeginCapture_v2, cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10010, 10010)
    (s, CU_STREAM_CAPTURE_MODE_GLOBAL);
    auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
    for (int i = 0; i < 10; ++i) launch(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
    CUgraph g = nullptr;
    CU(cuStreamEndCapture, cuStreamEndCapture, PFN_cuStreamEndCapture_v10000, 10000)(s, &g);
    CUgraphExec e = nullptr;
    CU(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040,
       11040)
    (&e, g, 0);
    auto graph_launch = CU(cuGraphLaunch, cuGraphLaunch, PFN_cuGraphLaunch_v10000, 10000);
    for (uint64_t i = 0; i < (count < 10 ? 1 : count / 10) && r == CUDA_SUCCESS; ++i) r = graph_launch(e, s);
    CU(cuStreamSynchronize, cuStreamSynchronize, PFN_cuStreamSynchronize_v2000, 2000)(s);
    return r;
  }
  CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)();
  return r;
}

// Launches kernels of `ns` back to back for `seconds`, at most two in flight (as a real program that syncs).
void Spin(double seconds, uint64_t ns) {
  CUfunction f = Kernel();
  auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
  auto sync = CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000);
  uint64_t value = ns;
  void* params[] = {&value};
  const uint64_t start = NowNs();
  const uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
  uint64_t kernels = 0;
  while (NowNs() < end) {
    if (launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) Die("launch failed");
    ++kernels;
    if (kernels % 2 == 0) sync();
  }
  sync();
  printf("spin 0 %llu %llu %llu\n", static_cast<unsigned long long>(kernels * ns),
         static_cast<unsigned long long>(NowNs() - start), static_cast<unsigned long long>(kernels));
}

// Spin from `threads` threads at once on the calling thread's context; prints the kernel time they
// completed together.
void SpinThreads(int threads, double seconds, uint64_t ns) {
  CUfunction f = Kernel();
  CUcontext ctx = nullptr;
  if (CU(cuCtxGetCurrent, cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000, 4000)(&ctx) != CUDA_SUCCESS) {
    Die("no current context");
  }
  auto set = CU(cuCtxSetCurrent, cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000, 4000);
  auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
  auto sync = CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000);
  const uint64_t start = NowNs();
  const uint64_t end = start + static_cast<uint64_t>(seconds * 1e9);
  std::atomic<uint64_t> kernels{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      if (set(ctx) != CUDA_SUCCESS) Die("cuCtxSetCurrent failed in a thread");
      uint64_t value = ns;
      void* params[] = {&value};
      uint64_t mine = 0;
      while (NowNs() < end) {
        if (launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) Die("launch failed");
        if (++mine % 2 == 0) sync();
      }
      kernels.fetch_add(mine);
    });
  }
  for (std::thread& t : pool) t.join();
  sync();
  printf("spinthreads 0 %llu %llu %llu\n", static_cast<unsigned long long>(kernels.load() * ns),
         static_cast<unsigned long long>(NowNs() - start), static_cast<unsigned long long>(kernels.load()));
}

bool StdinClosed() {
  pollfd p{0, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  char c;
  return (p.revents & (POLLHUP | POLLERR)) != 0 || read(0, &c, 1) <= 0;
}

// A running tenant as a test watches it: kernels of `ns` back to back (as Spin) until stdin closes, and per
// window of `window_ms` one line "watch <kernel time / wall time> <cuMemGetInfo total>", so that the test sees
// the share and the memory limit in force change while the process runs.
void Watch(uint64_t ns, uint64_t window_ms) {
  CUfunction f = Kernel();
  auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
  auto sync = CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000);
  auto info = CU(cuMemGetInfo_v2, cuMemGetInfo, PFN_cuMemGetInfo_v3020, 3020);
  uint64_t value = ns;
  void* params[] = {&value};
  const uint64_t window = window_ms * 1000000ull;
  while (!StdinClosed()) {
    const uint64_t start = NowNs();
    uint64_t kernels = 0;
    while (NowNs() - start < window) {
      if (launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) != CUDA_SUCCESS) Die("launch failed");
      ++kernels;
      if (kernels % 2 == 0) sync();
    }
    sync();
    size_t free_bytes = 0;
    size_t total = 0;
    const CUresult r = info(&free_bytes, &total);
    printf("watch %.4f %zu %d\n", static_cast<double>(kernels * ns) / static_cast<double>(NowNs() - start), total,
           r);
  }
}

void Churn(double seconds, uint64_t max_bytes) {
  static const char* kPaths[] = {"alloc", "managed", "vmm", "async", "pool", "graphalloc"};
  const uint64_t end = NowNs() + static_cast<uint64_t>(seconds * 1e9);
  unsigned seed = static_cast<unsigned>(getpid());
  while (NowNs() < end) {
    const uint64_t bytes = 4096 + rand_r(&seed) % max_bytes;
    if (rand_r(&seed) % 3 != 0 || g_held.empty()) {
      if (rand_r(&seed) % 8 == 0) {
        Array("array", 64 + rand_r(&seed) % 1024, 64, 0);
      } else {
        Alloc(kPaths[rand_r(&seed) % 6], bytes);
      }
    } else {
      const size_t i = rand_r(&seed) % g_held.size();
      FreeOne(g_held[i]);
      g_held.erase(g_held.begin() + static_cast<long>(i));
    }
  }
  printf("churn 0 %zu\n", g_held.size());
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) Die("usage: cuda_probe <dlsym|proc11|proc12> OPERATION...");
  if (strcmp(argv[1], "dlsym") == 0)
    g_via = Via::kDlsym;
  else if (strcmp(argv[1], "proc11") == 0)
    g_via = Via::kProc11;
  else if (strcmp(argv[1], "proc12") == 0)
    g_via = Via::kProc12;
  else
    Die("the first argument is how to reach the driver: dlsym, proc11 or proc12");
  g_lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (g_lib == nullptr) Die(dlerror());
  g_proc11 = reinterpret_cast<PFN_cuGetProcAddress_v11030>(dlsym(g_lib, "cuGetProcAddress"));
  g_proc12 = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(g_lib, "cuGetProcAddress_v2"));
  if (g_proc11 == nullptr || g_proc12 == nullptr) Die("the driver has no cuGetProcAddress");

  for (int i = 2; i < argc; ++i) {
    const char* op = argv[i];
    if (strcmp(op, "init") == 0) {
      printf("init %d\n", CU(cuInit, cuInit, PFN_cuInit_v2000, 2000)(0));
    } else if (strcmp(op, "ctx") == 0) {
      int ordinal = 0;
      if (i + 1 < argc && argv[i + 1][0] >= '0' && argv[i + 1][0] <= '9') ordinal = atoi(argv[++i]);
      CUdevice dev = 0;
      CUcontext ctx = nullptr;
      CUresult r = CU(cuDeviceGet, cuDeviceGet, PFN_cuDeviceGet_v2000, 2000)(&dev, ordinal);
      if (r == CUDA_SUCCESS) {
        r = CU(cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000, 7000)(
            &ctx, dev);
      }
      if (r == CUDA_SUCCESS) r = CU(cuCtxSetCurrent, cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000, 4000)(ctx);
      printf("ctx %d\n", r);
    } else if (strcmp(op, "ctxcreate") == 0) {
      CUcontext ctx = nullptr;
      const CUresult r = CU(cuCtxCreate_v2, cuCtxCreate, PFN_cuCtxCreate_v3020, 3020)(&ctx, 0, 0);
      printf("ctxcreate %d\n", r);
      if (r == CUDA_SUCCESS) CU(cuCtxDestroy_v2, cuCtxDestroy, PFN_cuCtxDestroy_v4000, 4000)(ctx);
    } else if (strcmp(op, "alloc") == 0 || strcmp(op, "alloc32") == 0 || strcmp(op, "managed") == 0 ||
               strcmp(op, "host") == 0 || strcmp(op, "vmm") == 0 || strcmp(op, "async") == 0 ||
               strcmp(op, "pool") == 0 || strcmp(op, "graphalloc") == 0) {
      const uint64_t n = Arg(argv, &i, argc);
      printf("%s %d %llu\n", op, Alloc(op, n), static_cast<unsigned long long>(n));
    } else if (strcmp(op, "pitch") == 0) {
      const uint64_t w = Arg(argv, &i, argc);
      const uint64_t h = Arg(argv, &i, argc);
      CUdeviceptr p = 0;
      size_t pitch = 0;
      const CUresult r =
          CU(cuMemAllocPitch_v2, cuMemAllocPitch, PFN_cuMemAllocPitch_v3020, 3020)(&p, &pitch, w, h, 4);
      if (r == CUDA_SUCCESS) g_held.push_back({Held::kLinear, p, 0, pitch * h});
      printf("pitch %d %llu\n", r, static_cast<unsigned long long>(pitch * h));
    } else if (strcmp(op, "array") == 0 || strcmp(op, "array32") == 0 || strcmp(op, "array3d") == 0 ||
               strcmp(op, "mipmap") == 0) {
      const uint64_t w = Arg(argv, &i, argc);
      const uint64_t h = Arg(argv, &i, argc);
      const uint64_t d = strcmp(op, "array3d") == 0 || strcmp(op, "mipmap") == 0 ? Arg(argv, &i, argc) : 0;
      printf("%s %d\n", op, Array(op, w, h, d));
    } else if (strcmp(op, "freeall") == 0) {
      printf("freeall %d\n", FreeAll());
    } else if (strcmp(op, "freeslowly") == 0) {
      const uint64_t pause = Arg(argv, &i, argc);
      printf("freeslowly %d\n", FreeSlowly(pause));
    } else if (strcmp(op, "meminfo") == 0) {
      size_t free_bytes = 0;
      size_t total = 0;
      const CUresult r = CU(cuMemGetInfo_v2, cuMemGetInfo, PFN_cuMemGetInfo_v3020, 3020)(&free_bytes, &total);
      printf("meminfo %d %zu %zu\n", r, free_bytes, total);
    } else if (strcmp(op, "meminfo32") == 0) {
      unsigned free_bytes = 0;
      unsigned total = 0;
      const CUresult r = CU(cuMemGetInfo, cuMemGetInfo, PFN_cuMemGetInfo_v2000, 2000)(&free_bytes, &total);
      printf("meminfo32 %d %u %u\n", r, free_bytes, total);
    } else if (strcmp(op, "totalmem") == 0) {
      size_t total = 0;
      const CUresult r =
          CU(cuDeviceTotalMem_v2, cuDeviceTotalMem, PFN_cuDeviceTotalMem_v3020, 3020)(&total, 0);
      printf("totalmem %d %zu\n", r, total);
    } else if (strcmp(op, "nvml") == 0) {
      void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (nvml == nullptr) Die(dlerror());
      auto init = reinterpret_cast<nvmlInit_fn*>(dlsym(nvml, "nvmlInit_v2"));
      auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
          dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
      auto info = reinterpret_cast<nvmlDeviceGetMemoryInfo_fn*>(dlsym(nvml, "nvmlDeviceGetMemoryInfo"));
      auto info2 =
          reinterpret_cast<nvmlDeviceGetMemoryInfo_v2_fn*>(dlsym(nvml, "nvmlDeviceGetMemoryInfo_v2"));
      if (init == nullptr || by_index == nullptr || info == nullptr || info2 == nullptr)
        Die("NVML entry points");
      nvmlDevice_t dev = nullptr;
      nvmlMemory_t m{};
      nvmlMemory_v2_t m2{};
      m2.version = TESSERA_NVML_MEMORY_V2;
      int r = init();
      if (r == 0) r = by_index(0, &dev);
      if (r == 0) r = info(dev, &m);
      if (r == 0) r = info2(dev, &m2);
      printf("nvml %d %llu %llu %llu %llu\n", r, m.total, m.used, m2.total, m2.used);
    } else if (strcmp(op, "launch") == 0 || strcmp(op, "ex") == 0 || strcmp(op, "coop") == 0 ||
               strcmp(op, "graph") == 0) {
      const uint64_t count = Arg(argv, &i, argc);
      const uint64_t ns = Arg(argv, &i, argc);
      const uint64_t start = NowNs();
      const int r = Launch(op, count, ns);
      printf("%s %d %llu\n", op, r, static_cast<unsigned long long>(NowNs() - start));
    } else if (strcmp(op, "spin") == 0) {
      const double seconds = atof(argv[++i]);
      Spin(seconds, Arg(argv, &i, argc));
    } else if (strcmp(op, "spinthreads") == 0) {
      const int threads = static_cast<int>(Arg(argv, &i, argc));
      const double seconds = atof(argv[++i]);
      SpinThreads(threads, seconds, Arg(argv, &i, argc));
    } else if (strcmp(op, "watch") == 0) {
      const uint64_t ns = Arg(argv, &i, argc);
      Watch(ns, Arg(argv, &i, argc));
    } else if (strcmp(op, "fill") == 0) {
      const uint64_t step = Arg(argv, &i, argc);
      uint64_t got = 0;
      int r = 0;
      while ((r = Alloc("alloc", step)) == CUDA_SUCCESS) got += step;
      printf("fill %d %llu\n", r, static_cast<unsigned long long>(got));
    } else if (strcmp(op, "texfill") == 0) {
      const uint64_t w = Arg(argv, &i, argc);
      const uint64_t h = Arg(argv, &i, argc);
      const unsigned levels = static_cast<unsigned>(Arg(argv, &i, argc));
      const unsigned format = static_cast<unsigned>(Arg(argv, &i, argc));
      const unsigned channels = static_cast<unsigned>(Arg(argv, &i, argc));
      uint64_t count = 0;
      int r = 0;
      while ((r = TextureOf(w, h, levels, format, channels)) == CUDA_SUCCESS) ++count;
      printf("texfill %d %llu\n", r, static_cast<unsigned long long>(count));
    } else if (strcmp(op, "retryalloc") == 0) {
      const uint64_t n = Arg(argv, &i, argc);
      const uint64_t deadline = NowNs() + Arg(argv, &i, argc) * 1000000ull;
      int r = 0;
      while ((r = Alloc("alloc", n)) != CUDA_SUCCESS && NowNs() < deadline) usleep(20000);
      printf("retryalloc %d %llu\n", r, static_cast<unsigned long long>(n));
    } else if (strcmp(op, "churn") == 0) {
      const double seconds = atof(argv[++i]);
      Churn(seconds, Arg(argv, &i, argc));
    } else if (strcmp(op, "module") == 0) {
      // Loads one more module (it stays loaded); its code takes memory in the context.
      CUmodule m = nullptr;
      printf("module %d\n", CU(cuModuleLoadData, cuModuleLoadData, PFN_cuModuleLoadData_v2000, 2000)(&m, "fake"));
    } else if (strcmp(op, "library") == 0) {
      CUlibrary l = nullptr;
      const CUresult r = CU(cuLibraryLoadData, cuLibraryLoadData, PFN_cuLibraryLoadData_v12000, 12000)(
          &l, "fake", nullptr, nullptr, 0, nullptr, nullptr, 0);
      printf("library %d\n", r);
      if (r == CUDA_SUCCESS && i + 1 < argc && strcmp(argv[i + 1], "unload") == 0) {
        ++i;
        printf("unload %d\n", CU(cuLibraryUnload, cuLibraryUnload, PFN_cuLibraryUnload_v12000, 12000)(l));
      }
    } else if (strcmp(op, "heap") == 0) {
      const uint64_t n = Arg(argv, &i, argc);
      printf("heap %d\n",
             CU(cuCtxSetLimit, cuCtxSetLimit, PFN_cuCtxSetLimit_v3010, 3010)(CU_LIMIT_MALLOC_HEAP_SIZE, n));
    } else if (strcmp(op, "nvmlprocs") == 0) {
      // NVML's process list of GPU 0, v1 and v3: "nvmlprocs rc count pid:used... | rc count pid:used..."
      void* nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
      if (nvml == nullptr) Die(dlerror());
      auto init = reinterpret_cast<nvmlInit_fn*>(dlsym(nvml, "nvmlInit_v2"));
      auto by_index = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
          dlsym(nvml, "nvmlDeviceGetHandleByIndex_v2"));
      auto v1 = reinterpret_cast<nvmlDeviceGetRunningProcesses_v1_fn*>(
          dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses"));
      auto v3 = reinterpret_cast<nvmlDeviceGetRunningProcesses_fn*>(
          dlsym(nvml, "nvmlDeviceGetComputeRunningProcesses_v3"));
      if (init == nullptr || by_index == nullptr || v1 == nullptr || v3 == nullptr) Die("NVML entry points");
      nvmlDevice_t dev = nullptr;
      init();
      by_index(0, &dev);
      nvmlProcessInfo_v1_t a[64];
      nvmlProcessInfo_t b[64];
      unsigned na = 0;
      int ra = v1(dev, &na, nullptr);  // asks for the count
      unsigned need = na;
      na = 64;
      if (ra == NVML_SUCCESS || ra == NVML_ERROR_INSUFFICIENT_SIZE) ra = v1(dev, &na, a);
      unsigned nb = 64;
      const int rb = v3(dev, &nb, b);
      printf("nvmlprocs %d %u %u", ra, need, na);
      for (unsigned k = 0; k < na; ++k) printf(" %u:%llu", a[k].pid, a[k].usedGpuMemory);
      printf(" | %d %u", rb, nb);
      for (unsigned k = 0; k < nb; ++k) printf(" %u:%llu", b[k].pid, b[k].usedGpuMemory);
      printf("\n");
    } else if (strcmp(op, "capture") == 0) {
      // A kernel of NS nanoseconds (timed by the hook when limited), then a global-mode capture of one more
      // launch on a new stream, held for MS milliseconds: "capture <EndCapture rc>".
      const uint64_t ns = Arg(argv, &i, argc);
      const uint64_t ms = Arg(argv, &i, argc);
      CUfunction f = Kernel();
      uint64_t value = ns;
      void* params[] = {&value};
      auto launch = CU(cuLaunchKernel, cuLaunchKernel, PFN_cuLaunchKernel_v4000, 4000);
      CUstream s = nullptr;
      CU(cuStreamCreate, cuStreamCreate, PFN_cuStreamCreate_v2000, 2000)(&s, 0);
      launch(f, 1, 1, 1, 1, 1, 1, 0, s, params, nullptr);
      launch(f, 2, 1, 1, 1, 1, 1, 0, s, params, nullptr);
      const CUresult b =
          CU(cuStreamBeginCapture_v2, cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10010, 10010)(
              s, CU_STREAM_CAPTURE_MODE_GLOBAL);
      launch(f, 3, 1, 1, 1, 1, 1, 0, s, params, nullptr);
      usleep(static_cast<useconds_t>(ms * 1000));
      CUgraph g = nullptr;
      const CUresult e = CU(cuStreamEndCapture, cuStreamEndCapture, PFN_cuStreamEndCapture_v10000, 10000)(s, &g);
      printf("capture %d %d\n", b, e);
    } else if (strcmp(op, "poolkeep") == 0) {
      // PyTorch's cudaMallocAsync backend: pools keep everything freed (release threshold UINT64_MAX).
      cuuint64_t keep = ~0ull;
      auto set = CU(cuMemPoolSetAttribute, cuMemPoolSetAttribute, PFN_cuMemPoolSetAttribute_v11020, 11020);
      int r = set(DefaultPool(), CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
      if (r == CUDA_SUCCESS && g_pool == nullptr) Alloc("pool", 0);  // creates the pool only
      if (r == CUDA_SUCCESS && g_pool != nullptr) r = set(g_pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
      printf("poolkeep %d\n", r);
    } else if (strcmp(op, "trim") == 0) {
      const uint64_t keep = Arg(argv, &i, argc);
      auto trim = CU(cuMemPoolTrimTo, cuMemPoolTrimTo, PFN_cuMemPoolTrimTo_v11020, 11020);
      int r = trim(DefaultPool(), keep);
      if (r == CUDA_SUCCESS && g_pool != nullptr) r = trim(g_pool, keep);
      printf("trim %d\n", r);
    } else if (strcmp(op, "waitfree") == 0) {
      // Polls cuMemGetInfo until free is at most BYTES or TIMEOUT_MS passed: "waitfree <free>".
      const uint64_t want = Arg(argv, &i, argc);
      const uint64_t deadline = NowNs() + Arg(argv, &i, argc) * 1000000ull;
      size_t free_bytes = 0;
      size_t total = 0;
      auto info = CU(cuMemGetInfo_v2, cuMemGetInfo, PFN_cuMemGetInfo_v3020, 3020);
      while (info(&free_bytes, &total) == CUDA_SUCCESS && free_bytes > want && NowNs() < deadline) usleep(10000);
      printf("waitfree %zu\n", free_bytes);
    } else if (strcmp(op, "sync") == 0) {
      printf("sync %d\n", CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)());
    } else if (strcmp(op, "graphmem") == 0 || strcmp(op, "graphnode") == 0) {
      // A graph with one allocation node of N bytes and no free node, instantiated, not launched yet;
      // "graphnode" adds the node with the generic cuGraphAddNode.
      const uint64_t n = Arg(argv, &i, argc);
      CU(cuGraphCreate, cuGraphCreate, PFN_cuGraphCreate_v10000, 10000)(&g_graphmem.graph, 0);
      CUgraphNode node = nullptr;
      CUresult r;
      if (strcmp(op, "graphmem") == 0) {
        CUDA_MEM_ALLOC_NODE_PARAMS params{};
        params.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.bytesize = n;
        r = CU(cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, PFN_cuGraphAddMemAllocNode_v11040, 11040)(
            &node, g_graphmem.graph, nullptr, 0, &params);
        g_graphmem.ptr = params.dptr;
      } else {
        CUgraphNodeParams params{};
        params.type = CU_GRAPH_NODE_TYPE_MEM_ALLOC;
        params.alloc.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
        params.alloc.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        params.alloc.bytesize = n;
        r = CU(cuGraphAddNode, cuGraphAddNode, PFN_cuGraphAddNode_v12020, 12020)(&node, g_graphmem.graph, nullptr,
                                                                                 0, &params);
        g_graphmem.ptr = params.alloc.dptr;
      }
      if (r == CUDA_SUCCESS) {
        r = CU(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040,
               11040)(&g_graphmem.exec, g_graphmem.graph, 0);
      }
      printf("%s %d\n", op, r);
    } else if (strcmp(op, "launchptsz") == 0 || strcmp(op, "captureptsz") == 0) {
      // COUNT kernels of NS through the per-thread-default-stream entry points on stream 0 (the thread's own
      // stream): run ("launchptsz", then synchronized), or captured into a graph ("captureptsz": the rc of
      // cuStreamEndCapture_ptsz).
      const uint64_t count = Arg(argv, &i, argc);
      uint64_t value = Arg(argv, &i, argc);
      void* params[] = {&value};
      CUfunction f = Kernel();
      auto launch = Get<PFN_cuLaunchKernel_v7000_ptsz>("cuLaunchKernel_ptsz", "cuLaunchKernel", 7000, true);
      const bool capture = strcmp(op, "captureptsz") == 0;
      CUresult r = CUDA_SUCCESS;
      if (capture) {
        r = Get<PFN_cuStreamBeginCapture_v10010_ptsz>("cuStreamBeginCapture_v2_ptsz", "cuStreamBeginCapture", 10010,
                                                      true)(nullptr, CU_STREAM_CAPTURE_MODE_GLOBAL);
      }
      for (uint64_t k = 0; k < count && r == CUDA_SUCCESS; ++k) r = launch(f, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr);
      if (capture) {
        CUgraph g = nullptr;
        const CUresult e = Get<PFN_cuStreamEndCapture_v10000_ptsz>("cuStreamEndCapture_ptsz", "cuStreamEndCapture",
                                                                   10000, true)(nullptr, &g);
        if (r == CUDA_SUCCESS) r = e;
      } else {
        CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)();
      }
      printf("%s %d\n", op, r);
    } else if (strcmp(op, "capturealloc") == 0) {
      // cuMemAllocAsync of N bytes captured into a graph (as PyTorch's graphs with cudaMallocAsync), not freed
      // in it; the graph is instantiated, not launched yet.
      const uint64_t n = Arg(argv, &i, argc);
      CUstream s = nullptr;
      CU(cuStreamCreate, cuStreamCreate, PFN_cuStreamCreate_v2000, 2000)(&s, 0);
      CUresult r = CU(cuStreamBeginCapture_v2, cuStreamBeginCapture, PFN_cuStreamBeginCapture_v10010, 10010)(
          s, CU_STREAM_CAPTURE_MODE_GLOBAL);
      CUdeviceptr p = 0;
      if (r == CUDA_SUCCESS) r = CU(cuMemAllocAsync, cuMemAllocAsync, PFN_cuMemAllocAsync_v11020, 11020)(&p, n, s);
      CUgraph g = nullptr;
      const CUresult e =
          CU(cuStreamEndCapture, cuStreamEndCapture, PFN_cuStreamEndCapture_v10000, 10000)(s, &g);
      if (r == CUDA_SUCCESS) r = e;
      if (r == CUDA_SUCCESS) {
        r = CU(cuGraphInstantiateWithFlags, cuGraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040,
               11040)(&g_graphmem.exec, g, 0);
      }
      g_graphmem.graph = g;
      g_graphmem.ptr = p;
      printf("capturealloc %d\n", r);
    } else if (strcmp(op, "graphlaunch") == 0) {
      CUresult r = CU(cuGraphLaunch, cuGraphLaunch, PFN_cuGraphLaunch_v10000, 10000)(g_graphmem.exec, nullptr);
      if (r == CUDA_SUCCESS) r = CU(cuCtxSynchronize, cuCtxSynchronize, PFN_cuCtxSynchronize_v2000, 2000)();
      printf("graphlaunch %d\n", r);
    } else if (strcmp(op, "graphfree") == 0) {
      printf("graphfree %d\n", CU(cuMemFree_v2, cuMemFree, PFN_cuMemFree_v3020, 3020)(g_graphmem.ptr));
    } else if (strcmp(op, "graphtrim") == 0) {
      printf("graphtrim %d\n",
             CU(cuDeviceGraphMemTrim, cuDeviceGraphMemTrim, PFN_cuDeviceGraphMemTrim_v11040, 11040)(0));
    } else if (strcmp(op, "prefetch") == 0 || strcmp(op, "prefetchback") == 0) {
      // Pageable memory (HMM) moved onto GPU 0, or back to the host: "prefetch N" allocates N host bytes.
      static void* host = nullptr;
      static uint64_t host_bytes = 0;
      CUmemLocation to{};
      if (strcmp(op, "prefetch") == 0) {
        host_bytes = Arg(argv, &i, argc);
        host = malloc(host_bytes);
        to.type = CU_MEM_LOCATION_TYPE_DEVICE;
      } else {
        to.type = CU_MEM_LOCATION_TYPE_HOST;
      }
      printf("%s %d\n", op,
             CU(cuMemPrefetchAsync_v2, cuMemPrefetchAsync, PFN_cuMemPrefetchAsync_v12020, 12020)(
                 reinterpret_cast<CUdeviceptr>(host), host_bytes, to, 0, nullptr));
    } else if (strcmp(op, "ready") == 0) {
      printf("ready\n");
      char line[64];
      if (fgets(line, sizeof(line), stdin) == nullptr) {
        // stdin closed: go on
      }
    } else if (strcmp(op, "sleep") == 0) {
      usleep(static_cast<useconds_t>(Arg(argv, &i, argc) * 1000));
    } else if (strcmp(op, "fork") == 0) {
      // The child runs the rest of the operations (its lines start with "child"); the parent waits for it
      // and then goes on after the word "parent" (or ends when there is none).
      fflush(stdout);
      const pid_t child = fork();
      if (child == 0) {
        g_held.clear();  // the parent's allocations are the parent's
        printf("child %d\n", static_cast<int>(getpid()));
        continue;
      }
      int status = 0;
      waitpid(child, &status, 0);
      printf("fork %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      while (i + 1 < argc && strcmp(argv[i + 1], "parent") != 0) ++i;
      ++i;  // past "parent"
    } else if (strcmp(op, "parent") == 0) {
      _exit(0);  // the child ends where the parent resumes
    } else if (strcmp(op, "exit") == 0) {
      _exit(static_cast<int>(Arg(argv, &i, argc)));
    } else {
      fprintf(stderr, "cuda_probe: unknown operation %s\n", op);
      return 2;
    }
  }
  return 0;
}
