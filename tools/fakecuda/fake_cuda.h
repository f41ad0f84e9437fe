// The fake CUDA driver's own state, shared by its API families (one file each, as the hook splits them:
// fake_entry.cc, fake_context.cc, fake_memory.cc, fake_pools.cc, fake_launch.cc, fake_graph.cc; NVML is
// fake_nvml.cc): the process's contexts, streams, graphs and allocations, and the helpers more than one
// family calls. What several processes share (device memory, the GPU timeline) is fake_state.h.
//
// Contract: each entry point behaves as cuda.h documents the real one (a null out-pointer is
// CUDA_ERROR_INVALID_VALUE before anything is done; device memory is what the real call would take, e.g. an
// array's elements by format and channel count and a mipmapped array's levels summed), so that tests of the
// hook against it say something about a real GPU.
//
// Thread-safety: the process-local tables are guarded by g_mu; device memory and the timeline by the shared
// state's lock (fake_state.h). t_ctx, t_stack and t_capture_mode are the calling thread's.
#ifndef TESSERA_TOOLS_FAKECUDA_FAKE_CUDA_H_
#define TESSERA_TOOLS_FAKECUDA_FAKE_CUDA_H_

#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fake_state.h"
#include "hook/cuda/cuda_api.h"

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

// Every entry point of the fake, declared once: those the hook intercepts or calls with exactly the types it
// expects (its symbol lists: a definition of another type does not compile), and the others cuGetProcAddress
// hands out.
#define TS_HOOK(sym, pfn, base, version, ptsz) FAKE_EXPORT std::remove_pointer_t<pfn> sym;
#include "hook/cuda/cuda_hooks.def"
#undef TS_HOOK
#define TS_REAL(sym, pfn) FAKE_EXPORT std::remove_pointer_t<pfn> sym;
#include "hook/cuda/cuda_real.def"
#undef TS_REAL
FAKE_EXPORT CUresult cuCtxGetDevice_v2(CUdevice* dev, CUcontext ctx);
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx);
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d);
FAKE_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice dev);
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice d);
FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid* uuid, CUdevice d);
FAKE_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool);
FAKE_EXPORT CUresult cuDriverGetVersion(int* v);
FAKE_EXPORT CUresult cuGetErrorName(CUresult r, const char** s);
FAKE_EXPORT CUresult cuGetErrorString(CUresult r, const char** s);
FAKE_EXPORT CUresult cuGraphAddKernelNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                             const CUDA_KERNEL_NODE_PARAMS* p);
FAKE_EXPORT CUresult cuGraphAddMemAllocNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                            CUDA_MEM_ALLOC_NODE_PARAMS* p);
FAKE_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                           CUdeviceptr ptr);
FAKE_EXPORT CUresult cuGraphAddNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                    CUgraphNodeParams* p);
FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode* d,
                                       const CUgraphEdgeData*, size_t nd, CUgraphNodeParams* p);
FAKE_EXPORT CUresult cuGraphCreate(CUgraph* g, unsigned int);
FAKE_EXPORT CUresult cuGraphDestroy(CUgraph g);
FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr, size_t);
FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr* p, size_t size, size_t, CUdeviceptr,
                                         unsigned long long);
FAKE_EXPORT CUresult cuMemAdvise(CUdeviceptr, size_t, CUmem_advise, CUdevice);
FAKE_EXPORT CUresult cuMemAdvise_v2(CUdeviceptr, size_t, CUmem_advise, CUmemLocation);
FAKE_EXPORT CUresult cuMemAllocHost_v2(void** p, size_t bytes);
FAKE_EXPORT CUresult cuMemFreeHost(void* p);
FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t* g, const CUmemAllocationProp*,
                                                   CUmemAllocationGranularity_flags);
FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* f, CUmodule m, const char* name);
FAKE_EXPORT CUresult cuStreamCreate(CUstream* s, unsigned int);
FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream s);

namespace fakecuda {

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
struct Mapping {
  CUmemGenericAllocationHandle handle;
  uint64_t size;
};

// fake_entry.cc
extern std::mutex g_mu;
extern bool g_initialized;
extern int g_visible[kMaxGpus];  // visible ordinal -> GPU of the shared state (CUDA_VISIBLE_DEVICES)
extern int g_visible_count;
extern Ctx* g_primary[kMaxGpus];
extern std::unordered_map<uint64_t, Alloc>* g_allocs;      // device pointers, arrays, VMM handles
extern std::unordered_map<uint64_t, int>* g_handle_refs;   // VMM handle -> references, under g_mu
extern std::unordered_map<uint64_t, Mapping>* g_mappings;  // va -> mapping, under g_mu
extern uint64_t g_next_va;
extern uint64_t g_next_low_va;
extern thread_local Ctx* t_ctx;
extern thread_local std::vector<Ctx*>* t_stack;
bool ValidDevice(CUdevice d);

// fake_context.cc
CUresult NewContext(CUcontext* pctx, CUdevice dev, bool primary);
void DeleteContext(Ctx* c);
// CUDA_MODULE_LOADING=LAZY: a kernel's code arrives in its context at its first launch.
void LoadLazily(CUfunction f);

// fake_memory.cc
// Adds (or, negative, gives back) device memory of this process on a GPU of the shared state.
CUresult Charge(int gpu, int64_t bytes);
// `low`: an address below 4 GiB, for the legacy 32-bit entry points.
CUresult AllocDevice(uint64_t bytes, int gpu, uint64_t* out, bool low = false);
CUresult FreeDevice(uint64_t key);
int CurrentGpu();

// fake_pools.cc
// A pool pointer goes back to its pool. False when `ptr` is not one.
bool PoolFree(uint64_t ptr);
// A synchronization: every pool releases what it keeps above its threshold.
void ReleaseAtSynchronization();
// Maps a graph allocation node's memory at launch (reusing what the graph pool keeps). Not under g_mu.
CUresult GraphMap(int gpu, CUdeviceptr ptr, uint64_t bytes);
// A graph allocation freed: back to the graph pool. False when `ptr` is not a live graph allocation.
bool GraphFree(uint64_t ptr);

// fake_launch.cc
void SleepUntil(uint64_t t);
// The stream a handle names (0 and CU_STREAM_LEGACY: the context's legacy stream; CU_STREAM_PER_THREAD: the
// calling thread's); null without a context.
Stream* StreamOf(CUstream s);
CUstream Ptsz(CUstream s);
// Puts a kernel of `ns` on the stream's GPU timeline (or into the graph it captures).
CUresult Submit(CUstream hs, uint64_t ns);
uint64_t KernelNs(void** params);

// fake_graph.cc
extern thread_local CUstreamCaptureMode t_capture_mode;
extern std::vector<Stream*>* g_capturing;  // under g_mu
unsigned long ThreadId();
// Whether the calling thread may make a potentially unsafe call now; invalidates what it would break.
bool UnsafeCallProhibited();
CUresult Capture(Stream* st, uint64_t ns);

}  // namespace fakecuda

#endif  // TESSERA_TOOLS_FAKECUDA_FAKE_CUDA_H_
