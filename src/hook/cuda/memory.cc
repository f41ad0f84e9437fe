// Memory: every path that takes device memory is charged to the container before the driver is asked
// (reserve-then-commit), and given back on the matching free, release or destroy. Contexts' own footprint is
// charged too. cuMemGetInfo and cuDeviceTotalMem report the limit and the container's use.
#include <string.h>

#include "hook/cuda/hook.h"

namespace tessera::cuda_hook {


namespace {

bool Limited() {
  return EnsureInit() == Mode::kLimited;
}

uint64_t CurrentContext() {
  CUcontext ctx = nullptr;
  if (g_cu.real_cuCtxGetCurrent != nullptr) g_cu.real_cuCtxGetCurrent(&ctx);
  return reinterpret_cast<uint64_t>(ctx);
}

// Charges, then runs the allocation; gives the charge back when the driver fails.
template <typename Call>
CUresult Charged(int ordinal, uint64_t bytes, AllocKind kind, uint64_t owner, Call call, uint64_t* key_out) {
  const CUresult c = ChargeBefore(ordinal, bytes);
  if (c != CUDA_SUCCESS) return c;
  uint64_t key = 0;
  const CUresult r = call(&key);
  if (r != CUDA_SUCCESS) {
    Uncharge(ordinal, bytes);
    return r;
  }
  AllocRecord rec;
  rec.bytes = bytes;
  rec.ordinal = ordinal;
  rec.owner = owner;
  rec.refs = 1;
  RecordAlloc(kind, key, rec);
  if (key_out != nullptr) *key_out = key;
  return r;
}

void ReleaseLinear(uint64_t dptr) {
  AllocRecord rec;
  if (TakeAlloc(AllocKind::kLinear, dptr, &rec) || TakeAlloc(AllocKind::kGraph, dptr, &rec)) {
    Uncharge(rec.ordinal, rec.bytes);
  }
}

uint64_t RoundUp(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

uint64_t FormatBytes(CUarray_format f) {
  switch (f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
    default:
      return 4;  // the block-compressed and packed formats: at most 4 bytes per element per channel
  }
}

// An array's footprint: rows padded to 512 bytes, the whole to 64 KiB pages (the driver's tiled layouts are
// not visible through the API; this errs on the side of charging more).
uint64_t ArrayBytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format format, unsigned channels) {
  const uint64_t row = RoundUp((w == 0 ? 1 : w) * FormatBytes(format) * (channels == 0 ? 1 : channels), 512);
  return RoundUp(row * (h == 0 ? 1 : h) * (d == 0 ? 1 : d), 65536);
}

uint64_t Array3DBytes(const CUDA_ARRAY3D_DESCRIPTOR& a) {
  uint64_t depth = a.Depth;
  if ((a.Flags & CUDA_ARRAY3D_CUBEMAP) != 0) depth = depth == 0 ? 6 : depth;
  return ArrayBytes(a.Width, a.Height, depth, a.Format, a.NumChannels);
}

uint64_t NvmlUsed(int ordinal) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || !LoadRealNvml() || g_nvml.nvmlDeviceGetHandleByUUID == nullptr ||
      g_nvml.nvmlDeviceGetMemoryInfo == nullptr || g_nvml.nvmlInit_v2 == nullptr) {
    return UINT64_MAX;
  }
  static bool nvml_init = false;
  if (!nvml_init) {
    if (g_nvml.nvmlInit_v2() != NVML_SUCCESS) return UINT64_MAX;
    nvml_init = true;
  }
  nvmlDevice_t h = nullptr;
  nvmlMemory_t m;
  if (g_nvml.nvmlDeviceGetHandleByUUID(d->uuid, &h) != NVML_SUCCESS ||
      g_nvml.nvmlDeviceGetMemoryInfo(h, &m) != NVML_SUCCESS) {
    return UINT64_MAX;
  }
  return m.used;
}

