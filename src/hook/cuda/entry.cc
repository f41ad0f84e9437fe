// libtessera-cuda.so: what it adds to its session (hook/common/session.h: start, fork, charging, the limiter
// loop): the real entry points, dlsym() and cuGetProcAddress(), device set-up, the limiter thread's CUDA
// steps and what a fork child forgets. docs/isolation.md explains the whole.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hook/cuda/hook.h"
#include "hook/cuda/visible_devices.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::cuda_hook {

RealCuda g_cu;
RealNvml g_nvml;
HookState g_state;

namespace {

using hook::Error;
using hook::LogLevel;
using hook::LogLine;


using DlsymFn = void* (*)(void*, const char*);
DlsymFn g_real_dlsym = nullptr;
void* g_libcuda = nullptr;
void* g_libnvml = nullptr;
std::atomic<bool> g_nvml_tried{false};

// The hooked names: for dlsym() and cuGetProcAddress().
struct HookEntry {
  const char* symbol;
  const char* base;
  int version;
  int ptsz;
  void* hook;
  void** real;  // the slot in g_cu
};

#define TS_HOOK(sym, pfn, base, version, ptsz) \
  {#sym,                                       \
   #base,                                      \
   version,                                    \
   ptsz,                                       \
   reinterpret_cast<void*>(&tessera_##sym),    \
   reinterpret_cast<void**>(&g_cu.real_##sym)},
const HookEntry kCudaHooks[] = {
#include "hook/cuda/cuda_hooks.def"
};
#undef TS_HOOK

struct NvmlEntry {
  const char* symbol;
  void* hook;
  void** real;
};
#define TS_NVML_HOOK(sym, type) \
  {#sym, reinterpret_cast<void*>(&tessera_##sym), reinterpret_cast<void**>(&g_nvml.real_##sym)},
const NvmlEntry kNvmlHooks[] = {
#include "hook/cuda/nvml_hooks.def"
};
#undef TS_NVML_HOOK

DlsymFn RealDlsym() {
  if (g_real_dlsym == nullptr) {
    // dlsym is ours; the real one comes from glibc by version (2.34 moved it into libc).
    void* p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.34");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.2.5");
    if (p == nullptr) p = dlvsym(RTLD_NEXT, "dlsym", "GLIBC_2.17");
    g_real_dlsym = reinterpret_cast<DlsymFn>(p);
  }
  return g_real_dlsym;
}

// Library::load_runtime: the real driver's entry points, under the session's init lock.
void LoadRealCuda() {
  if (g_libcuda != nullptr) return;
  const char* path = getenv("TESSERA_REAL_LIBCUDA");
  void* h = dlopen(path != nullptr ? path : "libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    LogLine(LogLevel::kDebug, "no libcuda.so.1 (%s); CUDA calls will fail as without a driver", dlerror());
    return;
  }
  DlsymFn real = RealDlsym();
  for (const HookEntry& e : kCudaHooks) *e.real = real(h, e.symbol);
#define TS_REAL(sym, pfn) g_cu.real_##sym = reinterpret_cast<pfn>(real(h, #sym));
#include "hook/cuda/cuda_real.def"
#undef TS_REAL
  g_libcuda = h;
}

}  // namespace

bool LoadRealNvml() {
  if (g_libnvml != nullptr) return true;
  if (g_nvml_tried.exchange(true)) return g_libnvml != nullptr;
  const char* path = getenv("TESSERA_REAL_LIBNVML");
  void* h = dlopen(path != nullptr && path[0] != 0 ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) return false;
  DlsymFn real = RealDlsym();
  g_nvml.nvmlInit_v2 = reinterpret_cast<nvmlInit_fn*>(real(h, "nvmlInit_v2"));
  g_nvml.nvmlDeviceGetHandleByUUID =
      reinterpret_cast<nvmlDeviceGetHandleByUUID_fn*>(real(h, "nvmlDeviceGetHandleByUUID"));
  g_nvml.nvmlDeviceGetUUID = reinterpret_cast<nvmlDeviceGetUUID_fn*>(real(h, "nvmlDeviceGetUUID"));
  g_nvml.nvmlDeviceGetIndex = reinterpret_cast<nvmlDeviceGetIndex_fn*>(real(h, "nvmlDeviceGetIndex"));
  g_nvml.nvmlDeviceGetMemoryInfo =
      reinterpret_cast<nvmlDeviceGetMemoryInfo_fn*>(real(h, "nvmlDeviceGetMemoryInfo"));
  g_nvml.nvmlDeviceGetUtilizationRates =
      reinterpret_cast<nvmlDeviceGetUtilizationRates_fn*>(real(h, "nvmlDeviceGetUtilizationRates"));
  for (const NvmlEntry& e : kNvmlHooks) *e.real = real(h, e.symbol);
  g_libnvml = h;
  return true;
}

bool NvmlReady() {
  static std::atomic<int> state{0};  // 0 unknown, 1 ready, 2 unavailable
  const int s = state.load(std::memory_order_acquire);
  if (s != 0) return s == 1;
  const bool ok = LoadRealNvml() && g_nvml.nvmlInit_v2 != nullptr && g_nvml.nvmlInit_v2() == NVML_SUCCESS;
  state.store(ok ? 1 : 2, std::memory_order_release);
  return ok;
}

namespace {

// Library::start_limited: the session is limited (under its init lock). Devices are set up after cuInit.
void StartLimited() {
  if (const char* ctx = getenv("TESSERA_CONTEXT_BYTES")) {
    if (!hook::ParseByteSize(ctx, &g_state.context_bytes_override)) {
      hook::WriteStderrLine("TESSERA_CONTEXT_BYTES='%s' is not a size; measuring context memory instead",
                            ctx);
    } else {
      g_state.context_bytes_set = true;
    }
  }
}

// Library::forget_in_child: CUDA contexts do not survive fork(), so the child starts with nothing charged.
void ForgetInChild() {
  ResetAllocTableInChild();
  ResetPoolsInChild();
  ResetFootprintInChild();
  for (HookDevice& d : g_state.devices) {
    d.primary_refs = 0;
    d.footprint_bytes = 0;
    d.graph_pool_bytes = 0;
  }
}

TESSERA_HOOK_SESSION_LIFETIME(g_state.session)

}  // namespace

HookDevice* DeviceAt(int ordinal) {
  if (ordinal < 0 || ordinal >= g_state.device_count.load(std::memory_order_acquire)) return nullptr;
  return &g_state.devices[ordinal];
}

int CurrentDevice() {
  if (g_state.device_count.load(std::memory_order_relaxed) == 1) return 0;
  CUdevice dev = -1;
  if (g_cu.real_cuCtxGetDevice == nullptr || g_cu.real_cuCtxGetDevice(&dev) != CUDA_SUCCESS) return -1;
  return static_cast<int>(dev);
}

namespace {

// Applies the process's limits to its devices and to the shared region.
void ApplyLimitsLocked() {
  const uint64_t now = hook::MonotonicNs();
  const int n = g_state.device_count.load();
  for (int i = 0; i < n; ++i) {
    HookDevice& d = g_state.devices[i];
    const hook::DeviceLimits* l = hook::FindDeviceLimits(g_state.session.limits, d.uuid, i);
    d.has_limits = l != nullptr;
    if (l == nullptr) {
      if (g_state.session.limits_from_file) {
        hook::WriteStderrLine("GPU %d (%s) is visible but not in the limits file %s: its use is refused", i,
                              d.uuid, g_state.session.limits_path);
      }
      continue;
    }
    d.limits = *l;
    if (d.region_index >= 0) g_state.session.region.SetDeviceLimits(d.region_index, *l, now);
  }
}

}  // namespace

void SetUpDevices() {
  if (CurrentMode() != Mode::kLimited) return;
  pthread_mutex_lock(g_state.session.devices_mutex());
  if (g_state.device_count.load() == 0 && g_cu.real_cuDeviceGetCount != nullptr) {
    int count = 0;
    if (g_cu.real_cuDeviceGetCount(&count) == CUDA_SUCCESS) {
      if (count > hook::kMaxDevices) {
        hook::WriteStderrLine("%d GPUs visible; Tessera limits the first %d, the others are refused", count,
                              hook::kMaxDevices);
        count = hook::kMaxDevices;
      }
      for (int i = 0; i < count; ++i) {
        HookDevice& d = g_state.devices[i];
        CUdevice dev = 0;
        CUuuid uuid;
        if (g_cu.real_cuDeviceGet(&dev, i) != CUDA_SUCCESS || g_cu.real_cuDeviceGetUuid_v2 == nullptr ||
            g_cu.real_cuDeviceGetUuid_v2(&uuid, dev) != CUDA_SUCCESS) {
          snprintf(d.uuid, sizeof(d.uuid), "index-%d", i);
        } else {
          hook::FormatGpuUuid(reinterpret_cast<const unsigned char*>(uuid.bytes), d.uuid, sizeof(d.uuid));
        }
        Error error;
        d.region_index = g_state.session.region.FindOrAddDevice(d.uuid, &error);
        if (d.region_index < 0)
          hook::WriteStderrLine("%s", error.text);
        else
          d.shared = g_state.session.region.device(d.region_index);
        d.present = true;
      }
      g_state.device_count.store(count, std::memory_order_release);
      ApplyLimitsLocked();
    }
  }
  pthread_mutex_unlock(g_state.session.devices_mutex());
  g_state.session.StartLimiterThread();
}

CUresult RefusalFor(int ordinal) {
  (void)ordinal;
  return CUDA_ERROR_NOT_PERMITTED;
}

CUresult ChargeBefore(int ordinal, uint64_t bytes) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr) return CUDA_SUCCESS;  // not a device we account (out of range)
  if (!d->has_limits) return RefusalFor(ordinal);
  if (d->region_index < 0) return CUDA_ERROR_NOT_PERMITTED;  // no entry in the region: nothing to charge
  if (!EnsureAttached()) return CUDA_ERROR_NOT_PERMITTED;
  switch (g_state.session.Charge(d->region_index, bytes, d->uuid)) {
    case hook::ChargeResult::kOk:
      return CUDA_SUCCESS;
    case hook::ChargeResult::kDetached:
      return CUDA_ERROR_DEINITIALIZED;  // the process is exiting
    default:
      return CUDA_ERROR_OUT_OF_MEMORY;
  }
}

void Uncharge(int ordinal, uint64_t bytes) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || d->region_index < 0 || bytes == 0) return;
  g_state.session.Uncharge(d->region_index, bytes, d->uuid);
}

