// Internal to libtessera-cuda.so: the real driver's entry points, the process's hook state, and the helpers
// the API families (memory.cc, footprint.cc, pools.cc, launch.cc, nvml.cc, entry.cc) share. See
// docs/isolation.md ("What is charged") and docs/hook-abi.md.
//
// Thread-safety: Init() runs once under a mutex; afterwards the state is read lock-free on the launch path;
// the allocation tables have their own mutex.
#ifndef TESSERA_HOOK_CUDA_HOOK_H_
#define TESSERA_HOOK_CUDA_HOOK_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "hook/common/limiter.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/registration.h"
#include "hook/common/session.h"
#include "hook/cuda/cuda_api.h"
#include "hook/cuda/nvml_types.h"

#define TS_EXPORT __attribute__((visibility("default")))

// The exported wrappers, declared from the symbol list with the driver's own function types: a wrapper whose
// parameters differ from the driver's does not compile. tessera_<symbol> is exported as <symbol>.
#define TS_HOOK(sym, pfn, base, version, ptsz) \
  extern "C" std::remove_pointer_t<pfn> tessera_##sym __asm__(#sym) TS_EXPORT;
#include "hook/cuda/cuda_hooks.def"
#undef TS_HOOK
#define TS_NVML_HOOK(sym, type) extern "C" type tessera_##sym __asm__(#sym) TS_EXPORT;
#include "hook/cuda/nvml_hooks.def"
#undef TS_NVML_HOOK