// What a new context took: TESSERA_CONTEXT_BYTES when set, else the GPU's used memory before and after
// (NVML), as closely as a shared GPU allows.
uint64_t ContextBytes(uint64_t before, int ordinal) {
  if (g_state.context_bytes_set) return g_state.context_bytes_override;
  if (before == UINT64_MAX) return 0;
  const uint64_t after = NvmlUsed(ordinal);
  if (after == UINT64_MAX || after <= before) return 0;
  const uint64_t delta = after - before;
  return delta > (4ull << 30) ? 0 : delta;  // more than 4 GiB is someone else's allocation, not a context
}

void ReleaseContextMemory(uint64_t ctx) {
  ReleaseOwned(AllocKind::kLinear, ctx);
  ReleaseOwned(AllocKind::kArray, ctx);
  ReleaseOwned(AllocKind::kMipmapped, ctx);
}

// Charges a context that now exists; destroys it again (via `undo`) when it does not fit.
template <typename Undo>
CUresult ChargeContext(int ordinal, uint64_t ctx, uint64_t before, Undo undo) {
  const uint64_t bytes = ContextBytes(before, ordinal);
  const CUresult c = ChargeBefore(ordinal, bytes);
  if (c != CUDA_SUCCESS) {
    undo();
    return c;
  }
  AllocRecord rec;
  rec.bytes = bytes;
  rec.ordinal = ordinal;
  rec.owner = ctx;
  RecordAlloc(AllocKind::kContext, ctx, rec);
  return CUDA_SUCCESS;
}

template <typename Create>
CUresult CreateContext(CUcontext* pctx, CUdevice dev, Create create) {
  if (!Limited()) return create();
  HookDevice* d = DeviceAt(static_cast<int>(dev));
  if (d != nullptr && !d->has_limits) return RefusalFor(static_cast<int>(dev));
  const uint64_t before = g_state.context_bytes_set ? 0 : NvmlUsed(static_cast<int>(dev));
  const CUresult r = create();
  if (r != CUDA_SUCCESS || pctx == nullptr) return r;
  CUcontext ctx = *pctx;
  return ChargeContext(static_cast<int>(dev), reinterpret_cast<uint64_t>(ctx), before,
                       [&] { g_cu.real_cuCtxDestroy_v2(ctx); });
}

template <typename Destroy>
CUresult DestroyContext(CUcontext ctx, Destroy destroy) {
  const CUresult r = destroy();
  if (r != CUDA_SUCCESS || !Limited()) return r;
  AllocRecord rec;
  if (TakeAlloc(AllocKind::kContext, reinterpret_cast<uint64_t>(ctx), &rec)) Uncharge(rec.ordinal, rec.bytes);
  ReleaseContextMemory(reinterpret_cast<uint64_t>(ctx));
  return r;
}

template <typename Release>
CUresult ReleasePrimary(CUdevice dev, bool reset, Release release) {
  if (!Limited()) return release();
  // The primary context's handle, before it goes away.
  CUcontext ctx = nullptr;
  HookDevice* d = DeviceAt(static_cast<int>(dev));
  const CUresult r = release();
  if (r != CUDA_SUCCESS || d == nullptr) return r;
  (void)ctx;
  // Find the primary context record of this device (the one charged by Retain).
  uint64_t keys[1];
  AllocRecord recs[1];
  const uint64_t primary_key = 0x7000000000000000ull | static_cast<uint64_t>(dev);
  if (reset) {
    AllocRecord rec;
    if (FindAlloc(AllocKind::kContext, primary_key, &rec)) ReleaseContextMemory(rec.owner);
    return r;
  }
  if (d->primary_refs > 0) --d->primary_refs;
  if (d->primary_refs == 0) {
    AllocRecord rec;
    if (TakeAlloc(AllocKind::kContext, primary_key, &rec)) {
      Uncharge(rec.ordinal, rec.bytes);
      ReleaseContextMemory(rec.owner);
    }
  }
  (void)keys;
  (void)recs;
  return r;
}

