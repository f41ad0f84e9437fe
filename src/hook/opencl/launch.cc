// Compute: command queues get profiling switched on, and every kernel launch (clEnqueueNDRangeKernel,
// clEnqueueTask) is paced against the container's device-time budget (docs/opencl.md, "Compute"). A launch
// is charged its estimated device time when it is enqueued; the limiter thread reads the launch's real device
// time from the runtime's own profiling timestamps (CL_PROFILING_COMMAND_START/END) when it completes and
// charges the difference, so the budget follows measured device time. A launch finds the budget empty only
// when the container is over its share; then it waits, and that is the throttling.
#include <string.h>

#include "hook/opencl/hook.h"

namespace tessera::opencl_hook {

namespace {

inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  return h;
}

uint64_t KernelKey(cl_kernel kernel, cl_uint dims, const size_t* global, const size_t* local) {
  uint64_t h = Mix(reinterpret_cast<uint64_t>(kernel), dims);
  for (cl_uint i = 0; i < dims && i < 3; ++i) {
    h = Mix(h, global != nullptr ? global[i] : 1);
    h = Mix(h, local != nullptr ? local[i] : 0);
  }
  return h == 0 ? 1 : h;
}

// The best (shortest) device time ever seen per kind of launch in this process: the kernel's time alone on
// the device. Direct-mapped; written by the limiter thread only.
struct Floor {
  std::atomic<uint64_t> key{0};
  std::atomic<int64_t> best_ns{0};
};
constexpr int kFloors = 1024;
Floor g_floors[kFloors];

int64_t UpdateFloor(uint64_t key, int64_t measured) {
  Floor& f = g_floors[(key ^ (key >> 29)) & (kFloors - 1)];
  if (f.key.load(std::memory_order_relaxed) != key || measured < f.best_ns.load(std::memory_order_relaxed)) {
    f.key.store(key, std::memory_order_relaxed);
    f.best_ns.store(measured, std::memory_order_relaxed);
  }
  return f.best_ns.load(std::memory_order_relaxed);
}

// `call(cl_event*)` enqueues the launch and returns its error code.
template <typename Call>
cl_int Paced(cl_command_queue queue, uint64_t key, cl_event* event, Call call) {
  Mode mode = CurrentMode();
  if (mode != Mode::kLimited) {
    if (mode == Mode::kUninitialized) mode = EnsureInit();
    if (mode == Mode::kFailClosed) return CL_OUT_OF_RESOURCES;
    if (mode != Mode::kLimited) return call(event);
  }
  bool profiling = false;
  HookDevice* d = QueueDevice(queue, &profiling);
  if (d == nullptr || d->shared == nullptr) return call(event);
  if (!d->has_limits) return CL_OUT_OF_RESOURCES;
  hook::BucketState* b = &d->shared->bucket;
  if (hook::TokenBucket::Unlimited(b)) return call(event);
  const hook::KernelCostTable::Lookup look = g_state.costs.Find(key);
  // On the thread's tab (settled with the bucket in batches; waits when the bucket is empty).
  if (!hook::TokenBucket::RunUp(hook::ThreadTab(), b, hook::TabEpoch(), look.estimate_ns))
    hook::TokenBucket::ChargeLaunch(b, look.estimate_ns);
  const bool measure = profiling && g_cl.clRetainEvent != nullptr && g_cl.clReleaseEvent != nullptr &&
                       g_state.samples.InFlight() < hook::SampleRing::kCapacity / 2;
  if (!measure) {
    const cl_int r = call(event);
    if (r != CL_SUCCESS) hook::TokenBucket::Take(b, -look.estimate_ns);
    return r;
  }
  cl_event ev = nullptr;
  const cl_int r = call(&ev);
  if (r != CL_SUCCESS || ev == nullptr) {
    if (r != CL_SUCCESS) hook::TokenBucket::Take(b, -look.estimate_ns);
    if (event != nullptr) *event = ev;
    return r;
  }
  // The application's event, when it asked for one, is the same event with one more reference (ours).
  if (event != nullptr) {
    *event = ev;
    g_cl.clRetainEvent(ev);
  }
  const hook::SampleRing::Sample s{key, reinterpret_cast<uint64_t>(ev), 0,
                                   static_cast<int>(d - g_state.devices), look.estimate_ns};
  if (!g_state.samples.Push(s)) g_cl.clReleaseEvent(ev);
  return r;
}

}  // namespace

bool DrainSample(const hook::SampleRing::Sample& s) {
  cl_event ev = reinterpret_cast<cl_event>(s.start_event);
  cl_int status = CL_COMPLETE;
  if (g_cl.clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(status), &status, nullptr) !=
      CL_SUCCESS) {
    status = -1;
  }
  if (status > CL_COMPLETE) return false;  // queued, submitted or running
  cl_ulong start = 0;
  cl_ulong end = 0;
  if (status == CL_COMPLETE &&
      g_cl.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof(start), &start, nullptr) ==
          CL_SUCCESS &&
      g_cl.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof(end), &end, nullptr) == CL_SUCCESS &&
      end >= start) {
    const int64_t ns = static_cast<int64_t>(end - start);
    g_state.costs.Record(s.key, ns);
    HookDevice* d = s.device >= 0 && s.device < hook::kMaxDevices ? &g_state.devices[s.device] : nullptr;
    if (d != nullptr && d->shared != nullptr) {
      // The launch was charged its estimate; charge what it really took instead.
      hook::TokenBucket::Take(&d->shared->bucket, ns - s.charged_ns);
      const int64_t floor = UpdateFloor(s.key, ns);
      d->measured_ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
      d->alone_ns.fetch_add(static_cast<uint64_t>(floor), std::memory_order_relaxed);
    }
  }
  g_cl.clReleaseEvent(ev);
  return true;
}

}  // namespace tessera::opencl_hook

