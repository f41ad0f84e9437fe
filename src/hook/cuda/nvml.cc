// NVML: memory as the container sees it (its limit and its use), so nvidia-smi and frameworks that ask NVML
// agree with cuMemGetInfo. Works in processes that never initialize CUDA: the GPU is matched to the limits by
// UUID, or by its CUDA ordinal under CUDA_VISIBLE_DEVICES.
#include <stdlib.h>
#include <string.h>

#include "hook/cuda/hook.h"
#include "hook/cuda/visible_devices.h"

namespace tessera::cuda_hook {


namespace {

// The container's limit and use for an NVML device; false when no limit applies.
bool ContainerView(nvmlDevice_t device, uint64_t* limit, uint64_t* used) {
  if (EnsureInit() != Mode::kLimited || g_nvml.nvmlDeviceGetUUID == nullptr) return false;
  char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
  if (g_nvml.nvmlDeviceGetUUID(device, uuid, sizeof(uuid)) != NVML_SUCCESS) return false;
  unsigned index = 0;
  int ordinal = -1;
  if (g_nvml.nvmlDeviceGetIndex != nullptr && g_nvml.nvmlDeviceGetIndex(device, &index) == NVML_SUCCESS) {
    ordinal = CudaOrdinalForGpu(getenv("CUDA_VISIBLE_DEVICES"), index, uuid);
  }
  const hook::DeviceLimits* l = hook::FindDeviceLimits(g_state.session.limits, uuid, ordinal);
  if (l == nullptr || l->memory_bytes == 0) return false;
  // The region's limit is the live one (a resize may have raised it since this process read its limits).
  const int r = g_state.session.region.FindDevice(uuid);
  *limit = r >= 0 && g_state.session.region.Limit(r) != 0 ? g_state.session.region.Limit(r) : l->memory_bytes;
  *used = r >= 0 ? g_state.session.region.Used(r) : 0;
  return true;
}

nvmlReturn_t InitResult(nvmlReturn_t r) {
  return r;
}

}  // namespace

}  // namespace tessera::cuda_hook

using namespace tessera::cuda_hook;  // NOLINT: the exported C entry points below

extern "C" nvmlReturn_t tessera_nvmlInit(void) {
  if (EnsureInit() == Mode::kFailClosed) return NVML_ERROR_NO_PERMISSION;
  if (!LoadRealNvml() || g_nvml.real_nvmlInit == nullptr) return NVML_ERROR_UNINITIALIZED;
  return InitResult(g_nvml.real_nvmlInit());
}

extern "C" nvmlReturn_t tessera_nvmlInit_v2(void) {
  if (EnsureInit() == Mode::kFailClosed) return NVML_ERROR_NO_PERMISSION;
  if (!LoadRealNvml() || g_nvml.real_nvmlInit_v2 == nullptr) return NVML_ERROR_UNINITIALIZED;
  return InitResult(g_nvml.real_nvmlInit_v2());
}

extern "C" nvmlReturn_t tessera_nvmlInitWithFlags(unsigned int flags) {
  if (EnsureInit() == Mode::kFailClosed) return NVML_ERROR_NO_PERMISSION;
  if (!LoadRealNvml() || g_nvml.real_nvmlInitWithFlags == nullptr) return NVML_ERROR_UNINITIALIZED;
  return InitResult(g_nvml.real_nvmlInitWithFlags(flags));
}

extern "C" nvmlReturn_t tessera_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (!LoadRealNvml() || g_nvml.real_nvmlDeviceGetMemoryInfo == nullptr) return NVML_ERROR_UNINITIALIZED;
  const nvmlReturn_t r = g_nvml.real_nvmlDeviceGetMemoryInfo(device, memory);
  uint64_t limit = 0;
  uint64_t used = 0;
  if (r != NVML_SUCCESS || memory == nullptr || !ContainerView(device, &limit, &used)) return r;
  const uint64_t total = limit < memory->total ? limit : memory->total;
  memory->total = total;
  memory->used = used;
  uint64_t free = total > used ? total - used : 0;
  if (free > memory->free) free = memory->free;
  memory->free = free;
  return r;
}