template <typename GetInfo>
CUresult MemInfo(GetInfo get, uint64_t* free_out, uint64_t* total_out) {
  uint64_t real_free = 0;
  uint64_t real_total = 0;
  const CUresult r = get(&real_free, &real_total);
  if (r != CUDA_SUCCESS) return r;
  *free_out = real_free;
  *total_out = real_total;
  if (CurrentMode() != Mode::kLimited) return r;
  HookDevice* d = DeviceAt(CurrentDevice());
  if (d == nullptr || d->region_index < 0 || !d->has_limits) return r;
  const uint64_t limit = g_state.region.Limit(d->region_index);
  if (limit == 0) return r;
  const uint64_t total = limit < real_total ? limit : real_total;
  const uint64_t used = g_state.region.Used(d->region_index);
  uint64_t free = total > used ? total - used : 0;
  if (free > real_free) free = real_free;  // the GPU itself may have less left than the quota
  *free_out = free;
  *total_out = total;
  return r;
}

void UnmapRange(uint64_t begin, uint64_t end) {
  for (;;) {
    uint64_t keys[32];
    AllocRecord maps[32];
    const int n = CollectInRange(AllocKind::kMapping, begin, end, keys, maps, 32);
    for (int i = 0; i < n; ++i) {
      AllocRecord m;
      if (!TakeAlloc(AllocKind::kMapping, keys[i], &m)) continue;
      AllocRecord h;
      if (!FindAlloc(AllocKind::kVmmHandle, m.owner, &h)) continue;
      if (h.mapped > 0) --h.mapped;
      if (h.released && h.refs <= 0 && h.mapped == 0) {
        if (TakeAlloc(AllocKind::kVmmHandle, m.owner, &h)) Uncharge(h.ordinal, h.bytes);
      } else {
        UpdateAlloc(AllocKind::kVmmHandle, m.owner, h);
      }
    }
    if (n < 32) return;
  }
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

// --- What the device reports --------------------------------------------------------------------------------

extern "C" CUresult tessera_cuMemGetInfo_v2(size_t* free, size_t* total) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  uint64_t f = 0;
  uint64_t t = 0;
  const CUresult r = MemInfo(
      [](uint64_t* rf, uint64_t* rt) {
        size_t a = 0;
        size_t b = 0;
        const CUresult x = g_cu.real_cuMemGetInfo_v2(&a, &b);
        *rf = a;
        *rt = b;
        return x;
      },
      &f, &t);
  if (r == CUDA_SUCCESS) {
    if (free != nullptr) *free = f;
    if (total != nullptr) *total = t;
  }
  return r;
}

extern "C" CUresult tessera_cuMemGetInfo(unsigned int* free, unsigned int* total) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  uint64_t f = 0;
  uint64_t t = 0;
  const CUresult r = MemInfo(
      [](uint64_t* rf, uint64_t* rt) {
        unsigned a = 0;
        unsigned b = 0;
        const CUresult x = g_cu.real_cuMemGetInfo(&a, &b);
        *rf = a;
        *rt = b;
        return x;
      },
      &f, &t);
  if (r == CUDA_SUCCESS) {
    if (free != nullptr) *free = static_cast<unsigned>(f > 0xffffffffu ? 0xffffffffu : f);
    if (total != nullptr) *total = static_cast<unsigned>(t > 0xffffffffu ? 0xffffffffu : t);
  }
  return r;
}

namespace {
uint64_t LimitedTotal(int ordinal, uint64_t real_total) {
  if (CurrentMode() != Mode::kLimited) return real_total;
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || d->region_index < 0 || !d->has_limits) return real_total;
  const uint64_t limit = g_state.region.Limit(d->region_index);
  return limit != 0 && limit < real_total ? limit : real_total;
}
}  // namespace

extern "C" CUresult tessera_cuDeviceTotalMem_v2(size_t* bytes, CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = g_cu.real_cuDeviceTotalMem_v2(bytes, dev);
  if (r == CUDA_SUCCESS && bytes != nullptr) *bytes = LimitedTotal(static_cast<int>(dev), *bytes);
  return r;
}

extern "C" CUresult tessera_cuDeviceTotalMem(unsigned int* bytes, CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = g_cu.real_cuDeviceTotalMem(bytes, dev);
  if (r == CUDA_SUCCESS && bytes != nullptr) {
    *bytes = static_cast<unsigned>(LimitedTotal(static_cast<int>(dev), *bytes));
  }
  return r;
}

