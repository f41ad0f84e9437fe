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
  if (TakeAlloc(AllocKind::kLinear, dptr, &rec)) {
    Uncharge(rec.ordinal, rec.bytes);
    return;
  }
  ReturnToPool(dptr);  // cuMemFree of stream-ordered memory: back to its pool, which keeps it
}

uint64_t RoundUp(uint64_t v, uint64_t to) {
  return (v + to - 1) / to * to;
}

// The block-compressed and packed formats cuda.h adds beyond ArrayFormatBytes's: at most 4 bytes per element
// per channel.
uint64_t FormatBytes(CUarray_format f) {
  const unsigned bytes = ArrayFormatBytes(f);
  return bytes != 0 ? bytes : 4;
}

uint64_t NextPow2(uint64_t v) {
  uint64_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// An upper bound of what the driver takes for one level of an array, w x h x d elements of `element` bytes.
// cuda.h fixes the elements (format size x channels, CUDA_ARRAY_DESCRIPTOR) but not the layout; NVIDIA GPUs
// store arrays block-linear (as NVIDIA's open GPU documentation and Tegra manuals describe it): rows of
// 64-byte GOBs 8 rows high, stacked in blocks of 1-16 GOBs high and 1-32 slices deep, the driver choosing the
// block so that it does not exceed the extent rounded up to a power of two. So a level is at most its row
// rounded up to 64 bytes, times its height rounded up to 8 x min(16, next power of two of its GOB rows),
// times its depth (a 3D array's; not layers) rounded up to min(32, its next power of two); each level is then
// rounded up to a 64 KiB page, so the levels' placement in the array cannot add to it. What a driver takes
// beyond this bound shows in NVML's figure for the process, which the footprint true-up charges
// (footprint.cc).
uint64_t ArrayLevelBound(uint64_t w, uint64_t h, uint64_t d, bool tiled_depth, uint64_t element) {
  const uint64_t row = RoundUp(w * element, 64);
  const uint64_t gobs = (h + 7) / 8;
  const uint64_t rows = RoundUp(h, 8 * (gobs >= 16 ? 16 : NextPow2(gobs)));
  const uint64_t slices = tiled_depth ? RoundUp(d, d >= 32 ? 32 : NextPow2(d)) : d;
  return RoundUp(row * rows * slices, 65536);
}

uint64_t ArrayBytes(uint64_t w, uint64_t h, uint64_t d, CUarray_format format, unsigned channels) {
  return ArrayLevelBound(w == 0 ? 1 : w, h == 0 ? 1 : h, d == 0 ? 1 : d, /*tiled_depth=*/true,
                         FormatBytes(format) * (channels == 0 ? 1 : channels));
}

// A 3D, layered or cubemap array with `levels` mipmap levels (1: a plain array): the sum of its levels'
// bounds, level i being level 0 halved i times (at least 1) in each dimension but the layers (the CUDA
// programming guide's mipmaps). Levels beyond 1 + log2 of the largest extent are charged as 1x1 levels (the
// driver clamps them: charging them errs on the side of more).
uint64_t Array3DBytes(const CUDA_ARRAY3D_DESCRIPTOR& a, unsigned levels = 1) {
  const bool layered = (a.Flags & (CUDA_ARRAY3D_LAYERED | CUDA_ARRAY3D_CUBEMAP)) != 0;
  uint64_t depth = a.Depth == 0 ? 1 : a.Depth;
  if ((a.Flags & CUDA_ARRAY3D_CUBEMAP) != 0 && a.Depth == 0) depth = 6;
  uint64_t w = a.Width == 0 ? 1 : a.Width;
  uint64_t h = a.Height == 0 ? 1 : a.Height;
  const uint64_t element = FormatBytes(a.Format) * (a.NumChannels == 0 ? 1 : a.NumChannels);
  uint64_t bytes = 0;
  for (unsigned i = 0; i < (levels == 0 ? 1 : levels); ++i) {
    bytes += ArrayLevelBound(w, h, depth, !layered, element);
    w = w > 1 ? w / 2 : 1;
    h = h > 1 ? h / 2 : 1;
    if (!layered) depth = depth > 1 ? depth / 2 : 1;
  }
  return bytes;
}

void ReleaseContextMemory(uint64_t ctx) {
  ReleaseOwned(AllocKind::kLinear, ctx);
  ReleaseOwned(AllocKind::kArray, ctx);
  ReleaseOwned(AllocKind::kMipmapped, ctx);
}

// A new context's footprint (docs/isolation.md, "What is charged"). Without NVML's figure for this process:
// reserve the estimate before the driver is asked; `*estimate` is then what the context's record must give
// back. With it: the size of a context measured before in the container is reserved in the footprint (none
// yet: nothing), the context is created, then its exact footprint is charged, and when that does not fit the
// context is destroyed again (reserve-then-commit against the container's total: two processes never both
// pass).
template <typename Create, typename Undo>
CUresult CreateCharged(int ordinal, Create create, Undo undo, uint64_t* estimate) {
  *estimate = 0;
  HookDevice* d = DeviceAt(ordinal);
  if (d != nullptr && !d->has_limits) return RefusalFor(ordinal);
  uint64_t probe = 0;
  const bool measurable = !g_state.context_bytes_set &&
                          ProcessUsedBytes(ordinal, &probe) != ProcessUse::kUnavailable;
  uint64_t reserved = 0;
  // Measurable, and a context's size already measured in the container: reserved in the footprint first.
  const uint64_t learned =
      measurable && d != nullptr && d->shared != nullptr ? d->shared->context_bytes.load(std::memory_order_relaxed) : 0;
  if (!measurable) {
    reserved = EstimatedContextBytes(ordinal);
    const CUresult c = ChargeBefore(ordinal, reserved);
    if (c != CUDA_SUCCESS) return c;
  } else if (learned != 0) {
    const CUresult c = ReserveFootprint(ordinal, learned);
    if (c != CUDA_SUCCESS) return c;
  }
  const CUresult r = create();
  if (r != CUDA_SUCCESS) {
    Uncharge(ordinal, reserved);
    DropFootprint(ordinal, learned, /*uncharge=*/true);
    return r;
  }
  if (measurable) {
    bool known = false;
    const CUresult c = TrueUpFootprint(ordinal, TrueUp::kMustFit, &known);
    if (c != CUDA_SUCCESS) {
      undo();
      TrueUpFootprint(ordinal, TrueUp::kExact);
      return c;
    }
    if (known && learned != 0) {
      TrueUpFootprint(ordinal, TrueUp::kExact);  // this context is smaller than the one measured before
    } else if (!known && learned != 0) {
      // NVML does not list this process after all: the reservation stays, as the context's estimate.
      DropFootprint(ordinal, learned, /*uncharge=*/false);
      *estimate = learned;
      return CUDA_SUCCESS;
    }
    if (!known) {
      // NVML does not list this process (another pid namespace, and no agent to say the host pid).
      reserved = EstimatedContextBytes(ordinal);
      const CUresult e = ChargeBefore(ordinal, reserved);
      if (e != CUDA_SUCCESS) {
        undo();
        return e;
      }
    }
  }
  *estimate = reserved;
  return CUDA_SUCCESS;
}

void RecordContext(uint64_t key, uint64_t ctx, int ordinal, uint64_t estimate) {
  AllocRecord rec;
  rec.bytes = estimate;
  rec.ordinal = ordinal;
  rec.owner = ctx;
  RecordAlloc(AllocKind::kContext, key, rec);
}

template <typename Create>
CUresult CreateContext(CUcontext* pctx, CUdevice dev, Create create) {
  if (!Limited()) return create();
  uint64_t estimate = 0;
  const CUresult r = CreateCharged(
      static_cast<int>(dev),
      [&] {
        const CUresult made = create();
        return made == CUDA_SUCCESS && pctx == nullptr ? CUDA_ERROR_INVALID_VALUE : made;
      },
      [&] { g_cu.real_cuCtxDestroy_v2(*pctx); }, &estimate);
  if (r == CUDA_SUCCESS) {
    const uint64_t ctx = reinterpret_cast<uint64_t>(*pctx);
    RecordContext(ctx, ctx, static_cast<int>(dev), estimate);
  }
  return r;
}

template <typename Destroy>
CUresult DestroyContext(CUcontext ctx, Destroy destroy) {
  int ordinal = -1;
  CUdevice dev = -1;
  if (Limited() && g_cu.real_cuCtxPushCurrent_v2 != nullptr && g_cu.real_cuCtxPopCurrent_v2 != nullptr &&
      g_cu.real_cuCtxPushCurrent_v2(ctx) == CUDA_SUCCESS) {
    if (g_cu.real_cuCtxGetDevice(&dev) == CUDA_SUCCESS) ordinal = static_cast<int>(dev);
    CUcontext popped = nullptr;
    g_cu.real_cuCtxPopCurrent_v2(&popped);
  }
  const CUresult r = destroy();
  if (r != CUDA_SUCCESS || !Limited()) return r;
  AllocRecord rec;
  const uint64_t key = reinterpret_cast<uint64_t>(ctx);
  if (TakeAlloc(AllocKind::kContext, key, &rec)) Uncharge(rec.ordinal, rec.bytes);
  ReleaseContextMemory(key);
  if (ordinal >= 0) TrueUpFootprint(ordinal, TrueUp::kExact);
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
    TrueUpFootprint(static_cast<int>(dev), TrueUp::kExact);
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
  const uint64_t limit = g_state.session.region.Limit(d->region_index);
  if (limit == 0) return r;
  const uint64_t total = limit < real_total ? limit : real_total;
  const uint64_t used = g_state.session.region.Used(d->region_index);
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
  const uint64_t limit = g_state.session.region.Limit(d->region_index);
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
  if (d == nullptr || d->primary_refs > 0) {
    const CUresult r = g_cu.real_cuDevicePrimaryCtxRetain(pctx, dev);
    if (r == CUDA_SUCCESS && d != nullptr) ++d->primary_refs;
    return r;
  }
  // The first retain creates the primary context: charged as any context, recorded by device (the primary
  // context is released by device, not by handle).
  const uint64_t key = 0x7000000000000000ull | static_cast<uint64_t>(dev);
  uint64_t estimate = 0;
  const CUresult r = CreateCharged(
      static_cast<int>(dev), [&] { return g_cu.real_cuDevicePrimaryCtxRetain(pctx, dev); },
      [&] { g_cu.real_cuDevicePrimaryCtxRelease_v2(dev); }, &estimate);
  if (r == CUDA_SUCCESS) {
    RecordContext(key, reinterpret_cast<uint64_t>(*pctx), static_cast<int>(dev), estimate);
    ++d->primary_refs;
  }
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

// cuMemFree synchronizes (pools give back what they keep above their thresholds): a release.
extern "C" CUresult tessera_cuMemFree_v2(CUdeviceptr dptr) {
  const CUresult r = Releasing(
      [&] { return g_cu.real_cuMemFree_v2 != nullptr ? g_cu.real_cuMemFree_v2(dptr) : CUDA_ERROR_NOT_INITIALIZED; });
  if (r == CUDA_SUCCESS && CurrentMode() == Mode::kLimited) ReleaseLinear(dptr);
  return r;
}

extern "C" CUresult tessera_cuMemFree(CUdeviceptr_v1 dptr) {
  const CUresult r = Releasing(
      [&] { return g_cu.real_cuMemFree != nullptr ? g_cu.real_cuMemFree(dptr) : CUDA_ERROR_NOT_INITIALIZED; });
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
  const uint64_t bytes = Array3DBytes(*desc, levels);
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

