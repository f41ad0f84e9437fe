// libtessera-opencl.so: what it adds to its session (hook/common/session.h: start, fork, charging, the
// limiter loop): the real entry points (from the ICD loader), device enumeration, the limiter thread's OpenCL
// steps and clGetExtensionFunctionAddress(ForPlatform). docs/opencl.md explains it.
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hook/opencl/hook.h"

#ifndef TESSERA_VERSION
#define TESSERA_VERSION "0.0.0"
#endif

namespace tessera::opencl_hook {

RealCl g_cl;
HookState g_state;

namespace {

using hook::Error;
using hook::LogLevel;
using hook::LogLine;

void* g_libopencl = nullptr;

// The hooked names and our wrappers, for clGetExtensionFunctionAddress(ForPlatform).
struct HookEntry {
  const char* symbol;
  void* hook;
};
#define TS_CL_HOOK(sym, version) {#sym, reinterpret_cast<void*>(&::sym)},
const HookEntry kClHooks[] = {
#include "hook/opencl/opencl_hooks.def"
};
#undef TS_CL_HOOK

// Library::load_runtime: the ICD loader's entry points, under the session's init lock.
void LoadRealOpenCl() {
  if (g_libopencl != nullptr) return;
  const char* path = getenv("TESSERA_REAL_LIBOPENCL");
  void* h = dlopen(path != nullptr && path[0] != 0 ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    LogLine(LogLevel::kDebug, "no libOpenCL.so.1 (%s); OpenCL calls fail as without a runtime", dlerror());
    return;
  }
#define TS_CL_HOOK(sym, version) g_cl.sym = reinterpret_cast<decltype(g_cl.sym)>(dlsym(h, #sym));
#include "hook/opencl/opencl_hooks.def"
#undef TS_CL_HOOK
#define TS_CL_REAL(sym) g_cl.sym = reinterpret_cast<decltype(g_cl.sym)>(dlsym(h, #sym));
#include "hook/opencl/opencl_real.def"
#undef TS_CL_REAL
  g_libopencl = h;
}

bool HasExtension(cl_device_id id, const char* name) {
  char ext[4096];
  size_t len = 0;
  if (g_cl.clGetDeviceInfo(id, CL_DEVICE_EXTENSIONS, sizeof(ext) - 1, ext, &len) != CL_SUCCESS) return false;
  ext[len < sizeof(ext) ? len : sizeof(ext) - 1] = 0;
  const size_t n = strlen(name);
  for (const char* p = strstr(ext, name); p != nullptr; p = strstr(p + 1, name)) {
    if ((p == ext || p[-1] == ' ') && (p[n] == 0 || p[n] == ' ')) return true;
  }
  return false;
}

// Applies the session's limits to the devices and to the shared region. Under the session's devices_mutex().
void ApplyLimitsLocked() {
  const uint64_t now = hook::MonotonicNs();
  const int n = g_state.device_count.load();
  for (int i = 0; i < n; ++i) {
    HookDevice& d = g_state.devices[i];
    const hook::DeviceLimits* l = hook::FindDeviceLimits(g_state.session.limits, d.named ? d.uuid : nullptr, i);
    if (!d.named && l != nullptr && l->uuid[0] != 0) l = nullptr;  // another device's line (NameAndAttachLocked)
    if (l == nullptr) {
      d.has_limits = false;
      continue;
    }
    d.limits = *l;
    if (d.region_index >= 0) g_state.session.region.SetDeviceLimits(d.region_index, *l, now);
    d.has_limits = true;
  }
}

// Device `i` of `count` enumerated: names a device that has no UUID, and gives it its region entry. A device
// without a UUID whose place in the list has a limits line naming a UUID no enumerated device carries is that
// GPU (a vendor's GPU without cl_khr_device_uuid: the agent's line for it names the node's UUID and its place
// in the container's list): it takes the UUID, so its quota in the region is the one the agent keeps.
// Otherwise it is "opencl-<i>". Under the session's init lock.
void NameAndAttachLocked(int i, int count) {
  HookDevice& d = g_state.devices[i];
  const hook::DeviceLimits* l = hook::FindDeviceLimits(g_state.session.limits, d.named ? d.uuid : nullptr, i);
  if (!d.named) {
    bool carried = false;
    for (int j = 0; j < count && l != nullptr && l->uuid[0] != 0; ++j) {
      carried = carried || (g_state.devices[j].named && strcmp(g_state.devices[j].uuid, l->uuid) == 0);
    }
    if (l != nullptr && l->uuid[0] != 0 && !carried) {
      hook::CopyString(d.uuid, sizeof(d.uuid), l->uuid);
      d.named = true;
    } else {
      if (l != nullptr && l->uuid[0] != 0) l = nullptr;  // that line is another device's
      snprintf(d.uuid, sizeof(d.uuid), "opencl-%d", i);
    }
  }
  cl_device_type type = 0;
  g_cl.clGetDeviceInfo(d.id, CL_DEVICE_TYPE, sizeof(type), &type, nullptr);
  if (l == nullptr && g_state.session.limits_from_file && (type & CL_DEVICE_TYPE_CPU) != 0) {
    // A CPU device the limits file does not name is not a GPU of this container: left untouched.
    LogLine(LogLevel::kDebug, "OpenCL device %d is a CPU not in the limits file: not accounted", i);
    return;
  }
  Error error;
  d.region_index = g_state.session.region.FindOrAddDevice(d.uuid, &error);
  if (d.region_index < 0) {
    hook::WriteStderrLine("%s", error.text);
  } else {
    d.shared = g_state.session.region.device(d.region_index);
  }
  if (l == nullptr) {
    hook::WriteStderrLine("OpenCL device %d (%s) is not in the limits file %s: its use is refused", i, d.uuid,
                          g_state.session.limits_path);
  }
}

// Library::start_limited: enumerates every device of every platform; gives each its region entry. Under the
// session's init lock.
void SetUpDevicesLocked() {
  if (g_cl.clGetPlatformIDs == nullptr || g_cl.clGetDeviceIDs == nullptr || g_cl.clGetDeviceInfo == nullptr)
    return;
  cl_platform_id platforms[16];
  cl_uint np = 0;
  if (g_cl.clGetPlatformIDs(16, platforms, &np) != CL_SUCCESS) return;
  int count = 0;
  for (cl_uint p = 0; p < np && p < 16; ++p) {
    cl_device_id ids[hook::kMaxDevices];
    cl_uint nd = 0;
    if (g_cl.clGetDeviceIDs(platforms[p], CL_DEVICE_TYPE_ALL, hook::kMaxDevices, ids, &nd) != CL_SUCCESS)
      continue;
    for (cl_uint k = 0; k < nd && k < static_cast<cl_uint>(hook::kMaxDevices); ++k) {
      if (count == hook::kMaxDevices) {
        hook::WriteStderrLine("more than %d OpenCL devices; the others are not accounted", hook::kMaxDevices);
        break;
      }
      HookDevice& d = g_state.devices[count];
      d.id = ids[k];
      unsigned char uuid[CL_UUID_SIZE_KHR];
      if (HasExtension(d.id, "cl_khr_device_uuid") &&
          g_cl.clGetDeviceInfo(d.id, CL_DEVICE_UUID_KHR, sizeof(uuid), uuid, nullptr) == CL_SUCCESS) {
        hook::FormatGpuUuid(uuid, d.uuid, sizeof(d.uuid));
        d.named = true;
      }
      ++count;
    }
  }
  for (int i = 0; i < count; ++i) NameAndAttachLocked(i, count);
  pthread_mutex_lock(g_state.session.devices_mutex());
  g_state.device_count.store(count, std::memory_order_release);
  ApplyLimitsLocked();
  pthread_mutex_unlock(g_state.session.devices_mutex());
}

// Library::forget_in_child: OpenCL objects do not survive fork().
void ForgetInChild() {
  ResetMemTableInChild();
}

TESSERA_HOOK_SESSION_LIFETIME(g_state.session)

}  // namespace

HookDevice* FindDevice(cl_device_id id) {
  if (id == nullptr) return nullptr;
  for (int depth = 0; depth < 8; ++depth) {
    const int n = g_state.device_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i) {
      if (g_state.devices[i].id == id) return &g_state.devices[i];
    }
    // A sub-device (clCreateSubDevices) shares its root device's memory and time.
    cl_device_id parent = nullptr;
    if (g_cl.clGetDeviceInfo(id, CL_DEVICE_PARENT_DEVICE, sizeof(parent), &parent, nullptr) != CL_SUCCESS ||
        parent == nullptr) {
      return nullptr;
    }
    id = parent;
  }
  return nullptr;
}