// --- Contexts -------------------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuCtxCreate(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  return CreateContext(pctx, dev, [&] { return g_cu.real_cuCtxCreate(pctx, flags, dev); });
}
extern "C" CUresult tessera_cuCtxCreate_v2(CUcontext* pctx, unsigned int flags, CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  return CreateContext(pctx, dev, [&] { return g_cu.real_cuCtxCreate_v2(pctx, flags, dev); });
}
extern "C" CUresult tessera_cuCtxCreate_v3(CUcontext* pctx, CUexecAffinityParam* params, int n, unsigned int flags,
                                           CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  return CreateContext(pctx, dev, [&] { return g_cu.real_cuCtxCreate_v3(pctx, params, n, flags, dev); });
}
extern "C" CUresult tessera_cuCtxCreate_v4(CUcontext* pctx, CUctxCreateParams* params, unsigned int flags,
                                           CUdevice dev) {
  if (EnsureInit() == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  return CreateContext(pctx, dev, [&] { return g_cu.real_cuCtxCreate_v4(pctx, params, flags, dev); });
}
extern "C" CUresult tessera_cuCtxDestroy(CUcontext ctx) {
  return DestroyContext(ctx, [&] { return g_cu.real_cuCtxDestroy(ctx); });
}
extern "C" CUresult tessera_cuCtxDestroy_v2(CUcontext ctx) {
  return DestroyContext(ctx, [&] { return g_cu.real_cuCtxDestroy_v2(ctx); });
}

extern "C" CUresult tessera_cuDevicePrimaryCtxRetain(CUcontext* pctx, CUdevice dev) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited) return g_cu.real_cuDevicePrimaryCtxRetain(pctx, dev);
  HookDevice* d = DeviceAt(static_cast<int>(dev));
  if (d != nullptr && !d->has_limits) return RefusalFor(static_cast<int>(dev));
  const bool first = d != nullptr && d->primary_refs == 0;
  const uint64_t before = first && !g_state.context_bytes_set ? NvmlUsed(static_cast<int>(dev)) : 0;
  const CUresult r = g_cu.real_cuDevicePrimaryCtxRetain(pctx, dev);
  if (r != CUDA_SUCCESS || d == nullptr) return r;
  if (first) {
    const uint64_t key = 0x7000000000000000ull | static_cast<uint64_t>(dev);
    const CUresult c = ChargeContext(static_cast<int>(dev), reinterpret_cast<uint64_t>(*pctx), before,
                                     [&] { g_cu.real_cuDevicePrimaryCtxRelease_v2(dev); });
    if (c != CUDA_SUCCESS) return c;
    // Re-key the record by device: the primary context is released by device, not by handle.
    AllocRecord rec;
    if (TakeAlloc(AllocKind::kContext, reinterpret_cast<uint64_t>(*pctx), &rec)) {
      RecordAlloc(AllocKind::kContext, key, rec);
    }
  }
  ++d->primary_refs;
  return r;
}

extern "C" CUresult tessera_cuDevicePrimaryCtxRelease(CUdevice dev) {
  return ReleasePrimary(dev, false, [&] { return g_cu.real_cuDevicePrimaryCtxRelease(dev); });
}
extern "C" CUresult tessera_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
  return ReleasePrimary(dev, false, [&] { return g_cu.real_cuDevicePrimaryCtxRelease_v2(dev); });
}
extern "C" CUresult tessera_cuDevicePrimaryCtxReset(CUdevice dev) {
  return ReleasePrimary(dev, true, [&] { return g_cu.real_cuDevicePrimaryCtxReset(dev); });
}
extern "C" CUresult tessera_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
  return ReleasePrimary(dev, true, [&] { return g_cu.real_cuDevicePrimaryCtxReset_v2(dev); });
}

// --- Linear memory --------------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytesize) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || bytesize == 0 || dptr == nullptr) return g_cu.real_cuMemAlloc_v2(dptr, bytesize);
  return Charged(CurrentDevice(), bytesize, AllocKind::kLinear, CurrentContext(),
                 [&](uint64_t* key) {
                   const CUresult r = g_cu.real_cuMemAlloc_v2(dptr, bytesize);
                   *key = *dptr;
                   return r;
                 },
                 nullptr);
}