extern "C" nvmlReturn_t tessera_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t* memory) {
  if (!LoadRealNvml() || g_nvml.real_nvmlDeviceGetMemoryInfo_v2 == nullptr) return NVML_ERROR_UNINITIALIZED;
  const nvmlReturn_t r = g_nvml.real_nvmlDeviceGetMemoryInfo_v2(device, memory);
  uint64_t limit = 0;
  uint64_t used = 0;
  if (r != NVML_SUCCESS || memory == nullptr || !ContainerView(device, &limit, &used)) return r;
  const uint64_t total = limit < memory->total ? limit : memory->total;
  memory->total = total;
  memory->reserved = 0;
  memory->used = used;
  uint64_t free = total > used ? total - used : 0;
  if (free > memory->free) free = memory->free;
  memory->free = free;
  return r;
}

// --- Processes: what the driver holds for this process (the footprint's truth source), and the process lists
// as the container may see them.

namespace tessera::cuda_hook {

namespace {

constexpr unsigned kMaxListed = 256;

// The real process list of a GPU in the v2/v3 layout (v1 converted). False when NVML cannot give it.
bool RealProcessList(nvmlDevice_t h, nvmlProcessInfo_t* infos, unsigned* count) {
  unsigned n = *count;
  if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses_v3 != nullptr) {
    if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses_v3(h, &n, infos) != NVML_SUCCESS) return false;
  } else if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses_v2 != nullptr) {
    if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses_v2(h, &n, infos) != NVML_SUCCESS) return false;
  } else if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses != nullptr) {
    nvmlProcessInfo_v1_t v1[kMaxListed];
    if (n > kMaxListed) n = kMaxListed;
    if (g_nvml.real_nvmlDeviceGetComputeRunningProcesses(h, &n, v1) != NVML_SUCCESS) return false;
    for (unsigned i = 0; i < n; ++i) infos[i] = nvmlProcessInfo_t{v1[i].pid, v1[i].usedGpuMemory, ~0u, ~0u};
  } else {
    return false;
  }
  *count = n;
  return true;
}

// The real process list of a device (its NVML handle looked up once). False without NVML.
bool DeviceProcessList(int ordinal, nvmlProcessInfo_t* infos, unsigned* count) {
  HookDevice* d = DeviceAt(ordinal);
  if (d == nullptr || !NvmlReady()) return false;
  if (d->nvml == nullptr && (g_nvml.nvmlDeviceGetHandleByUUID == nullptr ||
                             g_nvml.nvmlDeviceGetHandleByUUID(d->uuid, &d->nvml) != NVML_SUCCESS)) {
    return false;
  }
  return RealProcessList(d->nvml, infos, count);
}

}  // namespace

ProcessUse ProcessUsedBytes(int ordinal, uint64_t* out) {
  nvmlProcessInfo_t infos[kMaxListed];
  unsigned n = kMaxListed;
  if (!DeviceProcessList(ordinal, infos, &n)) return ProcessUse::kUnavailable;
  for (unsigned i = 0; i < n; ++i) {
    if (infos[i].pid != g_state.session.host_pid) continue;
    if (infos[i].usedGpuMemory == TESSERA_NVML_VALUE_NOT_AVAILABLE) return ProcessUse::kUnavailable;
    *out = infos[i].usedGpuMemory;
    return ProcessUse::kKnown;
  }
  *out = 0;
  return ProcessUse::kNotListed;
}

Tenancy DeviceTenancy(int ordinal) {
  nvmlProcessInfo_t infos[kMaxListed];
  unsigned n = kMaxListed;
  if (!DeviceProcessList(ordinal, infos, &n)) return Tenancy::kUnknown;
  for (unsigned i = 0; i < n; ++i) {
    uint32_t local = 0;
    if (!g_state.session.region.ContainerPidForHostPid(infos[i].pid, &local)) return Tenancy::kShared;
  }
  return Tenancy::kAlone;
}