HookDevice* ContextDevice(cl_context context) {
  if (context == nullptr || g_cl.clGetContextInfo == nullptr) return nullptr;
  cl_device_id ids[64];
  size_t len = 0;
  if (g_cl.clGetContextInfo(context, CL_CONTEXT_DEVICES, sizeof(ids), ids, &len) != CL_SUCCESS ||
      len < sizeof(cl_device_id)) {
    return nullptr;
  }
  return FindDevice(ids[0]);
}

HookDevice* QueueDevice(cl_command_queue queue, bool* profiling) {
  *profiling = false;
  if (queue == nullptr || g_cl.clGetCommandQueueInfo == nullptr) return nullptr;
  cl_device_id id = nullptr;
  if (g_cl.clGetCommandQueueInfo(queue, CL_QUEUE_DEVICE, sizeof(id), &id, nullptr) != CL_SUCCESS)
    return nullptr;
  cl_command_queue_properties props = 0;
  if (g_cl.clGetCommandQueueInfo(queue, CL_QUEUE_PROPERTIES, sizeof(props), &props, nullptr) == CL_SUCCESS) {
    *profiling = (props & CL_QUEUE_PROFILING_ENABLE) != 0;
  }
  return FindDevice(id);
}

cl_int ChargeBefore(HookDevice* d, uint64_t bytes) {
  if (d == nullptr || d->region_index < 0) return CL_SUCCESS;  // not accounted
  if (!d->has_limits) return CL_MEM_OBJECT_ALLOCATION_FAILURE;
  if (!g_state.session.EnsureAttached()) return CL_MEM_OBJECT_ALLOCATION_FAILURE;
  return g_state.session.Charge(d->region_index, bytes, d->uuid) == hook::ChargeResult::kOk
             ? CL_SUCCESS
             : CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

void Uncharge(HookDevice* d, uint64_t bytes) {
  if (d == nullptr || d->region_index < 0 || bytes == 0) return;
  g_state.session.Uncharge(d->region_index, bytes, d->uuid);
}

// ---------------------------------------------------------------------------------------------------------
// The limiter thread: refills budgets, measures completed launches from their profiling timestamps, runs the
// elastic controller, picks up new limits, reclaims dead processes' charges.

namespace {

// The device's use over the last step as the elastic controller needs it, without NVML: this container's
// device time plus what the device spent on others while our kernels ran (a kernel that took longer than its
// best time was sharing the device). -1 when nothing ran (unknown).
int32_t DeviceUtilization(HookDevice& d, uint64_t* last_measured, uint64_t* last_alone, uint64_t interval) {
  const uint64_t measured = d.measured_ns.load(std::memory_order_relaxed);
  const uint64_t alone = d.alone_ns.load(std::memory_order_relaxed);
  const uint64_t dm = measured - *last_measured;
  const uint64_t da = alone - *last_alone;
  *last_measured = measured;
  *last_alone = alone;
  if (interval == 0) return -1;
  // Kernels within 25% of their best time ran alone (run-to-run noise); beyond that the excess was others'.
  const uint64_t others = dm * 4 > da * 5 ? dm - da : 0;
  const uint64_t busy = dm + others;
  const uint64_t ppm = static_cast<uint64_t>(static_cast<hook::Uint128>(busy) * hook::kPpm / interval);
  return static_cast<int32_t>(ppm > hook::kPpm ? hook::kPpm : ppm);
}

uint64_t g_last_measured[hook::kMaxDevices] = {0};
uint64_t g_last_alone[hook::kMaxDevices] = {0};
uint64_t g_last_step[hook::kMaxDevices] = {0};

// Every millisecond: read the measured launches, refill the budgets, step the elastic controllers.
bool EveryMs(uint64_t now) {
  g_state.samples.Drain(&DrainSample);
  bool busy = g_state.samples.InFlight() > 0;
  const int n = g_state.device_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    HookDevice& d = g_state.devices[i];
    if (d.shared != nullptr && hook::RefillDevice(d.shared, now, &busy)) {
      const int32_t util = DeviceUtilization(d, &g_last_measured[i], &g_last_alone[i],
                                             g_last_step[i] == 0 ? 0 : now - g_last_step[i]);
      g_last_step[i] = now;
      // Alone on the device by the agent's count: nobody else can want its idle time. The slowdown measure
      // above cannot tell a kernel slowed by another tenant from one given more work through its arguments
      // (a kind is a kernel and its work sizes), nor from the program's own threads on a CPU device.
      const bool elastic = d.limits.policy == hook::ComputePolicy::kElastic;
      hook::ElasticController::Step(&d.shared->controller, &d.shared->bucket, now, elastic ? util : -1,
                                    elastic && d.limits.tenants == 1);
    }
  }
  return busy;
}

}  // namespace