extern "C" CUresult tessera_cuMemAlloc(CUdeviceptr_v1* dptr, unsigned int bytesize) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || bytesize == 0 || dptr == nullptr) return g_cu.real_cuMemAlloc(dptr, bytesize);
  return Charged(CurrentDevice(), bytesize, AllocKind::kLinear, CurrentContext(),
                 [&](uint64_t* key) {
                   const CUresult r = g_cu.real_cuMemAlloc(dptr, bytesize);
                   *key = *dptr;
                   return r;
                 },
                 nullptr);
}

namespace {
// Pitched allocations: charge the widest pitch the driver uses (rows padded to 512 bytes), then settle on the
// real pitch.
template <typename Call>
CUresult Pitched(uint64_t width, uint64_t height, Call call, uint64_t* key_out, uint64_t* pitch_out) {
  const int ordinal = CurrentDevice();
  const uint64_t estimate = RoundUp(width == 0 ? 1 : width, 512) * (height == 0 ? 1 : height);
  uint64_t key = 0;
  const CUresult r = Charged(ordinal, estimate, AllocKind::kLinear, CurrentContext(), call, &key);
  if (r != CUDA_SUCCESS) return r;
  *key_out = key;
  const uint64_t actual = *pitch_out * height;
  AllocRecord rec;
  if (actual != estimate && FindAlloc(AllocKind::kLinear, key, &rec)) {
    if (actual < estimate) {
      Uncharge(ordinal, estimate - actual);
      rec.bytes = actual;
    } else if (ChargeBefore(ordinal, actual - estimate) == CUDA_SUCCESS) {
      rec.bytes = actual;
    }
    UpdateAlloc(AllocKind::kLinear, key, rec);
  }
  return r;
}
}  // namespace

extern "C" CUresult tessera_cuMemAllocPitch_v2(CUdeviceptr* dptr, size_t* pitch, size_t width, size_t height,
                                               unsigned int elem) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || dptr == nullptr || pitch == nullptr || width == 0 || height == 0) {
    return g_cu.real_cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
  }
  uint64_t key = 0;
  uint64_t p = 0;
  return Pitched(
      width, height,
      [&](uint64_t* k) {
        const CUresult r = g_cu.real_cuMemAllocPitch_v2(dptr, pitch, width, height, elem);
        *k = *dptr;
        p = *pitch;
        return r;
      },
      &key, &p);
}

extern "C" CUresult tessera_cuMemAllocPitch(CUdeviceptr_v1* dptr, unsigned int* pitch, unsigned int width,
                                            unsigned int height, unsigned int elem) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || dptr == nullptr || pitch == nullptr || width == 0 || height == 0) {
    return g_cu.real_cuMemAllocPitch(dptr, pitch, width, height, elem);
  }
  uint64_t key = 0;
  uint64_t p = 0;
  return Pitched(
      width, height,
      [&](uint64_t* k) {
        const CUresult r = g_cu.real_cuMemAllocPitch(dptr, pitch, width, height, elem);
        *k = *dptr;
        p = *pitch;
        return r;
      },
      &key, &p);
}

extern "C" CUresult tessera_cuMemAllocManaged(CUdeviceptr* dptr, size_t bytesize, unsigned int flags) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || bytesize == 0 || dptr == nullptr) {
    return g_cu.real_cuMemAllocManaged(dptr, bytesize, flags);
  }
  // Managed memory may live on the device: charged like device memory.
  return Charged(CurrentDevice(), bytesize, AllocKind::kLinear, CurrentContext(),
                 [&](uint64_t* key) {
                   const CUresult r = g_cu.real_cuMemAllocManaged(dptr, bytesize, flags);
                   *key = *dptr;
                   return r;
                 },
                 nullptr);
}

extern "C" CUresult tessera_cuMemFree_v2(CUdeviceptr dptr) {
  const CUresult r = g_cu.real_cuMemFree_v2 != nullptr ? g_cu.real_cuMemFree_v2(dptr) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseLinear(dptr);
  return r;
}

extern "C" CUresult tessera_cuMemFree(CUdeviceptr_v1 dptr) {
  const CUresult r = g_cu.real_cuMemFree != nullptr ? g_cu.real_cuMemFree(dptr) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseLinear(dptr);
  return r;
}

