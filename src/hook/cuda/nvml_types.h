// The part of NVML's C API that Tessera uses, declared from NVIDIA's public NVML reference (nvml.h is not
// shipped with the CUDA toolkit headers here). The layouts and values are NVML's ABI; do not change them.
// Used by the CUDA hook (which intercepts a few of these) and by the fake NVML in tools/fakecuda.
//
// Thread-safety: declarations only.
#ifndef TESSERA_HOOK_CUDA_NVML_TYPES_H_
#define TESSERA_HOOK_CUDA_NVML_TYPES_H_

extern "C" {

typedef int nvmlReturn_t;
enum : int {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st* nvmlDevice_t;

typedef struct nvmlMemory_st {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

typedef struct nvmlMemory_v2_st {
  unsigned int version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_v2_t;

// NVML_STRUCT_VERSION(Memory, 2)
#define TESSERA_NVML_MEMORY_V2 (static_cast<unsigned int>(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct nvmlUtilization_st {
  unsigned int gpu;
  unsigned int memory;
} nvmlUtilization_t;

typedef struct nvmlProcessUtilizationSample_st {
  unsigned int pid;
  unsigned long long timeStamp;
  unsigned int smUtil;
  unsigned int memUtil;
  unsigned int encUtil;
  unsigned int decUtil;
} nvmlProcessUtilizationSample_t;

// Processes on a GPU (nvmlDeviceGet{Compute,Graphics,MPSCompute}RunningProcesses): the v1 layout, and the
// layout of v2 and v3 (nvmlProcessInfo_t). pid is the host's pid; usedGpuMemory is what the driver holds for
// that process on that GPU (NVML_VALUE_NOT_AVAILABLE when unknown).
typedef struct nvmlProcessInfo_v1_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct nvmlProcessInfo_v2_st {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId;
  unsigned int computeInstanceId;
} nvmlProcessInfo_v2_t, nvmlProcessInfo_t;

#define TESSERA_NVML_VALUE_NOT_AVAILABLE (0xFFFFFFFFFFFFFFFFull)

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96

typedef nvmlReturn_t nvmlInit_fn(void);
typedef nvmlReturn_t nvmlInitWithFlags_fn(unsigned int flags);
typedef nvmlReturn_t nvmlShutdown_fn(void);
typedef const char* nvmlErrorString_fn(nvmlReturn_t result);
typedef nvmlReturn_t nvmlDeviceGetCount_fn(unsigned int* count);
typedef nvmlReturn_t nvmlDeviceGetHandleByIndex_fn(unsigned int index, nvmlDevice_t* device);
typedef nvmlReturn_t nvmlDeviceGetHandleByUUID_fn(const char* uuid, nvmlDevice_t* device);
typedef nvmlReturn_t nvmlDeviceGetUUID_fn(nvmlDevice_t device, char* uuid, unsigned int length);
typedef nvmlReturn_t nvmlDeviceGetName_fn(nvmlDevice_t device, char* name, unsigned int length);
typedef nvmlReturn_t nvmlDeviceGetIndex_fn(nvmlDevice_t device, unsigned int* index);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_fn(nvmlDevice_t device, nvmlMemory_t* memory);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_v2_fn(nvmlDevice_t device, nvmlMemory_v2_t* memory);
typedef nvmlReturn_t nvmlDeviceGetUtilizationRates_fn(nvmlDevice_t device, nvmlUtilization_t* utilization);
typedef nvmlReturn_t nvmlDeviceGetRunningProcesses_v1_fn(nvmlDevice_t device, unsigned int* infoCount,
                                                          nvmlProcessInfo_v1_t* infos);
typedef nvmlReturn_t nvmlDeviceGetRunningProcesses_fn(nvmlDevice_t device, unsigned int* infoCount,
                                                       nvmlProcessInfo_t* infos);
typedef nvmlReturn_t nvmlDeviceGetProcessUtilization_fn(nvmlDevice_t device,
                                                        nvmlProcessUtilizationSample_t* utilization,
                                                        unsigned int* processSamplesCount,
                                                        unsigned long long lastSeenTimeStamp);

}  // extern "C"

#endif  // TESSERA_HOOK_CUDA_NVML_TYPES_H_