// ---------------------------------------------------------------------------------------------------------
// The limiter thread: refills budgets, measures sampled launches, runs the elastic controller, picks up new
// limits (file rewrite or the agent's RELOAD), reclaims dead processes' charges.

namespace {

int32_t DeviceUtilization(HookDevice& d) {
  if (!NvmlReady() || g_nvml.nvmlDeviceGetUtilizationRates == nullptr) return -1;
  if (d.nvml == nullptr) {
    if (g_nvml.nvmlDeviceGetHandleByUUID == nullptr ||
        g_nvml.nvmlDeviceGetHandleByUUID(d.uuid, &d.nvml) != NVML_SUCCESS) {
      return -1;
    }
  }
  nvmlUtilization_t u;
  if (g_nvml.nvmlDeviceGetUtilizationRates(d.nvml, &u) != NVML_SUCCESS) return -1;
  return static_cast<int32_t>(u.gpu) * 10000;
}

bool DrainSample(const hook::SampleRing::Sample& s) {
  CUevent start = reinterpret_cast<CUevent>(s.start_event);
  CUevent end = reinterpret_cast<CUevent>(s.end_event);
  const CUresult q = g_cu.real_cuEventQuery(end);
  if (q == CUDA_ERROR_NOT_READY) return false;
  if (q == CUDA_SUCCESS) {
    float ms = 0;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    if (g_cu.real_cuEventElapsedTime_v2 != nullptr) r = g_cu.real_cuEventElapsedTime_v2(&ms, start, end);
    if (r != CUDA_SUCCESS && g_cu.real_cuEventElapsedTime != nullptr) {
      r = g_cu.real_cuEventElapsedTime(&ms, start, end);
    }
    if (r == CUDA_SUCCESS && ms >= 0) {
      const int64_t ns = static_cast<int64_t>(static_cast<double>(ms) * 1e6);
      g_state.costs.Record(s.key, ns);
      // The sampled launch was charged its estimate; charge the difference to what it really took.
      HookDevice* d = DeviceAt(s.device);
      if (d != nullptr && d->shared != nullptr && ns > s.charged_ns) {
        hook::TokenBucket::Take(&d->shared->bucket, ns - s.charged_ns);
      }
    }
  }
  g_cu.real_cuEventDestroy_v2(start);
  g_cu.real_cuEventDestroy_v2(end);
  return true;
}

// Every millisecond: refill the budgets, step the elastic controllers, read the measured launches.
bool EveryMs(uint64_t now) {
  bool busy = g_state.samples.InFlight() > 0;
  const int n = g_state.device_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    HookDevice& d = g_state.devices[i];
    // Every policy measures its use each step (for `tessera inspect`); only elastic changes its rate.
    if (d.shared != nullptr && hook::RefillDevice(d.shared, now, &busy)) {
      const bool elastic = d.limits.policy == hook::ComputePolicy::kElastic;
      const int32_t util = elastic ? DeviceUtilization(d) : -1;
      // Alone: NVML's process list shows nobody else; without NVML, the agent's count of the GPU's containers.
      const Tenancy tenancy = elastic ? DeviceTenancy(i) : Tenancy::kUnknown;
      const bool alone =
          elastic && (tenancy == Tenancy::kAlone || (tenancy == Tenancy::kUnknown && d.limits.tenants == 1));
      hook::ElasticController::Step(&d.shared->controller, &d.shared->bucket, now, util, alone);
    }
  }
  if (g_cu.real_cuEventQuery != nullptr) g_state.samples.Drain(&DrainSample);
  return busy;
}

