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
  const hook::DeviceLimits* l = hook::FindDeviceLimits(g_state.limits, uuid, ordinal);
  if (l == nullptr || l->memory_bytes == 0) return false;
  // The region's limit is the live one (a resize may have raised it since this process read its limits).
  const int r = g_state.region.FindDevice(uuid);
  *limit = r >= 0 && g_state.region.Limit(r) != 0 ? g_state.region.Limit(r) : l->memory_bytes;
  *used = r >= 0 ? g_state.region.Used(r) : 0;
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
