// The fake CUDA driver: graphs (a graph runs its kernels back to back; memory nodes map memory from the graph
// pool, fake_pools.cc) and stream capture, with the capture rules of cuda.h.
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

}  // namespace fakecuda

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
FAKE_EXPORT CUresult cuGraphAddMemFreeNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                           CUdeviceptr ptr) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return AddFreeNode(n, g, ptr);
}
// The generic form (CUDA 12.2/12.3): memory nodes as above; other node types add nothing to run here.
FAKE_EXPORT CUresult cuGraphAddNode(CUgraphNode* n, CUgraph g, const CUgraphNode*, size_t,
                                    CUgraphNodeParams* p) {
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
FAKE_EXPORT CUresult cuGraphAddNode_v2(CUgraphNode* n, CUgraph g, const CUgraphNode* d,
                                       const CUgraphEdgeData*, size_t nd, CUgraphNodeParams* p) {
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
  if (node == nullptr || p == nullptr || node->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
    return CUDA_ERROR_INVALID_VALUE;
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
FAKE_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec* e, CUgraph g,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS*) {
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
// --- Stream capture: launches on a capturing stream become the captured graph's kernels
// ------------------------------

namespace fakecuda {
CUresult Capture(Stream* st, uint64_t ns) {
  st->capture->duration_ns += ns;
  return CUDA_SUCCESS;
}
}  // namespace fakecuda

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
FAKE_EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream s, CUgraph g, const CUgraphNode*,
                                                 const CUgraphEdgeData*, size_t, CUstreamCaptureMode mode) {
  if (g == nullptr) return CUDA_ERROR_INVALID_VALUE;
  return BeginCapture(s, reinterpret_cast<Graph*>(g), mode);
}
FAKE_EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph g, const CUgraphNode* d,
                                                      const CUgraphEdgeData* e, size_t n,
                                                      CUstreamCaptureMode mode) {
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