namespace {

// Keeps the entries of this container's live processes, under their pids in the container. `infos` holds
// `*count` entries on entry; the kept ones are moved to the front.
template <typename Info>
void KeepContainerProcesses(Info* infos, unsigned* count) {
  unsigned kept = 0;
  for (unsigned i = 0; i < *count; ++i) {
    uint32_t local = 0;
    if (!g_state.session.region.ContainerPidForHostPid(infos[i].pid, &local)) continue;
    Info e = infos[i];
    e.pid = local;
    infos[kept++] = e;
  }
  *count = kept;
}

bool Filtering() {
  return EnsureInit() == Mode::kLimited && g_state.session.region.is_open();
}

// Calls the real list function into a scratch buffer large enough for the whole GPU, filters it, and
// answers as NVML does: NVML_ERROR_INSUFFICIENT_SIZE with the needed count when `infos` is too small.
template <typename Info, typename Real>
nvmlReturn_t FilteredList(Real real, nvmlDevice_t device, unsigned* count, Info* infos) {
  if (!LoadRealNvml() || real == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  if (!Filtering() || count == nullptr) return real(device, count, infos);
  Info all[kMaxListed];
  unsigned n = kMaxListed;
  const nvmlReturn_t r = real(device, &n, all);
  if (r != NVML_SUCCESS) return r;
  KeepContainerProcesses(all, &n);
  const unsigned room = infos == nullptr ? 0 : *count;
  *count = n;
  if (n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (unsigned i = 0; i < n; ++i) infos[i] = all[i];
  return NVML_SUCCESS;
}

}  // namespace

}  // namespace tessera::cuda_hook

#define TS_PROCESS_LIST(name, info)                                                                       \
  extern "C" nvmlReturn_t tessera_##name(nvmlDevice_t device, unsigned int* count, info* infos) {        \
    return FilteredList(g_nvml.real_##name, device, count, infos);                                       \
  }
TS_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses, nvmlProcessInfo_v1_t)
TS_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v2, nvmlProcessInfo_t)
TS_PROCESS_LIST(nvmlDeviceGetComputeRunningProcesses_v3, nvmlProcessInfo_t)
TS_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses, nvmlProcessInfo_v1_t)
TS_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v2, nvmlProcessInfo_t)
TS_PROCESS_LIST(nvmlDeviceGetGraphicsRunningProcesses_v3, nvmlProcessInfo_t)
TS_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses, nvmlProcessInfo_v1_t)
TS_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v2, nvmlProcessInfo_t)
TS_PROCESS_LIST(nvmlDeviceGetMPSComputeRunningProcesses_v3, nvmlProcessInfo_t)
#undef TS_PROCESS_LIST

// Per-process utilization samples: the container's processes only, as the process lists.
extern "C" nvmlReturn_t tessera_nvmlDeviceGetProcessUtilization(nvmlDevice_t device,
                                                                 nvmlProcessUtilizationSample_t* samples,
                                                                 unsigned int* count, unsigned long long since) {
  if (!LoadRealNvml() || g_nvml.real_nvmlDeviceGetProcessUtilization == nullptr) return NVML_ERROR_FUNCTION_NOT_FOUND;
  if (!Filtering() || count == nullptr) {
    return g_nvml.real_nvmlDeviceGetProcessUtilization(device, samples, count, since);
  }
  nvmlProcessUtilizationSample_t all[kMaxListed];
  unsigned n = kMaxListed;
  const nvmlReturn_t r = g_nvml.real_nvmlDeviceGetProcessUtilization(device, all, &n, since);
  if (r != NVML_SUCCESS) return r;
  KeepContainerProcesses(all, &n);
  const unsigned room = samples == nullptr ? 0 : *count;
  *count = n;
  if (n > room) return NVML_ERROR_INSUFFICIENT_SIZE;
  for (unsigned i = 0; i < n; ++i) samples[i] = all[i];
  return NVML_SUCCESS;
}
