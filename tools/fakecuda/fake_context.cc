// The fake CUDA driver: contexts (primary and created, the context stack, cuCtxSetLimit's growth), modules,
// libraries and green contexts, each taking device memory as the real ones do (the hook's footprint.cc
// charges them).
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mutex>
#include <unordered_map>
#include <vector>

#include "fake_cuda.h"
#include "hook/common/base.h"

using namespace fakecuda;  // NOLINT: the driver's internals (fake_cuda.h)

namespace fakecuda {

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
  Charge(g_visible[c->gpu], -static_cast<int64_t>(Shared()->context_bytes + c->stack_bytes + c->heap_bytes));
  if (t_ctx == c) t_ctx = nullptr;
  delete c;
}

}  // namespace fakecuda

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
  const CUresult r =
      Charge(g_visible[t_ctx->gpu], static_cast<int64_t>(bytes) - static_cast<int64_t>(*current));
  if (r == CUDA_SUCCESS) *current = bytes;
  return r;
}

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
namespace fakecuda {
void LoadLazily(CUfunction f) {
  Function* fn = reinterpret_cast<Function*>(f);
  if (fn == nullptr || fn->loaded || fn->module == nullptr) return;
  fn->loaded = true;
  const char* v = getenv("FAKECUDA_LAZY_BYTES");
  uint64_t bytes = 0;
  if (v == nullptr || !tessera::hook::ParseByteSize(v, &bytes) || bytes == 0) return;
  Module* m = static_cast<Module*>(fn->module);
  if (Charge(m->gpu, static_cast<int64_t>(bytes)) == CUDA_SUCCESS) m->bytes += bytes;
}
}  // namespace fakecuda

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
