// The subset of NVML (NVIDIA Management Library, libnvidia-ml.so.1) that tessera-node uses, declared by the
// project: there is no nvml.h on the build machines. Types, constants and signatures are copied by hand from
// NVIDIA's public API documentation (https://docs.nvidia.com/deploy/nvml-api/) and keep NVML's exact ABI:
// the same names, enum values, struct layouts (checked by static_asserts below) and the versioned entry points
// that nvml.h maps its unversioned names to (nvmlInit -> nvmlInit_v2, nvmlDeviceGetPciInfo ->
// nvmlDeviceGetPciInfo_v3, ...).
//
// The library is never linked: NvmlLibrary (nvml_library.h) dlopen()s it and looks up every symbol below.
// A fake NVML (tests/gpu/fake_nvml.cc, and tools/fakecuda's) implements the same symbols by including this file,
// so that the signatures cannot drift.
//
// The exact list of NVML symbols tessera-node resolves (TESSERA_NVML_SYMBOLS below):
//   required:  nvmlInit_v2, nvmlShutdown, nvmlErrorString, nvmlDeviceGetCount_v2,
//              nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetMemoryInfo,
//              nvmlDeviceGetPciInfo_v3
//   optional:  nvmlSystemGetDriverVersion, nvmlDeviceGetCpuAffinity, nvmlDeviceGetTopologyCommonAncestor,
//              nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2, nvmlEventSetCreate,
//              nvmlDeviceGetSupportedEventTypes, nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
//              nvmlEventSetFree
// (an optional symbol that is missing turns off what needs it: topology falls back to SYS, health to
// periodic checks; a missing required symbol is an error.)
//
// Thread-safety: NVML itself is thread-safe after nvmlInit_v2.
#ifndef TESSERA_GPU_NVML_API_H_
#define TESSERA_GPU_NVML_API_H_

#include <cstddef>

extern "C" {

typedef enum nvmlReturn_enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_NO_PERMISSION = 4,
  NVML_ERROR_ALREADY_INITIALIZED = 5,
  NVML_ERROR_NOT_FOUND = 6,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_INSUFFICIENT_POWER = 8,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_TIMEOUT = 10,
  NVML_ERROR_IRQ_ISSUE = 11,
  NVML_ERROR_LIBRARY_NOT_FOUND = 12,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_CORRUPTED_INFOROM = 14,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_RESET_REQUIRED = 16,
  NVML_ERROR_OPERATING_SYSTEM = 17,
  NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
  NVML_ERROR_IN_USE = 19,
  NVML_ERROR_MEMORY = 20,
  NVML_ERROR_NO_DATA = 21,
  NVML_ERROR_VGPU_ECC_NOT_ENABLED = 22,
  NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
  NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlEventSet_st* nvmlEventSet_t;

typedef enum nvmlEnableState_enum { NVML_FEATURE_DISABLED = 0, NVML_FEATURE_ENABLED = 1 } nvmlEnableState_t;

// The nearest common ancestor of two GPUs in the PCIe tree (nvidia-smi: PIX, PXB, PHB, NODE, SYS).
typedef enum nvmlGpuLevel_enum {
  NVML_TOPOLOGY_INTERNAL = 0,     // devices on the same board
  NVML_TOPOLOGY_SINGLE = 10,      // at most one PCIe switch between them (PIX)
  NVML_TOPOLOGY_MULTIPLE = 20,    // several PCIe switches, no host bridge (PXB)
  NVML_TOPOLOGY_HOSTBRIDGE = 30,  // the same PCIe host bridge (PHB)
  NVML_TOPOLOGY_NODE = 40,        // host bridges of one NUMA node (NODE; formerly NVML_TOPOLOGY_CPU)
  NVML_TOPOLOGY_SYSTEM = 50       // across the SMP interconnect (SYS)
} nvmlGpuTopologyLevel_t;

#define NVML_DEVICE_UUID_V2_BUFFER_SIZE 96
#define NVML_DEVICE_NAME_V2_BUFFER_SIZE 96
#define NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE 32
#define NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE 16
#define NVML_NVLINK_MAX_LINKS 18

typedef struct nvmlMemory_st {
  unsigned long long total;  // bytes
  unsigned long long free;
  unsigned long long used;
} nvmlMemory_t;

// nvmlPciInfo_t as filled by nvmlDeviceGetPciInfo_v3 and nvmlDeviceGetNvLinkRemotePciInfo_v2.
typedef struct nvmlPciInfo_st {
  char busIdLegacy[NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE];  // "0000:07:00.0" (legacy)
  unsigned int domain;
  unsigned int bus;
  unsigned int device;
  unsigned int pciDeviceId;     // device id << 16 | vendor id
  unsigned int pciSubSystemId;
  char busId[NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE];  // "00000000:07:00.0"
} nvmlPciInfo_t;

#define nvmlEventTypeSingleBitEccError 0x0000000000000001LL
#define nvmlEventTypeDoubleBitEccError 0x0000000000000002LL
#define nvmlEventTypePState 0x0000000000000004LL
#define nvmlEventTypeXidCriticalError 0x0000000000000008LL

typedef struct nvmlEventData_st {
  nvmlDevice_t device;           // the device the event is about (NULL: not attributable to one device)
  unsigned long long eventType;  // one of nvmlEventType*
  unsigned long long eventData;  // the XID for nvmlEventTypeXidCriticalError (999: unknown XID)
  unsigned int gpuInstanceId;    // MIG: the GPU instance, 0xFFFFFFFF otherwise
  unsigned int computeInstanceId;
} nvmlEventData_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char* nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned int length);
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int* deviceCount);
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t* device);
nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned int length);
nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned int length);
nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory);
nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t* pci);
// cpuSet: cpuSetSize unsigned longs; bit i of word w is CPU w * 8 * sizeof(unsigned long) + i.
nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize, unsigned long* cpuSet);
nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1, nvmlDevice_t device2,
                                                 nvmlGpuTopologyLevel_t* pathInfo);
nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t* isActive);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t* pci);
nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t* set);
nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long* eventTypes);
nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set);
nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t* data, unsigned int timeoutms);
nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set);

}  // extern "C"

// X(symbol, required)
#define TESSERA_NVML_SYMBOLS(X)                  \
  X(nvmlInit_v2, true)                           \
  X(nvmlShutdown, true)                          \
  X(nvmlErrorString, true)                       \
  X(nvmlDeviceGetCount_v2, true)                 \
  X(nvmlDeviceGetHandleByIndex_v2, true)         \
  X(nvmlDeviceGetUUID, true)                     \
  X(nvmlDeviceGetName, true)                     \
  X(nvmlDeviceGetMemoryInfo, true)               \
  X(nvmlDeviceGetPciInfo_v3, true)               \
  X(nvmlSystemGetDriverVersion, false)           \
  X(nvmlDeviceGetCpuAffinity, false)             \
  X(nvmlDeviceGetTopologyCommonAncestor, false)  \
  X(nvmlDeviceGetNvLinkState, false)             \
  X(nvmlDeviceGetNvLinkRemotePciInfo_v2, false)  \
  X(nvmlEventSetCreate, false)                   \
  X(nvmlDeviceGetSupportedEventTypes, false)     \
  X(nvmlDeviceRegisterEvents, false)             \
  X(nvmlEventSetWait_v2, false)                  \
  X(nvmlEventSetFree, false)

// The layouts NVML's ABI fixes (x86-64 and aarch64, LP64).
static_assert(sizeof(nvmlMemory_t) == 24);
static_assert(sizeof(nvmlPciInfo_t) == 68);
static_assert(offsetof(nvmlPciInfo_t, busId) == 36);
static_assert(sizeof(nvmlEventData_t) == 32);
static_assert(offsetof(nvmlEventData_t, eventData) == 16);
static_assert(sizeof(nvmlGpuTopologyLevel_t) == 4);

#endif  // TESSERA_GPU_NVML_API_H_