// About four times a second: what the driver holds that no call announced.
void EveryQuarter(uint64_t) {
  TrueUpAllFootprints();  // kernels loaded lazily at their first launch, local memory grown
  TrueUpPools(/*from_limiter=*/true);  // pools and the graph pool, as the driver reports them (raised only)
}

// Library::in_limiter_thread. The capture rules of cuda.h: during another thread's global-mode capture, a
// thread in global mode may not make potentially unsafe calls (cuEventQuery, cuEventDestroy...), or the
// capture is invalidated. This thread never captures: relaxed mode lets it measure launches whatever the
// application captures.
void InLimiterThread() {
  if (g_cu.real_cuThreadExchangeStreamCaptureMode != nullptr) {
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    g_cu.real_cuThreadExchangeStreamCaptureMode(&relaxed);
  }
}

}  // namespace

const hook::Library kCudaLibrary = {
    .name = "cuda",
    .version = TESSERA_VERSION,
    .refused = "GPU access refused",
    .load_runtime = &LoadRealCuda,
    .start_limited = &StartLimited,
    .forget_in_child = &ForgetInChild,
    .in_limiter_thread = &InLimiterThread,
    .each_ms = &EveryMs,
    .limits_changed = &ApplyLimitsLocked,
    .each_quarter = &EveryQuarter,
    .retry_limiter_start = true,  // the next cuInit tries again
};

