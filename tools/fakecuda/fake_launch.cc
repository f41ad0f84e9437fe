// The fake CUDA driver: the simulated GPU timeline (a kernel occupies its GPU for as many nanoseconds as its
// first parameter says), streams (the legacy and per-thread default streams), events and kernel launches.
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

void SleepUntil(uint64_t t) {
  for (;;) {
    const uint64_t now = NowNs();
    if (now >= t) return;
    const uint64_t d = t - now;
    timespec ts{static_cast<time_t>(d / 1000000000ull), static_cast<long>(d % 1000000000ull)};
    nanosleep(&ts, nullptr);
  }
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

}  // namespace fakecuda

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
            : st->capture_state.invalidated         ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
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
