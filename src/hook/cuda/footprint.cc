// The footprint: device memory the driver holds for this process that no allocation call names: the
// contexts, the modules and libraries loaded into them (eagerly, or lazily at a kernel's first launch),
// cuCtxSetLimit's stack and heap, green contexts. docs/isolation.md ("What is charged") has the design:
//
//   footprint(process, GPU) = max(0, NVML usedGpuMemory(process, GPU) - what the process charged by name)
//
// NVML's per-process figure is the driver's own count for this one process, so concurrent processes never
// see each other's growth (a device-wide difference would). It is measured after every call that makes
// a context grow (a growth that does not fit the limit is undone and refused), after calls that make it
// shrink, and about four times a second by the limiter thread (lazily loaded kernels; charged even past the
// limit, since the driver already holds them: new allocations fail until enough is freed).
#include <pthread.h>
#include <stdlib.h>

#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {

namespace {

// One true-up at a time in the process: each reads the charges and writes the footprint.
pthread_mutex_t g_footprint_mutex = PTHREAD_MUTEX_INITIALIZER;

}  // namespace

void ResetFootprintInChild() {
  pthread_mutex_init(&g_footprint_mutex, nullptr);
}

uint64_t EstimatedContextBytes(int ordinal) {
  if (g_state.context_bytes_set) return g_state.context_bytes_override;
  HookDevice* d = DeviceAt(ordinal);
  if (d != nullptr && d->shared != nullptr) {
    const uint64_t learned = d->shared->context_bytes.load(std::memory_order_relaxed);
    if (learned != 0) return learned;
  }
  return kDefaultContextBytes;
}

CUresult TrueUpFootprint(int ordinal, TrueUp mode, bool* known) {
  if (known != nullptr) *known = false;
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || d->region_index < 0 || !d->has_limits || g_state.context_bytes_set) return CUDA_SUCCESS;
  // A forked child claims its own slot (and learns its own pid) before it measures itself.
  if (!EnsureAttached()) return CUDA_SUCCESS;
  hook::SharedRegion& region = g_state.session.region;
  // NVML's figure and this process's charges are read at two moments. Memory given back in between may still
  // be in NVML's figure and would look like footprint (charged twice: seen under load, megabytes over the
  // limit in the books); memory charged in between may not be on the device yet and would hide footprint. The
  // bytes given back and charged meanwhile bound both: a raise goes to the figure less what was given back, a
  // lowering to the figure plus what was charged, so neither can overshoot. (Not bounded: another thread's
  // allocation charged before the first read and made after NVML's; it hides footprint from a lowering until
  // the limiter thread's next tick charges it again.)
  pthread_mutex_lock(&g_footprint_mutex);
  const uint64_t charged_before = region.charged_total();
  const uint64_t uncharged_before = region.uncharged_total();
  uint64_t used = 0;
  const ProcessUse use = ProcessUsedBytes(ordinal, &used);
  const uint64_t mine = region.ChargedByMe(d->region_index);
  const uint64_t given_back = region.uncharged_total() - uncharged_before;
  const uint64_t charged = region.charged_total() - charged_before;
  // Not listed: no context of this process on the GPU (after a destroy), or NVML does not know this pid.
  if (use == ProcessUse::kUnavailable || (use == ProcessUse::kNotListed && mode != TrueUp::kExact)) {
    pthread_mutex_unlock(&g_footprint_mutex);
    return CUDA_SUCCESS;
  }
  if (known != nullptr) *known = use == ProcessUse::kKnown;
  const uint64_t footprint = d->footprint_bytes;
  const uint64_t named = mine > footprint ? mine - footprint : 0;
  const uint64_t measured = used > named ? used - named : 0;
  const uint64_t want = measured > given_back ? measured - given_back : 0;
  const uint64_t floor = measured + charged;
  CUresult result = CUDA_SUCCESS;
  if (want > footprint) {
    const uint64_t grow = want - footprint;
    if (mode == TrueUp::kMustFit) {
      result = ChargeBefore(ordinal, grow);
      if (result == CUDA_SUCCESS) d->footprint_bytes = want;
    } else if (region.ForceCharge(d->region_index, grow)) {
      d->footprint_bytes = want;
    }
    if (result == CUDA_SUCCESS && footprint == 0 && d->shared != nullptr) {
      // The first footprint of a process is its context: remembered for processes that cannot measure.
      d->shared->context_bytes.store(want, std::memory_order_relaxed);
    }
  } else if (floor < footprint && mode == TrueUp::kExact) {
    if (region.Uncharge(d->region_index, footprint - floor)) d->footprint_bytes = floor;
  }
  pthread_mutex_unlock(&g_footprint_mutex);
  return result;
}