// --- Arrays ---------------------------------------------------------------------------------------------------

namespace {
template <typename Call>
CUresult ChargedHandle(uint64_t bytes, AllocKind kind, Call call) {
  return Charged(CurrentDevice(), bytes, kind, CurrentContext(), call, nullptr);
}
void ReleaseHandle(AllocKind kind, uint64_t key) {
  AllocRecord rec;
  if (TakeAlloc(kind, key, &rec)) Uncharge(rec.ordinal, rec.bytes);
}
}  // namespace

extern "C" CUresult tessera_cuArrayCreate_v2(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR* desc) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || desc == nullptr) return g_cu.real_cuArrayCreate_v2(handle, desc);
  return ChargedHandle(ArrayBytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), AllocKind::kArray,
                       [&](uint64_t* key) {
                         const CUresult r = g_cu.real_cuArrayCreate_v2(handle, desc);
                         *key = reinterpret_cast<uint64_t>(*handle);
                         return r;
                       });
}

extern "C" CUresult tessera_cuArrayCreate(CUarray* handle, const CUDA_ARRAY_DESCRIPTOR_v1* desc) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || desc == nullptr) return g_cu.real_cuArrayCreate(handle, desc);
  return ChargedHandle(ArrayBytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels), AllocKind::kArray,
                       [&](uint64_t* key) {
                         const CUresult r = g_cu.real_cuArrayCreate(handle, desc);
                         *key = reinterpret_cast<uint64_t>(*handle);
                         return r;
                       });
}

extern "C" CUresult tessera_cuArray3DCreate_v2(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || desc == nullptr) {
    return g_cu.real_cuArray3DCreate_v2(handle, desc);
  }
  return ChargedHandle(Array3DBytes(*desc), AllocKind::kArray, [&](uint64_t* key) {
    const CUresult r = g_cu.real_cuArray3DCreate_v2(handle, desc);
    *key = reinterpret_cast<uint64_t>(*handle);
    return r;
  });
}

extern "C" CUresult tessera_cuArray3DCreate(CUarray* handle, const CUDA_ARRAY3D_DESCRIPTOR_v1* desc) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || desc == nullptr) return g_cu.real_cuArray3DCreate(handle, desc);
  CUDA_ARRAY3D_DESCRIPTOR d2{desc->Width, desc->Height, desc->Depth, desc->Format, desc->NumChannels, desc->Flags};
  return ChargedHandle(Array3DBytes(d2), AllocKind::kArray, [&](uint64_t* key) {
    const CUresult r = g_cu.real_cuArray3DCreate(handle, desc);
    *key = reinterpret_cast<uint64_t>(*handle);
    return r;
  });
}

extern "C" CUresult tessera_cuArrayDestroy(CUarray handle) {
  const CUresult r = g_cu.real_cuArrayDestroy != nullptr ? g_cu.real_cuArrayDestroy(handle) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) {
    ReleaseHandle(AllocKind::kArray, reinterpret_cast<uint64_t>(handle));
  }
  return r;
}

extern "C" CUresult tessera_cuMipmappedArrayCreate(CUmipmappedArray* handle, const CUDA_ARRAY3D_DESCRIPTOR* desc,
                                                   unsigned int levels) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || desc == nullptr) {
    return g_cu.real_cuMipmappedArrayCreate(handle, desc, levels);
  }
  uint64_t bytes = 0;
  CUDA_ARRAY3D_DESCRIPTOR level = *desc;
  for (unsigned i = 0; i < (levels == 0 ? 1 : levels); ++i) {
    bytes += Array3DBytes(level);
    level.Width = level.Width > 1 ? level.Width / 2 : 1;
    level.Height = level.Height > 1 ? level.Height / 2 : level.Height;
    if ((desc->Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) == 0) {
      level.Depth = level.Depth > 1 ? level.Depth / 2 : level.Depth;
    }
  }
  return ChargedHandle(bytes, AllocKind::kMipmapped, [&](uint64_t* key) {
    const CUresult r = g_cu.real_cuMipmappedArrayCreate(handle, desc, levels);
    *key = reinterpret_cast<uint64_t>(*handle);
    return r;
  });
}