namespace tessera::cuda_hook {

// The real driver's entry points, resolved once from libcuda.so.1 with the real dlsym.
struct RealCuda {
#define TS_HOOK(sym, pfn, base, version, ptsz) pfn real_##sym;
#include "hook/cuda/cuda_hooks.def"
#undef TS_HOOK
#define TS_REAL(sym, pfn) pfn real_##sym;
#include "hook/cuda/cuda_real.def"
#undef TS_REAL
};

struct RealNvml {
  nvmlInit_fn* nvmlInit_v2;
  nvmlDeviceGetHandleByUUID_fn* nvmlDeviceGetHandleByUUID;
  nvmlDeviceGetUUID_fn* nvmlDeviceGetUUID;
  nvmlDeviceGetIndex_fn* nvmlDeviceGetIndex;
  nvmlDeviceGetMemoryInfo_fn* nvmlDeviceGetMemoryInfo;
  nvmlDeviceGetUtilizationRates_fn* nvmlDeviceGetUtilizationRates;
#define TS_NVML_HOOK(sym, type) type* real_##sym;
#include "hook/cuda/nvml_hooks.def"
#undef TS_NVML_HOOK
};

extern RealCuda g_cu;
extern RealNvml g_nvml;

// What the hook does in this process (hook/common/session.h).
using hook::Mode;

// One CUDA device ordinal of this process.
struct HookDevice {
  bool present = false;
  bool has_limits = false;  // false: a GPU the limits do not name (refused when the limits come from a file)
  char uuid[hook::kUuidSize] = {0};
  int region_index = -1;
  hook::DeviceLimits limits;
  hook::RegionDevice* shared = nullptr;  // the container's entry in the shared region
  nvmlDevice_t nvml = nullptr;           // for utilization (elastic policy), resolved lazily
  int primary_refs = 0;                  // primary context retains by this process
  uint64_t footprint_bytes = 0;          // charged for memory no allocation names (footprint.cc)
  uint64_t graph_pool_bytes = 0;         // charged for the device's graph memory pool (pools.cc)
};

// What libtessera-cuda.so adds to the session (entry.cc).
extern const hook::Library kCudaLibrary;

struct HookState {
  std::atomic<int> device_count{0};  // CUDA devices set up (after cuInit)
  HookDevice devices[hook::kMaxDevices];
  // The mode, limits, region, agent connection, fork handling and limiter thread (hook/common/session.h,
  // shared with OpenCL). session.host_pid: this process in NVML's process lists (the agent says; else
  // getpid).
  hook::Session session{&kCudaLibrary};
  hook::KernelCostTable costs;
  hook::SampleRing samples;
  std::atomic<int> capturing{0};        // streams being captured in this process
  uint64_t context_bytes_override = 0;  // TESSERA_CONTEXT_BYTES (0: measure)
  bool context_bytes_set = false;
};

extern HookState g_state;

// Resolves the real entry points and reads the limits, once. Returns the mode. Safe to call from any hook.
inline Mode EnsureInit() {
  return g_state.session.EnsureInit();
}
// After the real cuInit succeeded: set up devices (UUIDs, limits, region entries) and start the limiter
// thread. Idempotent.
void SetUpDevices();

inline Mode CurrentMode() {
  return g_state.session.mode();
}

// The calling thread's current device ordinal, or -1 (no context).
int CurrentDevice();
// The hook device for an ordinal, or null when out of range / not set up.
HookDevice* DeviceAt(int ordinal);
// Claims this process's slot again after fork() when needed. False when the region refuses.
inline bool EnsureAttached() {
  return g_state.session.EnsureAttached();
}

// Reserve-then-commit: charges `bytes` on `ordinal`, runs `call`, and gives the charge back when it fails.
// Over the limit: CUDA_ERROR_OUT_OF_MEMORY, and `call` is not made.
CUresult ChargeBefore(int ordinal, uint64_t bytes);
void Uncharge(int ordinal, uint64_t bytes);
// Refusal for devices the limits do not name and for fail-closed mode.
CUresult RefusalFor(int ordinal);

// Process-local records of what was charged, keyed by handle or address.
enum class AllocKind : uint32_t {
  kLinear = 1,
  kArray = 2,
  kMipmapped = 3,
  kVmmHandle = 4,
  kMapping = 5,
  kGraph = 6,       // unused since graph memory is charged at launch (pools.cc); the value stays reserved
  kContext = 7,
  kPool = 8,
  kGreenContext = 9,
  kPoolAlloc = 10,  // an allocation from a stream-ordered pool (owner: the pool)
  kGraphExec = 11,  // an instantiated graph with memory nodes (bytes: what one launch allocates)
  kPrefetched = 12,  // pageable memory prefetched to a GPU (bytes: the range)
};
struct AllocRecord {
  uint64_t bytes = 0;
  int ordinal = -1;
  uint64_t owner = 0;     // the context (linear, arrays) or graph (graph allocations) or handle (mappings)
  int refs = 0;           // VMM handles: retains not yet released
  int mapped = 0;         // VMM handles: live mappings
  bool released = false;  // VMM handles: cuMemRelease seen for the creating reference
};
void RecordAlloc(AllocKind kind, uint64_t key, const AllocRecord& record);
bool TakeAlloc(AllocKind kind, uint64_t key, AllocRecord* out);  // removes
bool FindAlloc(AllocKind kind, uint64_t key, AllocRecord* out);
bool UpdateAlloc(AllocKind kind, uint64_t key, const AllocRecord& record);
// Removes and uncharges every record of `kind` whose owner is `owner` (a destroyed context or graph).
void ReleaseOwned(AllocKind kind, uint64_t owner);
// Copies up to `max` records of `kind` with key in [begin, end) into keys/records; returns how many.
int CollectInRange(AllocKind kind, uint64_t begin, uint64_t end, uint64_t* keys, AllocRecord* records,
                   int max);

// The footprint (footprint.cc, docs/isolation.md "What is charged"): memory the driver holds for this process
// that no allocation call names (contexts, modules, libraries, limits, green contexts, kernels loaded
// lazily). With NVML it is trued up to NVML's figure for this process; without, a context is charged an
// estimate.
enum class ProcessUse { kKnown, kNotListed, kUnavailable };
// NVML's usedGpuMemory of this process on a device.
ProcessUse ProcessUsedBytes(int ordinal, uint64_t* out);
// NVML loaded and initialized (once).
bool NvmlReady();
// Whether a process outside the container holds a context on a device: NVML's real process list against the
// host pids of the container's live processes. kUnknown without NVML (or while a process of the container has
// not learnt its host pid: it would look like another tenant).
enum class Tenancy { kAlone, kShared, kUnknown };
Tenancy DeviceTenancy(int ordinal);
enum class TrueUp {
  kMustFit,    // after something was created: growth beyond the limit is refused (the caller undoes it)
  kRaiseOnly,  // the limiter thread: growth is charged even past the limit; nothing is given back
  kExact,      // after something was destroyed: raise or lower to what NVML says
};
// Brings the device's footprint charge to NVML's figure. CUDA_ERROR_OUT_OF_MEMORY only for kMustFit.
// `*known` (optional) says whether NVML gave a figure.
CUresult TrueUpFootprint(int ordinal, TrueUp mode, bool* known = nullptr);
// A context about to be created, of a size a process of the container measured: charged to the footprint
// before the driver is asked (refused past the limit), so that the device never holds a context the limit has
// no room for; the true-up after the creation settles it to NVML's figure.
CUresult ReserveFootprint(int ordinal, uint64_t bytes);
// Takes `bytes` out of the footprint: given back (`uncharge`), or kept charged as a record's estimate.
void DropFootprint(int ordinal, uint64_t bytes, bool uncharge);
// The limiter thread's periodic true-up of every device (kRaiseOnly).
void TrueUpAllFootprints();
// The charge for a context when NVML cannot measure it: TESSERA_CONTEXT_BYTES, else the size last
// measured by a process of the container, else kDefaultContextBytes.
inline constexpr uint64_t kDefaultContextBytes = 256ull << 20;
uint64_t EstimatedContextBytes(int ordinal);

// Stream-ordered pools and graph memory (pools.cc). A pool's charge is what it holds from the device: its
// allocations in use plus what it keeps (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT); the device graph pool's is
// CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT.
// cuMemFree/cuMemFreeAsync of a pool allocation: the memory goes back to its pool. False when `dptr` is not
// a pool allocation.
bool ReturnToPool(uint64_t dptr);
// Brings every pool's and graph pool's charge to what the driver says it holds (after synchronizations and
// trims). From the limiter thread: skipped when another thread holds the pools, and raises only.
void TrueUpPools(bool from_limiter = false);
// Runs a call that may give pool memory back to the device (pools.cc: while one runs, pool charges are not
// lowered from the driver's figures).
extern std::atomic<int> g_releasing;
extern std::atomic<uint64_t> g_releases_started;
template <typename Call>
CUresult Releasing(Call call) {
  g_releases_started.fetch_add(1, std::memory_order_seq_cst);
  g_releasing.fetch_add(1, std::memory_order_seq_cst);
  const CUresult r = call();
  g_releasing.fetch_sub(1, std::memory_order_seq_cst);
  return r;
}
// Graph launches: nonzero while an instantiated graph with memory nodes exists (the launch path reads it).
extern std::atomic<int> g_graph_memory_execs;
struct GraphLaunchTicket {
  int ordinal = -1;
  uint64_t reserved = 0;
  bool locked = false;
};
// Before launching `exec`: reserves the growth of the device's graph pool its allocations may need.
CUresult GraphMemoryBeforeLaunch(CUgraphExec exec, GraphLaunchTicket* ticket);
// After: charges the graph pool as the driver reports it (the reservation is kept when the report lags).
void GraphMemoryAfterLaunch(const GraphLaunchTicket& ticket, bool launched);

// Whether `stream` is being captured (a _ptsz call's stream 0 is the per-thread stream). Only asked while
// g_state.capturing is nonzero.
bool StreamIsCapturing(CUstream stream, bool ptsz);

// Loads libnvidia-ml.so.1 and resolves what the hook needs from it, once. False when there is none.
bool LoadRealNvml();
// After fork(), in the child: forgets the parent's allocation records, pools and footprint (and their locks,
// which another thread of the parent may have held).
void ResetAllocTableInChild();
void ResetPoolsInChild();
void ResetFootprintInChild();

}  // namespace tessera::cuda_hook

#endif  // TESSERA_HOOK_CUDA_HOOK_H_