CUresult ReserveFootprint(int ordinal, uint64_t bytes) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || bytes == 0) return CUDA_SUCCESS;
  pthread_mutex_lock(&g_footprint_mutex);
  const CUresult r = ChargeBefore(ordinal, bytes);
  if (r == CUDA_SUCCESS) d->footprint_bytes += bytes;
  pthread_mutex_unlock(&g_footprint_mutex);
  return r;
}

void DropFootprint(int ordinal, uint64_t bytes, bool uncharge) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || bytes == 0) return;
  pthread_mutex_lock(&g_footprint_mutex);
  const uint64_t take = bytes < d->footprint_bytes ? bytes : d->footprint_bytes;
  if (!uncharge) {
    d->footprint_bytes -= take;
  } else if (g_state.session.region.Uncharge(d->region_index, take)) {
    d->footprint_bytes -= take;
  }
  pthread_mutex_unlock(&g_footprint_mutex);
}

void TrueUpAllFootprints() {
  const int n = g_state.device_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    if (g_state.devices[i].footprint_bytes != 0) TrueUpFootprint(i, TrueUp::kRaiseOnly);
  }
}

namespace {

// Runs a call that may make the current context's footprint grow; a growth past the limit is undone.
template <typename Call, typename Undo>
CUresult Growing(Call call, Undo undo) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = call();
  if (r != CUDA_SUCCESS || mode != Mode::kLimited) return r;
  const int ordinal = CurrentDevice();
  if (TrueUpFootprint(ordinal, TrueUp::kMustFit) != CUDA_SUCCESS) {
    undo();
    TrueUpFootprint(ordinal, TrueUp::kExact);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  return r;
}

// Runs a call that may make the current context's footprint shrink.
template <typename Call>
CUresult Shrinking(int ordinal, Call call) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = call();
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) TrueUpFootprint(ordinal, TrueUp::kExact);
  return r;
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

// --- Modules and libraries -----------------------------------------------------------------------------------