extern "C" CUresult tessera_cuMipmappedArrayDestroy(CUmipmappedArray handle) {
  const CUresult r = g_cu.real_cuMipmappedArrayDestroy != nullptr ? g_cu.real_cuMipmappedArrayDestroy(handle)
                                                                   : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) {
    ReleaseHandle(AllocKind::kMipmapped, reinterpret_cast<uint64_t>(handle));
  }
  return r;
}

// --- Virtual memory management ------------------------------------------------------------------------------

extern "C" CUresult tessera_cuMemCreate(CUmemGenericAllocationHandle* handle, size_t size,
                                        const CUmemAllocationProp* prop, unsigned long long flags) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || handle == nullptr || prop == nullptr ||
      prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return g_cu.real_cuMemCreate(handle, size, prop, flags);  // host memory is not charged
  }
  return Charged(prop->location.id, size, AllocKind::kVmmHandle, 0,
                 [&](uint64_t* key) {
                   const CUresult r = g_cu.real_cuMemCreate(handle, size, prop, flags);
                   *key = *handle;
                   return r;
                 },
                 nullptr);
}

extern "C" CUresult tessera_cuMemRelease(CUmemGenericAllocationHandle handle) {
  const CUresult r = g_cu.real_cuMemRelease != nullptr ? g_cu.real_cuMemRelease(handle) : CUDA_ERROR_NOT_INITIALIZED;
  if (r != CUDA_SUCCESS || CurrentMode() != Mode::kLimited) return r;
  AllocRecord h;
  if (!FindAlloc(AllocKind::kVmmHandle, handle, &h)) return r;
  --h.refs;
  h.released = true;
  // The physical memory goes back when the last reference is released and the last mapping unmapped.
  if (h.refs <= 0 && h.mapped == 0) {
    if (TakeAlloc(AllocKind::kVmmHandle, handle, &h)) Uncharge(h.ordinal, h.bytes);
  } else {
    UpdateAlloc(AllocKind::kVmmHandle, handle, h);
  }
  return r;
}

extern "C" CUresult tessera_cuMemRetainAllocationHandle(CUmemGenericAllocationHandle* handle, void* addr) {
  const CUresult r = g_cu.real_cuMemRetainAllocationHandle != nullptr
                         ? g_cu.real_cuMemRetainAllocationHandle(handle, addr)
                         : CUDA_ERROR_NOT_INITIALIZED;
  if (r != CUDA_SUCCESS || CurrentMode() != Mode::kLimited || handle == nullptr) return r;
  AllocRecord h;
  if (FindAlloc(AllocKind::kVmmHandle, *handle, &h)) {
    ++h.refs;
    UpdateAlloc(AllocKind::kVmmHandle, *handle, h);
  }
  return r;
}

extern "C" CUresult tessera_cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                                     unsigned long long flags) {
  const CUresult r = g_cu.real_cuMemMap != nullptr ? g_cu.real_cuMemMap(ptr, size, offset, handle, flags)
                                                   : CUDA_ERROR_NOT_INITIALIZED;
  if (r != CUDA_SUCCESS || CurrentMode() != Mode::kLimited) return r;
  AllocRecord h;
  if (FindAlloc(AllocKind::kVmmHandle, handle, &h)) {
    ++h.mapped;
    UpdateAlloc(AllocKind::kVmmHandle, handle, h);
    AllocRecord m;
    m.bytes = size;
    m.ordinal = h.ordinal;
    m.owner = handle;
    RecordAlloc(AllocKind::kMapping, ptr, m);
  }
  return r;
}

extern "C" CUresult tessera_cuMemUnmap(CUdeviceptr ptr, size_t size) {
  const CUresult r = g_cu.real_cuMemUnmap != nullptr ? g_cu.real_cuMemUnmap(ptr, size) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) UnmapRange(ptr, ptr + size);
  return r;
}

// --- Stream-ordered allocation and pools ---------------------------------------------------------------------