// ---------------------------------------------------------------------------------------------------------
// dlsym and cuGetProcAddress: the CUDA runtime reaches the driver through them, not through the linker.

namespace {

const HookEntry* FindHook(const char* symbol) {
  for (const HookEntry& e : kCudaHooks) {
    if (strcmp(e.symbol, symbol) == 0) return &e;
  }
  return nullptr;
}

// The wrapper to hand out for what the real cuGetProcAddress returned for `symbol`: the variant whose real
// entry point it is, else the newest variant not newer than `version` with the asked stream semantics.
void* HookForProc(const char* symbol, void* real, int version, cuuint64_t flags) {
  const HookEntry* best = nullptr;
  bool any = false;
  for (const HookEntry& e : kCudaHooks) {
    if (strcmp(e.base, symbol) != 0) continue;
    any = true;
    if (*e.real == real && real != nullptr) return e.hook;
  }
  if (!any) return real;
  const int want_ptsz = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0 ? 1 : 0;
  for (const HookEntry& e : kCudaHooks) {
    if (strcmp(e.base, symbol) != 0 || e.version > version) continue;
    if (e.ptsz != want_ptsz && best != nullptr && best->ptsz == want_ptsz) continue;
    if (best == nullptr || (e.ptsz == want_ptsz && best->ptsz != want_ptsz) ||
        (e.ptsz == best->ptsz && e.version > best->version)) {
      best = &e;
    }
  }
  if (best == nullptr) return real;
  LogLine(LogLevel::kDebug, "cuGetProcAddress(%s, %d): matched %s by version", symbol, version, best->symbol);
  return best->hook;
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

extern "C" TS_EXPORT void* dlsym(void* handle, const char* symbol) {
  DlsymFn real = RealDlsym();
  if (real == nullptr) return nullptr;
  void* p = real(handle, symbol);
  if (p == nullptr || (symbol[0] != 'c' && symbol[0] != 'n')) return p;
  // Hand out our wrapper when the symbol resolves into the real libcuda or libnvidia-ml.
  Dl_info info;
  if (dladdr(p, &info) == 0 || info.dli_fname == nullptr) return p;
  const char* base = strrchr(info.dli_fname, '/');
  base = base != nullptr ? base + 1 : info.dli_fname;
  if (strncmp(base, "libcuda.so", 10) == 0) {
    if (const HookEntry* e = FindHook(symbol)) return e->hook;
  } else if (strncmp(base, "libnvidia-ml.so", 15) == 0) {
    for (const NvmlEntry& e : kNvmlHooks) {
      if (strcmp(e.symbol, symbol) == 0) return e.hook;
    }
  }
  return p;
}

extern "C" CUresult tessera_cuInit(unsigned int flags) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (g_cu.real_cuInit == nullptr) return CUDA_ERROR_NO_DEVICE;
  const CUresult r = g_cu.real_cuInit(flags);
  if (r == CUDA_SUCCESS && mode == Mode::kLimited) SetUpDevices();
  return r;
}

extern "C" CUresult tessera_cuGetProcAddress(const char* symbol, void** pfn, int version, cuuint64_t flags) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (g_cu.real_cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = g_cu.real_cuGetProcAddress(symbol, pfn, version, flags);
  if (r == CUDA_SUCCESS && pfn != nullptr && symbol != nullptr)
    *pfn = HookForProc(symbol, *pfn, version, flags);
  return r;
}

extern "C" CUresult tessera_cuGetProcAddress_v2(const char* symbol, void** pfn, int version, cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* status) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (g_cu.real_cuGetProcAddress_v2 == nullptr) {
    // A driver older than CUDA 12: answer through the 11.3 signature.
    if (g_cu.real_cuGetProcAddress == nullptr) return CUDA_ERROR_NOT_FOUND;
    const CUresult r = tessera_cuGetProcAddress(symbol, pfn, version, flags);
    if (status != nullptr) {
      *status = r == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    }
    return r;
  }
  const CUresult r = g_cu.real_cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (r == CUDA_SUCCESS && pfn != nullptr && symbol != nullptr && *pfn != nullptr) {
    *pfn = HookForProc(symbol, *pfn, version, flags);
  }
  return r;
}