extern "C" CUresult tessera_cuModuleLoad(CUmodule* module, const char* fname) {
  return Growing([&] { return g_cu.real_cuModuleLoad == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuModuleLoad(module, fname); },
                 [&] { g_cu.real_cuModuleUnload(*module); });
}
extern "C" CUresult tessera_cuModuleLoadData(CUmodule* module, const void* image) {
  return Growing([&] { return g_cu.real_cuModuleLoadData == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuModuleLoadData(module, image); },
                 [&] { g_cu.real_cuModuleUnload(*module); });
}
extern "C" CUresult tessera_cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int n,
                                               CUjit_option* options, void** values) {
  return Growing([&] { return g_cu.real_cuModuleLoadDataEx == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuModuleLoadDataEx(module, image, n, options, values); },
                 [&] { g_cu.real_cuModuleUnload(*module); });
}
extern "C" CUresult tessera_cuModuleLoadFatBinary(CUmodule* module, const void* fatbin) {
  return Growing([&] { return g_cu.real_cuModuleLoadFatBinary == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuModuleLoadFatBinary(module, fatbin); },
                 [&] { g_cu.real_cuModuleUnload(*module); });
}
extern "C" CUresult tessera_cuModuleUnload(CUmodule module) {
  return Shrinking(CurrentDevice(), [&] { return g_cu.real_cuModuleUnload == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuModuleUnload(module); });
}
extern "C" CUresult tessera_cuLibraryLoadData(CUlibrary* library, const void* code, CUjit_option* jit_options,
                                              void** jit_values, unsigned int n_jit, CUlibraryOption* options,
                                              void** values, unsigned int n) {
  return Growing(
      [&] { return g_cu.real_cuLibraryLoadData == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuLibraryLoadData(library, code, jit_options, jit_values, n_jit, options, values, n); },
      [&] { g_cu.real_cuLibraryUnload(*library); });
}
extern "C" CUresult tessera_cuLibraryLoadFromFile(CUlibrary* library, const char* file, CUjit_option* jit_options,
                                                  void** jit_values, unsigned int n_jit, CUlibraryOption* options,
                                                  void** values, unsigned int n) {
  return Growing(
      [&] {
        return g_cu.real_cuLibraryLoadFromFile == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuLibraryLoadFromFile(library, file, jit_options, jit_values, n_jit, options, values, n);
      },
      [&] { g_cu.real_cuLibraryUnload(*library); });
}
extern "C" CUresult tessera_cuLibraryUnload(CUlibrary library) {
  return Shrinking(CurrentDevice(), [&] { return g_cu.real_cuLibraryUnload == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuLibraryUnload(library); });
}

// --- Limits and green contexts -------------------------------------------------------------------------------

extern "C" CUresult tessera_cuCtxSetLimit(CUlimit limit, size_t value) {
  // A larger stack or heap grows the context; a smaller one shrinks it: measured either way.
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (g_cu.real_cuCtxSetLimit == nullptr) return CUDA_ERROR_NOT_FOUND;
  const CUresult r = g_cu.real_cuCtxSetLimit(limit, value);
  if (r != CUDA_SUCCESS || mode != Mode::kLimited) return r;
  // A growth past the limit cannot be undone without knowing the old value: refused beforehand is not
  // possible either (the driver decides the size), so it is charged, and allocations fail until it fits.
  TrueUpFootprint(CurrentDevice(), TrueUp::kExact);
  return r;
}

extern "C" CUresult tessera_cuGreenCtxCreate(CUgreenCtx* ctx, CUdevResourceDesc desc, CUdevice dev,
                                             unsigned int flags) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited) return g_cu.real_cuGreenCtxCreate == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuGreenCtxCreate(ctx, desc, dev, flags);
  HookDevice* d = DeviceAt(static_cast<int>(dev));
  if (d != nullptr && !d->has_limits) return RefusalFor(static_cast<int>(dev));
  const CUresult r = g_cu.real_cuGreenCtxCreate(ctx, desc, dev, flags);
  if (r != CUDA_SUCCESS) return r;
  if (TrueUpFootprint(static_cast<int>(dev), TrueUp::kMustFit) != CUDA_SUCCESS) {
    g_cu.real_cuGreenCtxDestroy(*ctx);
    TrueUpFootprint(static_cast<int>(dev), TrueUp::kExact);
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  AllocRecord rec;
  rec.ordinal = static_cast<int>(dev);
  RecordAlloc(AllocKind::kGreenContext, reinterpret_cast<uint64_t>(*ctx), rec);
  return r;
}

extern "C" CUresult tessera_cuGreenCtxDestroy(CUgreenCtx ctx) {
  AllocRecord rec;
  const bool found = CurrentMode() == Mode::kLimited &&
                     TakeAlloc(AllocKind::kGreenContext, reinterpret_cast<uint64_t>(ctx), &rec);
  return Shrinking(found ? rec.ordinal : -1, [&] { return g_cu.real_cuGreenCtxDestroy == nullptr ? CUDA_ERROR_NOT_FOUND : g_cu.real_cuGreenCtxDestroy(ctx); });
}
