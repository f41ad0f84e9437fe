// Internal to libtessera-opencl.so: the real OpenCL entry points (from the ICD loader), the process's hook
// state, and the helpers the API families (memory.cc, launch.cc, entry.cc) share. docs/opencl.md explains the
// whole.
//
// Thread-safety: EnsureInit() runs once under a mutex; afterwards the device table is read lock-free; the
// memory records have their own mutex; the limiter thread owns the sample drain and the limits reload.
#ifndef TESSERA_HOOK_OPENCL_HOOK_H_
#define TESSERA_HOOK_OPENCL_HOOK_H_

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_2_0_APIS
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <atomic>
#include <cstdint>

#include "hook/common/limiter.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/session.h"

#define TS_EXPORT __attribute__((visibility("default")))

namespace tessera::opencl_hook {

// The real entry points, resolved once from libOpenCL.so.1 (the ICD loader). Types come from the headers'
// own declarations, so a mismatch does not compile.
struct RealCl {
#define TS_CL_HOOK(sym, version) decltype(&::sym) sym;
#include "hook/opencl/opencl_hooks.def"
#undef TS_CL_HOOK
#define TS_CL_REAL(sym) decltype(&::sym) sym;
#include "hook/opencl/opencl_real.def"
#undef TS_CL_REAL
};
extern RealCl g_cl;

// What the hook does in this process (hook/common/session.h).
using hook::Mode;

// One OpenCL device of the process (all platforms, all device types, in enumeration order: the "index" of
// the limits file).
struct HookDevice {
  cl_device_id id = nullptr;
  // "GPU-..." from cl_khr_device_uuid; else the UUID of the limits line that names its index; else
  // "opencl-<index>". `named` is false for the last (the name matches no line: look it up by index).
  char uuid[hook::kUuidSize] = {0};
  bool named = false;
  bool has_limits = false;           // false: a device the limits file does not name (its use is refused)
  int region_index = -1;
  hook::DeviceLimits limits;
  hook::RegionDevice* shared = nullptr;  // the container's entry in the shared region
  // Measured by the limiter thread from completed launches, for the elastic controller: device time of this
  // process's kernels, and the part of it the kernels would have taken alone (their cost estimate).
  std::atomic<uint64_t> measured_ns{0};
  std::atomic<uint64_t> alone_ns{0};
};

// What libtessera-opencl.so adds to the session (entry.cc).
extern const hook::Library kOpenClLibrary;

struct HookState {
  std::atomic<int> device_count{0};
  HookDevice devices[hook::kMaxDevices];
  // The mode, limits, region, agent connection, fork handling and limiter thread (hook/common/session.h,
  // shared with CUDA).
  hook::Session session{&kOpenClLibrary};
  hook::KernelCostTable costs;
  hook::SampleRing samples;
};
extern HookState g_state;

// Resolves the real entry points, reads the limits and enumerates the devices, once; starts the limiter
// thread in limited mode (again in a forked child). Safe from any hook.
inline Mode EnsureInit() {
  const Mode m = g_state.session.EnsureInit();
  if (m == Mode::kLimited && !g_state.session.limiter_started()) g_state.session.StartLimiterThread();
  return m;
}
inline Mode CurrentMode() {
  return g_state.session.mode();
}

// The hook device of a device handle (a sub-device maps to its root device); null when unknown.
HookDevice* FindDevice(cl_device_id id);
// The device a context's memory is charged to: its first device. Null when unknown.
HookDevice* ContextDevice(cl_context context);
// The device of a command queue; null when unknown. `profiling` says whether the queue records timestamps.
HookDevice* QueueDevice(cl_command_queue queue, bool* profiling);

// Reserve-then-commit: CL_SUCCESS when `bytes` were charged on `d`, CL_MEM_OBJECT_ALLOCATION_FAILURE over the
// limit or for a device the limits refuse. A null `d` (not accounted) is CL_SUCCESS.
cl_int ChargeBefore(HookDevice* d, uint64_t bytes);
void Uncharge(HookDevice* d, uint64_t bytes);

// Process-local records of charged memory (cl_mem handles and SVM pointers), with OpenCL reference counts.
struct MemRecord {
  uint64_t bytes = 0;
  int device = -1;  // index into g_state.devices
  int refs = 1;     // the application's references (creation + clRetainMemObject - clReleaseMemObject)
};
void RecordMem(uint64_t key, const MemRecord& record);
// +1 reference; false when `key` is not recorded.
bool RetainMem(uint64_t key);
// -1 reference; when it was the last, removes the record and returns true with it in `out`.
bool ReleaseMem(uint64_t key, MemRecord* out);
// Removes the record (SVM free); true with it in `out`.
bool TakeMem(uint64_t key, MemRecord* out);
// After fork(), in the child: forgets the parent's records.
void ResetMemTableInChild();

// Completes one sampled launch (limiter thread): false while it is still running.
bool DrainSample(const hook::SampleRing::Sample& s);

}  // namespace tessera::opencl_hook

#endif  // TESSERA_HOOK_OPENCL_HOOK_H_
