// libtessera-opencl.so: initialization, the real entry points (from the ICD loader), device enumeration, the
// limiter thread, fork handling and clGetExtensionFunctionAddress(ForPlatform). docs/opencl.md explains it.
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
pthread_mutex_t g_init_mutex = PTHREAD_MUTEX_INITIALIZER;
pthread_mutex_t g_devices_mutex = PTHREAD_MUTEX_INITIALIZER;
__thread int t_in_init __attribute__((tls_model("initial-exec"))) = 0;
std::atomic<bool> g_thread_started{false};

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

bool LoadRealOpenCl() {
  if (g_libopencl != nullptr) return true;
  const char* path = getenv("TESSERA_REAL_LIBOPENCL");
  void* h = dlopen(path != nullptr && path[0] != 0 ? path : "libOpenCL.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) return false;
#define TS_CL_HOOK(sym, version) g_cl.sym = reinterpret_cast<decltype(g_cl.sym)>(dlsym(h, #sym));
#include "hook/opencl/opencl_hooks.def"
#undef TS_CL_HOOK
#define TS_CL_REAL(sym) g_cl.sym = reinterpret_cast<decltype(g_cl.sym)>(dlsym(h, #sym));
#include "hook/opencl/opencl_real.def"
#undef TS_CL_REAL
  g_libopencl = h;
  return true;
}

const char* EnvLookup(const char* name) {
  return getenv(name);
}

void FormatUuid(const unsigned char* b, char* out, size_t cap) {
  snprintf(out, cap, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
           b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
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

// Applies the session's limits to the devices and to the shared region. Under g_devices_mutex.
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
// in the container's list): it takes the UUID, so its quota in the region is the one the agent keeps. Otherwise
// it is "opencl-<i>". Under g_init_mutex.
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

// Enumerates every device of every platform; gives each its region entry. Under g_init_mutex.
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
        FormatUuid(uuid, d.uuid, sizeof(d.uuid));
        d.named = true;
      }
      ++count;
    }
  }
  for (int i = 0; i < count; ++i) NameAndAttachLocked(i, count);
  pthread_mutex_lock(&g_devices_mutex);
  g_state.device_count.store(count, std::memory_order_release);
  ApplyLimitsLocked();
  pthread_mutex_unlock(&g_devices_mutex);
}

Mode InitLocked() {
  hook::SetLogLevelFromEnvironment();
  if (!LoadRealOpenCl()) {
    LogLine(LogLevel::kDebug, "no libOpenCL.so.1 (%s); OpenCL calls fail as without a runtime", dlerror());
  }
  Error error;
  const hook::SessionMode m =
      hook::StartSession("opencl", TESSERA_VERSION, &EnvLookup, &g_state.session, &error);
  if (m == hook::SessionMode::kFailClosed) {
    hook::WriteStderrLine("OpenCL device use refused: %s", error.text);
    return Mode::kFailClosed;
  }
  if (m == hook::SessionMode::kPassThrough) {
    LogLine(LogLevel::kDebug, "no limits configured; passing through");
    return Mode::kPassThrough;
  }
  SetUpDevicesLocked();
  return Mode::kLimited;
}

void AtForkPrepare() {
  pthread_mutex_lock(&g_init_mutex);
}
void AtForkParent() {
  pthread_mutex_unlock(&g_init_mutex);
}
void AtForkChild() {
  pthread_mutex_init(&g_init_mutex, nullptr);
  pthread_mutex_init(&g_devices_mutex, nullptr);
  // The limiter thread and the parent's slot stay with the parent; OpenCL objects do not survive fork().
  g_thread_started.store(false);
  hook::SessionForgetInChild(&g_state.session);
  g_state.need_attach.store(true);
  ResetMemTableInChild();
  hook::ForgetThreadTabInChild();
}

__attribute__((constructor)) void OnLoad() {
  // Nothing heavy here: the library may be preloaded into every process of a container.
  pthread_atfork(&AtForkPrepare, &AtForkParent, &AtForkChild);
}

__attribute__((destructor)) void OnUnload() {
  if (CurrentMode() == Mode::kLimited && !g_state.need_attach.load()) {
    hook::TokenBucket::Settle(hook::ThreadTab());  // what the exiting thread launched and still owes
    g_state.session.region.Detach();
  }
}