const hook::Library kOpenClLibrary = {
    .name = "opencl",
    .version = TESSERA_VERSION,
    .refused = "OpenCL device use refused",
    .load_runtime = &LoadRealOpenCl,
    .start_limited = &SetUpDevicesLocked,
    .forget_in_child = &ForgetInChild,
    .in_limiter_thread = nullptr,
    .each_ms = &EveryMs,
    .limits_changed = &ApplyLimitsLocked,
    .each_quarter = nullptr,
    .retry_limiter_start = false,  // EnsureInit would try at every call
};

}  // namespace tessera::opencl_hook

using namespace tessera::opencl_hook;  // NOLINT: the exported C entry points below

namespace {

// Our wrapper for a name the runtime resolved, so that a program that fetches an entry point by name (some
// loaders answer for core functions too) still goes through the hook.
void* WrapperFor(const char* name, void* real) {
  if (real == nullptr || name == nullptr) return real;
  for (const HookEntry& e : kClHooks) {
    if (strcmp(e.symbol, name) == 0) return e.hook;
  }
  return real;
}

}  // namespace

extern "C" TS_EXPORT void* CL_API_CALL clGetExtensionFunctionAddress(const char* name) {
  EnsureInit();
  if (g_cl.clGetExtensionFunctionAddress == nullptr) return nullptr;
  return WrapperFor(name, g_cl.clGetExtensionFunctionAddress(name));
}

extern "C" TS_EXPORT void* CL_API_CALL clGetExtensionFunctionAddressForPlatform(cl_platform_id platform,
                                                                                const char* name) {
  EnsureInit();
  if (g_cl.clGetExtensionFunctionAddressForPlatform == nullptr) return nullptr;
  return WrapperFor(name, g_cl.clGetExtensionFunctionAddressForPlatform(platform, name));
}