namespace {
int PoolDevice(CUmemoryPool pool) {
  AllocRecord rec;
  if (FindAlloc(AllocKind::kPool, reinterpret_cast<uint64_t>(pool), &rec)) return rec.ordinal;
  return CurrentDevice();
}

template <typename Call>
CUresult AsyncAlloc(CUdeviceptr* dptr, size_t bytesize, int ordinal, Call call) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || bytesize == 0 || dptr == nullptr) return call();
  return Charged(ordinal, bytesize, AllocKind::kLinear, CurrentContext(),
                 [&](uint64_t* key) {
                   const CUresult r = call();
                   *key = *dptr;
                   return r;
                 },
                 nullptr);
}
}  // namespace

extern "C" CUresult tessera_cuMemAllocAsync(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return AsyncAlloc(dptr, bytesize, CurrentDevice(), [&] { return g_cu.real_cuMemAllocAsync(dptr, bytesize, stream); });
}
extern "C" CUresult tessera_cuMemAllocAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUstream stream) {
  return AsyncAlloc(dptr, bytesize, CurrentDevice(),
                    [&] { return g_cu.real_cuMemAllocAsync_ptsz(dptr, bytesize, stream); });
}
extern "C" CUresult tessera_cuMemAllocFromPoolAsync(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                    CUstream stream) {
  return AsyncAlloc(dptr, bytesize, PoolDevice(pool),
                    [&] { return g_cu.real_cuMemAllocFromPoolAsync(dptr, bytesize, pool, stream); });
}
extern "C" CUresult tessera_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr* dptr, size_t bytesize, CUmemoryPool pool,
                                                         CUstream stream) {
  return AsyncAlloc(dptr, bytesize, PoolDevice(pool),
                    [&] { return g_cu.real_cuMemAllocFromPoolAsync_ptsz(dptr, bytesize, pool, stream); });
}
extern "C" CUresult tessera_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  const CUresult r = g_cu.real_cuMemFreeAsync != nullptr ? g_cu.real_cuMemFreeAsync(dptr, stream)
                                                         : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseLinear(dptr);
  return r;
}
extern "C" CUresult tessera_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  const CUresult r = g_cu.real_cuMemFreeAsync_ptsz != nullptr ? g_cu.real_cuMemFreeAsync_ptsz(dptr, stream)
                                                              : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseLinear(dptr);
  return r;
}
extern "C" CUresult tessera_cuMemPoolCreate(CUmemoryPool* pool, const CUmemPoolProps* props) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  const CUresult r = g_cu.real_cuMemPoolCreate(pool, props);
  if (r == CUDA_SUCCESS && mode == Mode::kLimited && pool != nullptr && props != nullptr &&
      props->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
    AllocRecord rec;
    rec.ordinal = props->location.id;
    RecordAlloc(AllocKind::kPool, reinterpret_cast<uint64_t>(*pool), rec);
  }
  return r;
}

// --- Graph memory nodes ---------------------------------------------------------------------------------------

extern "C" CUresult tessera_cuGraphAddMemAllocNode(CUgraphNode* node, CUgraph graph, const CUgraphNode* deps,
                                                   size_t ndeps, CUDA_MEM_ALLOC_NODE_PARAMS* params) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed) return CUDA_ERROR_NOT_PERMITTED;
  if (mode != Mode::kLimited || params == nullptr || params->poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return g_cu.real_cuGraphAddMemAllocNode(node, graph, deps, ndeps, params);
  }
  // Charged from the node's creation until the graph is destroyed or the memory freed outside it.
  return Charged(params->poolProps.location.id, params->bytesize, AllocKind::kGraph,
                 reinterpret_cast<uint64_t>(graph),
                 [&](uint64_t* key) {
                   const CUresult r = g_cu.real_cuGraphAddMemAllocNode(node, graph, deps, ndeps, params);
                   *key = params->dptr;
                   return r;
                 },
                 nullptr);
}

extern "C" CUresult tessera_cuGraphDestroy(CUgraph graph) {
  const CUresult r = g_cu.real_cuGraphDestroy != nullptr ? g_cu.real_cuGraphDestroy(graph) : CUDA_ERROR_NOT_INITIALIZED;
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseOwned(AllocKind::kGraph, reinterpret_cast<uint64_t>(graph));
  return r;
}