bool EnsureAttached() {
  if (!g_state.need_attach.load(std::memory_order_acquire)) return true;
  pthread_mutex_lock(&g_init_mutex);
  bool ok = true;
  if (g_state.need_attach.load()) {
    Error error;
    ok = g_state.session.region.Attach(&error);
    if (!ok) {
      hook::WriteStderrLine("%s", error.text);
    } else {
      g_state.need_attach.store(false);
      hook::SessionForkedChildAttached(&g_state.session, false);
    }
  }
  pthread_mutex_unlock(&g_init_mutex);
  return ok;
}

}  // namespace

Mode EnsureInit() {
  const Mode m = CurrentMode();
  if (m != Mode::kUninitialized) {
    if (m == Mode::kLimited && !g_thread_started.load(std::memory_order_relaxed)) StartLimiterThread();
    return m;
  }
  if (t_in_init != 0) return Mode::kPassThrough;  // a call made by the initialization itself
  pthread_mutex_lock(&g_init_mutex);
  Mode result = CurrentMode();
  if (result == Mode::kUninitialized) {
    t_in_init = 1;
    result = InitLocked();
    t_in_init = 0;
    g_state.mode.store(static_cast<int>(result), std::memory_order_release);
  }
  pthread_mutex_unlock(&g_init_mutex);
  if (result == Mode::kLimited) StartLimiterThread();
  return result;
}

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
  if (!EnsureAttached()) return CL_MEM_OBJECT_ALLOCATION_FAILURE;
  hook::SharedRegion& region = g_state.session.region;
  if (region.TryCharge(d->region_index, bytes) == hook::ChargeResult::kOk) return CL_SUCCESS;
  // Before saying no: processes of this container that died may still hold charges.
  if (region.ReclaimDeadSlots() > 0 && region.TryCharge(d->region_index, bytes) == hook::ChargeResult::kOk) {
    return CL_SUCCESS;
  }
  d->shared->oom_count.fetch_add(1, std::memory_order_relaxed);
  LogLine(LogLevel::kInfo, "refused %llu bytes on %s: %llu of %llu in use by the container",
          static_cast<unsigned long long>(bytes), d->uuid,
          static_cast<unsigned long long>(region.Used(d->region_index)),
          static_cast<unsigned long long>(region.Limit(d->region_index)));
  return CL_MEM_OBJECT_ALLOCATION_FAILURE;
}

void Uncharge(HookDevice* d, uint64_t bytes) {
  if (d == nullptr || d->region_index < 0 || bytes == 0) return;
  if (g_state.need_attach.load(std::memory_order_relaxed)) return;  // a forked child holds nothing
  g_state.session.region.Uncharge(d->region_index, bytes);
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
  hook::AdvanceTabEpoch();  // the launching threads settle their tabs at their next launch
  g_state.samples.Drain(&DrainSample);
  bool busy = g_state.samples.InFlight() > 0;
  const int n = g_state.device_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    HookDevice& d = g_state.devices[i];
    if (d.shared == nullptr) continue;
    hook::TokenBucket::Refill(&d.shared->bucket, now);
    busy = busy || !hook::TokenBucket::Unlimited(&d.shared->bucket);
    hook::ControllerState* c = &d.shared->controller;
    const uint64_t last = c->last_step_ns.load(std::memory_order_relaxed);
    if (last == 0 || now - last >= hook::ElasticController::kStepNs) {
      const int32_t util = DeviceUtilization(d, &g_last_measured[i], &g_last_alone[i],
                                             g_last_step[i] == 0 ? 0 : now - g_last_step[i]);
      g_last_step[i] = now;
      // Alone on the device by the agent's count: nobody else can want its idle time. The slowdown measure
      // above cannot tell a kernel slowed by another tenant from one given more work through its arguments
      // (a kind is a kernel and its work sizes), nor from the program's own threads on a CPU device.
      const bool elastic = d.limits.policy == hook::ComputePolicy::kElastic;
      hook::ElasticController::Step(c, &d.shared->bucket, now, elastic ? util : -1,
                                    elastic && d.limits.tenants == 1);
    }
  }
  return busy;
}

void* LimiterThread(void*) {
  hook::LimiterLoop loop;
  loop.session = &g_state.session;
  loop.devices_mutex = &g_devices_mutex;
  loop.each_ms = &EveryMs;
  loop.limits_changed = &ApplyLimitsLocked;
  hook::RunLimiterLoop(loop);
}

}  // namespace

void StartLimiterThread() {
  if (g_thread_started.exchange(true)) return;
  if (!hook::StartBackgroundThread(&LimiterThread, "tessera-limit")) {
    hook::WriteStderrLine("cannot start the limiter thread: compute limits are enforced without it");
  }
}

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