using namespace tessera::opencl_hook;  // NOLINT: the exported C entry points below

namespace {

// Adds CL_QUEUE_PROFILING_ENABLE in limited mode (not to on-device queues, which cannot profile).
cl_command_queue_properties WithProfiling(cl_command_queue_properties props) {
  if (EnsureInit() != Mode::kLimited || (props & CL_QUEUE_ON_DEVICE) != 0) return props;
  return props | CL_QUEUE_PROFILING_ENABLE;
}

}  // namespace

extern "C" TS_EXPORT cl_command_queue CL_API_CALL clCreateCommandQueue(cl_context context,
                                                                       cl_device_id device,
                                                                       cl_command_queue_properties properties,
                                                                       cl_int* errcode_ret) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed || g_cl.clCreateCommandQueue == nullptr) {
    if (errcode_ret != nullptr)
      *errcode_ret = mode == Mode::kFailClosed ? CL_OUT_OF_RESOURCES : CL_INVALID_OPERATION;
    return nullptr;
  }
  const cl_command_queue_properties with = WithProfiling(properties);
  cl_command_queue q = g_cl.clCreateCommandQueue(context, device, with, errcode_ret);
  if (q == nullptr && with != properties)
    q = g_cl.clCreateCommandQueue(context, device, properties, errcode_ret);
  return q;
}

extern "C" TS_EXPORT cl_command_queue CL_API_CALL clCreateCommandQueueWithProperties(
    cl_context context, cl_device_id device, const cl_queue_properties* properties, cl_int* errcode_ret) {
  const Mode mode = EnsureInit();
  if (mode == Mode::kFailClosed || g_cl.clCreateCommandQueueWithProperties == nullptr) {
    if (errcode_ret != nullptr)
      *errcode_ret = mode == Mode::kFailClosed ? CL_OUT_OF_RESOURCES : CL_INVALID_OPERATION;
    return nullptr;
  }
  if (mode != Mode::kLimited)
    return g_cl.clCreateCommandQueueWithProperties(context, device, properties, errcode_ret);
  // Copy the (name, value, ..., 0) list, switching profiling on in CL_QUEUE_PROPERTIES.
  constexpr int kMax = 64;
  cl_queue_properties props[kMax + 3];
  int n = 0;
  bool found = false;
  bool changed = false;
  if (properties != nullptr) {
    while (properties[n] != 0 && n < kMax) {
      props[n] = properties[n];
      props[n + 1] = properties[n + 1];
      if (props[n] == CL_QUEUE_PROPERTIES) {
        found = true;
        const cl_queue_properties with = WithProfiling(props[n + 1]);
        changed = with != props[n + 1];
        props[n + 1] = with;
      }
      n += 2;
    }
    if (properties[n] != 0)
      return g_cl.clCreateCommandQueueWithProperties(context, device, properties, errcode_ret);
  }
  if (!found) {
    props[n++] = CL_QUEUE_PROPERTIES;
    props[n++] = CL_QUEUE_PROFILING_ENABLE;
    changed = true;
  }
  props[n] = 0;
  cl_command_queue q = g_cl.clCreateCommandQueueWithProperties(context, device, props, errcode_ret);
  if (q == nullptr && changed)
    q = g_cl.clCreateCommandQueueWithProperties(context, device, properties, errcode_ret);
  return q;
}

extern "C" TS_EXPORT cl_int CL_API_CALL clEnqueueNDRangeKernel(
    cl_command_queue queue, cl_kernel kernel, cl_uint work_dim, const size_t* global_work_offset,
    const size_t* global_work_size, const size_t* local_work_size, cl_uint num_events_in_wait_list,
    const cl_event* event_wait_list, cl_event* event) {
  if (g_cl.clEnqueueNDRangeKernel == nullptr && (EnsureInit(), g_cl.clEnqueueNDRangeKernel == nullptr)) {
    return CL_INVALID_OPERATION;
  }
  return Paced(
      queue, KernelKey(kernel, work_dim, global_work_size, local_work_size), event, [&](cl_event* ev) {
        return g_cl.clEnqueueNDRangeKernel(queue, kernel, work_dim, global_work_offset, global_work_size,
                                           local_work_size, num_events_in_wait_list, event_wait_list, ev);
      });
}

extern "C" TS_EXPORT cl_int CL_API_CALL clEnqueueTask(cl_command_queue queue, cl_kernel kernel,
                                                      cl_uint num_events_in_wait_list,
                                                      const cl_event* event_wait_list, cl_event* event) {
  if (g_cl.clEnqueueTask == nullptr && (EnsureInit(), g_cl.clEnqueueTask == nullptr))
    return CL_INVALID_OPERATION;
  return Paced(queue, KernelKey(kernel, 0, nullptr, nullptr), event, [&](cl_event* ev) {
    return g_cl.clEnqueueTask(queue, kernel, num_events_in_wait_list, event_wait_list, ev);
  });
}
