// The part of the CUDA driver API that Tessera's CUDA hook, the fake driver (tools/fakecuda) and their tests
// use, declared by the project itself so that nothing needs the CUDA toolkit to build: the handle and value
// types, the enum values, the structure layouts and one function-pointer type per versioned entry point.
//
// Everything here is the driver's binary interface as NVIDIA documents it (the CUDA Driver API reference):
// numeric values, structure layouts, and the names of the structure and enum tags (they are part of C++ name
// mangling, so the hook's wrappers link and type-check exactly like code built against the toolkit). Do not
// change a value or a layout; add what a new entry point needs. tests/hook/cuda_api_test.cc compares every
// declaration with the toolkit's cuda.h when one is installed.
//
// Function-pointer types are named PFN_<entry point>_v<version>, where the version (1000*major + 10*minor) is
// the CUDA release that introduced that variant, and _ptsz marks the per-thread-default-stream variant: the
// same scheme as the toolkit's cudaTypedefs.h, so an entry point's versions are told apart by type.
//
//   #include "hook/cuda/cuda_api.h"
//   PFN_cuMemAlloc_v3020 alloc = reinterpret_cast<PFN_cuMemAlloc_v3020>(dlsym(lib, "cuMemAlloc_v2"));
//   CUdeviceptr p = 0;
//   if (alloc(&p, 1 << 20) == CUDA_ERROR_OUT_OF_MEMORY) { ... }
//
// Thread-safety: declarations only.
#ifndef TESSERA_HOOK_CUDA_CUDA_API_H_
#define TESSERA_HOOK_CUDA_CUDA_API_H_

#include <stddef.h>
#include <stdint.h>

extern "C" {

// ---- Scalars and handles ----------------------------------------------------------------------------------

typedef uint32_t cuuint32_t;
typedef uint64_t cuuint64_t;

typedef unsigned int CUdeviceptr_v1;        // the 32-bit device pointer of the pre-3.2 entry points
typedef unsigned long long CUdeviceptr_v2;  // NOLINT(runtime/int): the ABI's type
typedef CUdeviceptr_v2 CUdeviceptr;
typedef int CUdevice_v1;
typedef CUdevice_v1 CUdevice;
typedef unsigned long long CUmemGenericAllocationHandle_v1;  // NOLINT(runtime/int)
typedef CUmemGenericAllocationHandle_v1 CUmemGenericAllocationHandle;

typedef struct CUctx_st* CUcontext;
typedef struct CUmod_st* CUmodule;
typedef struct CUfunc_st* CUfunction;
typedef struct CUlib_st* CUlibrary;
typedef struct CUkern_st* CUkernel;
typedef struct CUarray_st* CUarray;
typedef struct CUmipmappedArray_st* CUmipmappedArray;
typedef struct CUevent_st* CUevent;
typedef struct CUstream_st* CUstream;
typedef struct CUgraph_st* CUgraph;
typedef struct CUgraphNode_st* CUgraphNode;
typedef struct CUgraphExec_st* CUgraphExec;
typedef struct CUmemPoolHandle_st* CUmemoryPool;
typedef struct CUgreenCtx_st* CUgreenCtx;
typedef struct CUdevResourceDesc_st* CUdevResourceDesc;

// The special stream handles: the legacy default stream and the per-thread default stream.
#define CU_STREAM_LEGACY (reinterpret_cast<CUstream>(0x1))
#define CU_STREAM_PER_THREAD (reinterpret_cast<CUstream>(0x2))

// The CUDA version these declarations describe (1000*major + 10*minor): 13.0.
#define CUDA_VERSION 13000

typedef struct CUuuid_st {
  char bytes[16];
} CUuuid;

// ---- Result codes (the ones Tessera produces or tests for; any other value passes through unchanged)
// --------

typedef enum cudaError_enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_OUT_OF_MEMORY = 2,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_DEINITIALIZED = 4,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_DEVICE = 101,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_ILLEGAL_STATE = 401,
  CUDA_ERROR_NOT_FOUND = 500,
  CUDA_ERROR_NOT_READY = 600,
  CUDA_ERROR_NOT_PERMITTED = 800,
  CUDA_ERROR_NOT_SUPPORTED = 801,
  CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,
  CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901,
  CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
  CUDA_ERROR_UNKNOWN = 999,
} CUresult;

// ---- Enumerations ---------------------------------------------------------------------------------------

typedef enum CUarray_format_enum {
  CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
  CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
  CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
  CU_AD_FORMAT_SIGNED_INT8 = 0x08,
  CU_AD_FORMAT_SIGNED_INT16 = 0x09,
  CU_AD_FORMAT_SIGNED_INT32 = 0x0a,
  CU_AD_FORMAT_HALF = 0x10,
  CU_AD_FORMAT_FLOAT = 0x20,
} CUarray_format;

// Bytes of one component of an array element (CUDA_ARRAY_DESCRIPTOR: an element is NumChannels components of
// Format); 0 for a format this header does not declare. The fake driver and the hook's estimate both read it.
inline unsigned ArrayFormatBytes(CUarray_format format) {
  switch (format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
      return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
      return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
      return 4;
  }
  return 0;
}

typedef enum CUdevice_attribute_enum {
  CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
} CUdevice_attribute;

// cuEventCreate flags.
enum CUevent_flags_enum {
  CU_EVENT_DEFAULT = 0x0,
  CU_EVENT_BLOCKING_SYNC = 0x1,
  CU_EVENT_DISABLE_TIMING = 0x2,
};

// CUDA_ARRAY3D_DESCRIPTOR::Flags bits.
#define CUDA_ARRAY3D_LAYERED 0x01
#define CUDA_ARRAY3D_CUBEMAP 0x04

typedef enum CUstreamCaptureStatus_enum {
  CU_STREAM_CAPTURE_STATUS_NONE = 0,
  CU_STREAM_CAPTURE_STATUS_ACTIVE = 1,
  CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2,
} CUstreamCaptureStatus;

typedef enum CUstreamCaptureMode_enum {
  CU_STREAM_CAPTURE_MODE_GLOBAL = 0,
  CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
  CU_STREAM_CAPTURE_MODE_RELAXED = 2,
} CUstreamCaptureMode;

// cuGetProcAddress flags.
typedef enum CUdriverProcAddress_flags_enum {
  CU_GET_PROC_ADDRESS_DEFAULT = 0,
  CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1 << 0,
  CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 1 << 1,
} CUdriverProcAddress_flags;

// cuGetProcAddress_v2's symbol status.
typedef enum CUdriverProcAddressQueryResult_enum {
  CU_GET_PROC_ADDRESS_SUCCESS = 0,
  CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
  CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2,
} CUdriverProcAddressQueryResult;

typedef enum CUmemAllocationHandleType_enum {
  CU_MEM_HANDLE_TYPE_NONE = 0x0,
  CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1,
} CUmemAllocationHandleType;

typedef enum CUmemAccess_flags_enum {
  CU_MEM_ACCESS_FLAGS_PROT_NONE = 0x0,
  CU_MEM_ACCESS_FLAGS_PROT_READ = 0x1,
  CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3,
} CUmemAccess_flags;

typedef enum CUmemLocationType_enum {
  CU_MEM_LOCATION_TYPE_INVALID = 0x0,
  CU_MEM_LOCATION_TYPE_DEVICE = 0x1,
  CU_MEM_LOCATION_TYPE_HOST = 0x2,
} CUmemLocationType;

typedef enum CUmemAllocationType_enum {
  CU_MEM_ALLOCATION_TYPE_INVALID = 0x0,
  CU_MEM_ALLOCATION_TYPE_PINNED = 0x1,
} CUmemAllocationType;

typedef enum CUmemAllocationGranularity_flags_enum {
  CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0,
  CU_MEM_ALLOC_GRANULARITY_RECOMMENDED = 0x1,
} CUmemAllocationGranularity_flags;

typedef enum CUexecAffinityType_enum {
  CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0,
} CUexecAffinityType;

typedef enum CUcigDataType_enum {
  CIG_DATA_TYPE_D3D12_COMMAND_QUEUE = 0x1,
  CIG_DATA_TYPE_NV_BLOB = 0x2,
} CUcigDataType;

// Launch attributes are passed through untouched: only the id's type and the value's size matter here.
typedef enum CUlaunchAttributeID_enum {
  CU_LAUNCH_ATTRIBUTE_IGNORE = 0,
  CU_LAUNCH_ATTRIBUTE_COOPERATIVE = 2,
} CUlaunchAttributeID;

// Options of the module and library loaders (passed through; only their type matters here).
typedef enum CUjit_option_enum { CU_JIT_MAX_REGISTERS = 0 } CUjit_option;
typedef enum CUlibraryOption_enum { CU_LIBRARY_HOST_UNIVERSAL_FUNCTION_AND_DATA_TABLE = 0 } CUlibraryOption;

typedef enum CUlimit_enum {
  CU_LIMIT_STACK_SIZE = 0x00,
  CU_LIMIT_PRINTF_FIFO_SIZE = 0x01,
  CU_LIMIT_MALLOC_HEAP_SIZE = 0x02,
} CUlimit;

typedef enum CUmemPool_attribute_enum {
  CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES = 1,
  CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC = 2,
  CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES = 3,
  CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,     // cuuint64_t: memory kept at synchronization points
  CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT = 5,  // cuuint64_t: memory the pool holds from the device
  CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 6,
  CU_MEMPOOL_ATTR_USED_MEM_CURRENT = 7,      // cuuint64_t: memory handed out to the application
  CU_MEMPOOL_ATTR_USED_MEM_HIGH = 8,
} CUmemPool_attribute;

typedef enum CUgraphMem_attribute_enum {
  CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT = 0,
  CU_GRAPH_MEM_ATTR_USED_MEM_HIGH = 1,
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT = 2,  // cuuint64_t: the device's graph memory pool, physical
  CU_GRAPH_MEM_ATTR_RESERVED_MEM_HIGH = 3,
} CUgraphMem_attribute;

typedef enum CUgraphNodeType_enum {
  CU_GRAPH_NODE_TYPE_KERNEL = 0,
  CU_GRAPH_NODE_TYPE_MEM_ALLOC = 10,
  CU_GRAPH_NODE_TYPE_MEM_FREE = 11,
} CUgraphNodeType;

typedef enum CUmem_advise_enum {
  CU_MEM_ADVISE_SET_READ_MOSTLY = 1,
  CU_MEM_ADVISE_SET_PREFERRED_LOCATION = 3,
  CU_MEM_ADVISE_SET_ACCESSED_BY = 5,
} CUmem_advise;

// ---- Structures -----------------------------------------------------------------------------------------

// cuArrayCreate_v2 (CUDA 3.2 and later) and the 32-bit form of cuArrayCreate.
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v2;
typedef CUDA_ARRAY_DESCRIPTOR_v2 CUDA_ARRAY_DESCRIPTOR;
typedef struct CUDA_ARRAY_DESCRIPTOR_v1_st {
  unsigned int Width;
  unsigned int Height;
  CUarray_format Format;
  unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;

// cuArray3DCreate_v2, cuMipmappedArrayCreate, and the 32-bit form of cuArray3DCreate.
typedef struct CUDA_ARRAY3D_DESCRIPTOR_st {
  size_t Width;
  size_t Height;
  size_t Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v2;
typedef CUDA_ARRAY3D_DESCRIPTOR_v2 CUDA_ARRAY3D_DESCRIPTOR;
typedef struct CUDA_ARRAY3D_DESCRIPTOR_v1_st {
  unsigned int Width;
  unsigned int Height;
  unsigned int Depth;
  CUarray_format Format;
  unsigned int NumChannels;
  unsigned int Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;

// Where memory lives (VMM allocations, pools): a device ordinal for CU_MEM_LOCATION_TYPE_DEVICE.
typedef struct CUmemLocation_st {
  CUmemLocationType type;
  int id;
} CUmemLocation_v1;
typedef CUmemLocation_v1 CUmemLocation;

// cuMemCreate's properties.
typedef struct CUmemAllocationProp_st {
  CUmemAllocationType type;
  CUmemAllocationHandleType requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;  // NOLINT(runtime/int)
    unsigned char reserved[4];
  } allocFlags;
} CUmemAllocationProp_v1;
typedef CUmemAllocationProp_v1 CUmemAllocationProp;

// cuMemSetAccess's descriptor.
typedef struct CUmemAccessDesc_st {
  CUmemLocation location;
  CUmemAccess_flags flags;
} CUmemAccessDesc_v1;
typedef CUmemAccessDesc_v1 CUmemAccessDesc;

// cuMemPoolCreate's properties (and a graph memory node's pool).
typedef struct CUmemPoolProps_st {
  CUmemAllocationType allocType;
  CUmemAllocationHandleType handleTypes;
  CUmemLocation location;
  void* win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;  // NOLINT(runtime/int)
  unsigned char reserved[54];
} CUmemPoolProps_v1;
typedef CUmemPoolProps_v1 CUmemPoolProps;

// cuGraphAddMemAllocNode's parameters; the driver writes the address to dptr.
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v1_st {
  CUmemPoolProps poolProps;
  const CUmemAccessDesc* accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v1;
typedef CUDA_MEM_ALLOC_NODE_PARAMS_v1 CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct CUDA_MEM_ALLOC_NODE_PARAMS_v2_st {
  CUmemPoolProps poolProps;
  const CUmemAccessDesc* accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS_v2;

// cuGraphAddNode's parameters: a node type and a 232-byte union, of which the hook reads only `alloc`.
typedef struct CUgraphNodeParams_st {
  CUgraphNodeType type;
  int reserved0[3];
  union {
    long long reserved1[29];
    CUDA_MEM_ALLOC_NODE_PARAMS_v2 alloc;
  };
  long long reserved2;
} CUgraphNodeParams;

typedef struct CUgraphEdgeData_st {
  unsigned char from_port;
  unsigned char to_port;
  unsigned char type;
  unsigned char reserved[5];
} CUgraphEdgeData;

// cuGraphAddKernelNode_v2's parameters.
typedef struct CUDA_KERNEL_NODE_PARAMS_v2_st {
  CUfunction func;
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  void** kernelParams;
  void** extra;
  CUkernel kern;
  CUcontext ctx;
} CUDA_KERNEL_NODE_PARAMS_v2;
typedef CUDA_KERNEL_NODE_PARAMS_v2 CUDA_KERNEL_NODE_PARAMS;

// A launch attribute: the id, padded to 8 bytes, then a 64-byte value union (opaque here).
typedef union CUlaunchAttributeValue_union {
  char pad[64];
} CUlaunchAttributeValue;
typedef struct CUlaunchAttribute_st {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
} CUlaunchAttribute;

// cuLaunchKernelEx's configuration.
typedef struct CUlaunchConfig_st {
  unsigned int gridDimX;
  unsigned int gridDimY;
  unsigned int gridDimZ;
  unsigned int blockDimX;
  unsigned int blockDimY;
  unsigned int blockDimZ;
  unsigned int sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned int numAttrs;
} CUlaunchConfig;

// cuCtxCreate_v3/_v4's execution-affinity and creation parameters.
typedef struct CUexecAffinitySmCount_st {
  unsigned int val;
} CUexecAffinitySmCount_v1;
typedef CUexecAffinitySmCount_v1 CUexecAffinitySmCount;
typedef struct CUexecAffinityParam_st {
  CUexecAffinityType type;
  union {
    CUexecAffinitySmCount smCount;
  } param;
} CUexecAffinityParam_v1;
typedef CUexecAffinityParam_v1 CUexecAffinityParam;
typedef struct CUctxCigParam_st {
  CUcigDataType sharedDataType;
  void* sharedData;
} CUctxCigParam;
typedef struct CUctxCreateParams_st {
  CUexecAffinityParam* execAffinityParams;
  int numExecAffinityParams;
  CUctxCigParam* cigParams;
} CUctxCreateParams;

// ---- Entry points: one function-pointer type per versioned variant
// ------------------------------------------

// Initialization, versions, errors, entry points.
typedef CUresult (*PFN_cuInit_v2000)(unsigned int flags);
typedef CUresult (*PFN_cuDriverGetVersion_v2020)(int* driverVersion);
typedef CUresult (*PFN_cuGetErrorString_v6000)(CUresult error, const char** pStr);
typedef CUresult (*PFN_cuGetErrorName_v6000)(CUresult error, const char** pStr);
typedef CUresult (*PFN_cuGetProcAddress_v11030)(const char* symbol, void** pfn, int driverVersion,
                                                cuuint64_t flags);
typedef CUresult (*PFN_cuGetProcAddress_v12000)(const char* symbol, void** pfn, int driverVersion,
                                                cuuint64_t flags,
                                                CUdriverProcAddressQueryResult* symbolStatus);

// Devices.
typedef CUresult (*PFN_cuDeviceGetCount_v2000)(int* count);
typedef CUresult (*PFN_cuDeviceGet_v2000)(CUdevice_v1* device, int ordinal);
typedef CUresult (*PFN_cuDeviceGetName_v2000)(char* name, int len, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceGetUuid_v9020)(CUuuid* uuid, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceGetUuid_v11040)(CUuuid* uuid, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceTotalMem_v2000)(unsigned int* bytes, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceTotalMem_v3020)(size_t* bytes, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceGetAttribute_v2000)(int* pi, CUdevice_attribute attrib, CUdevice_v1 dev);

// Contexts.
typedef CUresult (*PFN_cuDevicePrimaryCtxRetain_v7000)(CUcontext* pctx, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDevicePrimaryCtxRelease_v7000)(CUdevice_v1 dev);
typedef CUresult (*PFN_cuDevicePrimaryCtxRelease_v11000)(CUdevice_v1 dev);
typedef CUresult (*PFN_cuDevicePrimaryCtxReset_v7000)(CUdevice_v1 dev);
typedef CUresult (*PFN_cuDevicePrimaryCtxReset_v11000)(CUdevice_v1 dev);
typedef CUresult (*PFN_cuCtxCreate_v2000)(CUcontext* pctx, unsigned int flags, CUdevice_v1 dev);
typedef CUresult (*PFN_cuCtxCreate_v3020)(CUcontext* pctx, unsigned int flags, CUdevice_v1 dev);
typedef CUresult (*PFN_cuCtxCreate_v11040)(CUcontext* pctx, CUexecAffinityParam* paramsArray, int numParams,
                                           unsigned int flags, CUdevice_v1 dev);
typedef CUresult (*PFN_cuCtxCreate_v12050)(CUcontext* pctx, CUctxCreateParams* ctxCreateParams,
                                           unsigned int flags, CUdevice dev);
typedef CUresult (*PFN_cuCtxDestroy_v2000)(CUcontext ctx);
typedef CUresult (*PFN_cuCtxDestroy_v4000)(CUcontext ctx);
typedef CUresult (*PFN_cuCtxSetCurrent_v4000)(CUcontext ctx);
typedef CUresult (*PFN_cuCtxGetCurrent_v4000)(CUcontext* pctx);
typedef CUresult (*PFN_cuCtxPushCurrent_v4000)(CUcontext ctx);
typedef CUresult (*PFN_cuCtxPopCurrent_v4000)(CUcontext* pctx);
typedef CUresult (*PFN_cuCtxGetDevice_v2000)(CUdevice_v1* device);
typedef CUresult (*PFN_cuCtxSynchronize_v2000)(void);

// Memory information.
typedef CUresult (*PFN_cuMemGetInfo_v2000)(unsigned int* free, unsigned int* total);
typedef CUresult (*PFN_cuMemGetInfo_v3020)(size_t* free, size_t* total);

// Linear memory.
typedef CUresult (*PFN_cuMemAlloc_v2000)(CUdeviceptr_v1* dptr, unsigned int bytesize);
typedef CUresult (*PFN_cuMemAlloc_v3020)(CUdeviceptr_v2* dptr, size_t bytesize);
typedef CUresult (*PFN_cuMemAllocPitch_v2000)(CUdeviceptr_v1* dptr, unsigned int* pPitch,
                                              unsigned int WidthInBytes, unsigned int Height,
                                              unsigned int ElementSizeBytes);
typedef CUresult (*PFN_cuMemAllocPitch_v3020)(CUdeviceptr_v2* dptr, size_t* pPitch, size_t WidthInBytes,
                                              size_t Height, unsigned int ElementSizeBytes);
typedef CUresult (*PFN_cuMemAllocManaged_v6000)(CUdeviceptr_v2* dptr, size_t bytesize, unsigned int flags);
typedef CUresult (*PFN_cuMemFree_v2000)(CUdeviceptr_v1 dptr);
typedef CUresult (*PFN_cuMemFree_v3020)(CUdeviceptr_v2 dptr);
typedef CUresult (*PFN_cuMemAllocHost_v3020)(void** pp, size_t bytesize);
typedef CUresult (*PFN_cuMemFreeHost_v2000)(void* p);

// Arrays.
typedef CUresult (*PFN_cuArrayCreate_v2000)(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v1* pAllocateArray);
typedef CUresult (*PFN_cuArrayCreate_v3020)(CUarray* pHandle, const CUDA_ARRAY_DESCRIPTOR_v2* pAllocateArray);
typedef CUresult (*PFN_cuArray3DCreate_v2000)(CUarray* pHandle,
                                              const CUDA_ARRAY3D_DESCRIPTOR_v1* pAllocateArray);
typedef CUresult (*PFN_cuArray3DCreate_v3020)(CUarray* pHandle,
                                              const CUDA_ARRAY3D_DESCRIPTOR_v2* pAllocateArray);
typedef CUresult (*PFN_cuArrayDestroy_v2000)(CUarray hArray);
typedef CUresult (*PFN_cuMipmappedArrayCreate_v5000)(CUmipmappedArray* pHandle,
                                                     const CUDA_ARRAY3D_DESCRIPTOR_v2* pMipmappedArrayDesc,
                                                     unsigned int numMipmapLevels);
typedef CUresult (*PFN_cuMipmappedArrayDestroy_v5000)(CUmipmappedArray hMipmappedArray);

// Virtual memory management.
typedef CUresult (*PFN_cuMemGetAllocationGranularity_v10020)(size_t* granularity,
                                                             const CUmemAllocationProp_v1* prop,
                                                             CUmemAllocationGranularity_flags option);
typedef CUresult (*PFN_cuMemCreate_v10020)(CUmemGenericAllocationHandle_v1* handle, size_t size,
                                           const CUmemAllocationProp_v1* prop,
                                           unsigned long long flags);  // NOLINT(runtime/int)
typedef CUresult (*PFN_cuMemRelease_v10020)(CUmemGenericAllocationHandle_v1 handle);
typedef CUresult (*PFN_cuMemAddressReserve_v10020)(CUdeviceptr_v2* ptr, size_t size, size_t alignment,
                                                   CUdeviceptr_v2 addr,
                                                   unsigned long long flags);  // NOLINT(runtime/int)
typedef CUresult (*PFN_cuMemAddressFree_v10020)(CUdeviceptr_v2 ptr, size_t size);
typedef CUresult (*PFN_cuMemMap_v10020)(CUdeviceptr_v2 ptr, size_t size, size_t offset,
                                        CUmemGenericAllocationHandle_v1 handle,
                                        unsigned long long flags);  // NOLINT(runtime/int)
typedef CUresult (*PFN_cuMemUnmap_v10020)(CUdeviceptr_v2 ptr, size_t size);
typedef CUresult (*PFN_cuMemSetAccess_v10020)(CUdeviceptr_v2 ptr, size_t size, const CUmemAccessDesc_v1* desc,
                                              size_t count);
typedef CUresult (*PFN_cuMemRetainAllocationHandle_v11000)(CUmemGenericAllocationHandle_v1* handle,
                                                           void* addr);

// Stream-ordered allocation and pools.
typedef CUresult (*PFN_cuMemAllocAsync_v11020)(CUdeviceptr_v2* dptr, size_t bytesize, CUstream hStream);
typedef CUresult (*PFN_cuMemAllocAsync_v11020_ptsz)(CUdeviceptr_v2* dptr, size_t bytesize, CUstream hStream);
typedef CUresult (*PFN_cuMemAllocFromPoolAsync_v11020)(CUdeviceptr_v2* dptr, size_t bytesize,
                                                       CUmemoryPool pool, CUstream hStream);
typedef CUresult (*PFN_cuMemAllocFromPoolAsync_v11020_ptsz)(CUdeviceptr_v2* dptr, size_t bytesize,
                                                            CUmemoryPool pool, CUstream hStream);
typedef CUresult (*PFN_cuMemFreeAsync_v11020)(CUdeviceptr_v2 dptr, CUstream hStream);
typedef CUresult (*PFN_cuMemFreeAsync_v11020_ptsz)(CUdeviceptr_v2 dptr, CUstream hStream);
typedef CUresult (*PFN_cuMemPoolCreate_v11020)(CUmemoryPool* pool, const CUmemPoolProps_v1* poolProps);
typedef CUresult (*PFN_cuMemPoolDestroy_v11020)(CUmemoryPool pool);

// Modules, streams, events.
typedef CUresult (*PFN_cuModuleLoadData_v2000)(CUmodule* module, const void* image);
typedef CUresult (*PFN_cuModuleUnload_v2000)(CUmodule hmod);
typedef CUresult (*PFN_cuModuleGetFunction_v2000)(CUfunction* hfunc, CUmodule hmod, const char* name);
typedef CUresult (*PFN_cuStreamCreate_v2000)(CUstream* phStream, unsigned int Flags);
typedef CUresult (*PFN_cuStreamDestroy_v4000)(CUstream hStream);
typedef CUresult (*PFN_cuStreamSynchronize_v2000)(CUstream hStream);
typedef CUresult (*PFN_cuStreamIsCapturing_v10000)(CUstream hStream, CUstreamCaptureStatus* captureStatus);
typedef CUresult (*PFN_cuStreamIsCapturing_v10000_ptsz)(CUstream hStream, CUstreamCaptureStatus* captureStatus);
typedef CUresult (*PFN_cuEventCreate_v2000)(CUevent* phEvent, unsigned int Flags);
typedef CUresult (*PFN_cuEventRecord_v2000)(CUevent hEvent, CUstream hStream);
typedef CUresult (*PFN_cuEventQuery_v2000)(CUevent hEvent);
typedef CUresult (*PFN_cuEventSynchronize_v2000)(CUevent hEvent);
typedef CUresult (*PFN_cuEventElapsedTime_v2000)(float* pMilliseconds, CUevent hStart, CUevent hEnd);
typedef CUresult (*PFN_cuEventElapsedTime_v12080)(float* pMilliseconds, CUevent hStart, CUevent hEnd);
typedef CUresult (*PFN_cuEventDestroy_v4000)(CUevent hEvent);

// Launches.
typedef CUresult (*PFN_cuLaunchKernel_v4000)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                             unsigned int gridDimZ, unsigned int blockDimX,
                                             unsigned int blockDimY, unsigned int blockDimZ,
                                             unsigned int sharedMemBytes, CUstream hStream,
                                             void** kernelParams, void** extra);
typedef CUresult (*PFN_cuLaunchKernel_v7000_ptsz)(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                                  unsigned int gridDimZ, unsigned int blockDimX,
                                                  unsigned int blockDimY, unsigned int blockDimZ,
                                                  unsigned int sharedMemBytes, CUstream hStream,
                                                  void** kernelParams, void** extra);
typedef CUresult (*PFN_cuLaunchKernelEx_v11060)(const CUlaunchConfig* config, CUfunction f,
                                                void** kernelParams, void** extra);
typedef CUresult (*PFN_cuLaunchKernelEx_v11060_ptsz)(const CUlaunchConfig* config, CUfunction f,
                                                     void** kernelParams, void** extra);
typedef CUresult (*PFN_cuLaunchCooperativeKernel_v9000)(CUfunction f, unsigned int gridDimX,
                                                        unsigned int gridDimY, unsigned int gridDimZ,
                                                        unsigned int blockDimX, unsigned int blockDimY,
                                                        unsigned int blockDimZ, unsigned int sharedMemBytes,
                                                        CUstream hStream, void** kernelParams);
typedef CUresult (*PFN_cuLaunchCooperativeKernel_v9000_ptsz)(CUfunction f, unsigned int gridDimX,
                                                             unsigned int gridDimY, unsigned int gridDimZ,
                                                             unsigned int blockDimX, unsigned int blockDimY,
                                                             unsigned int blockDimZ,
                                                             unsigned int sharedMemBytes, CUstream hStream,
                                                             void** kernelParams);

// Graphs and stream capture.
typedef CUresult (*PFN_cuGraphCreate_v10000)(CUgraph* phGraph, unsigned int flags);
typedef CUresult (*PFN_cuGraphAddKernelNode_v12000)(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                    const CUgraphNode* dependencies, size_t numDependencies,
                                                    const CUDA_KERNEL_NODE_PARAMS_v2* nodeParams);
typedef CUresult (*PFN_cuGraphAddMemAllocNode_v11040)(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                      const CUgraphNode* dependencies, size_t numDependencies,
                                                      CUDA_MEM_ALLOC_NODE_PARAMS* nodeParams);
typedef CUresult (*PFN_cuGraphInstantiateWithFlags_v11040)(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                           unsigned long long flags);  // NOLINT(runtime/int)
typedef CUresult (*PFN_cuGraphExecDestroy_v10000)(CUgraphExec hGraphExec);
typedef CUresult (*PFN_cuGraphDestroy_v10000)(CUgraph hGraph);
typedef CUresult (*PFN_cuGraphLaunch_v10000)(CUgraphExec hGraph, CUstream hStream);
typedef CUresult (*PFN_cuGraphLaunch_v10000_ptsz)(CUgraphExec hGraph, CUstream hStream);
typedef CUresult (*PFN_cuStreamBeginCapture_v10000)(CUstream hStream);
typedef CUresult (*PFN_cuStreamBeginCapture_v10000_ptsz)(CUstream hStream);
typedef CUresult (*PFN_cuStreamBeginCapture_v10010)(CUstream hStream, CUstreamCaptureMode mode);
typedef CUresult (*PFN_cuStreamBeginCapture_v10010_ptsz)(CUstream hStream, CUstreamCaptureMode mode);
typedef CUresult (*PFN_cuStreamEndCapture_v10000)(CUstream hStream, CUgraph* phGraph);
typedef CUresult (*PFN_cuStreamEndCapture_v10000_ptsz)(CUstream hStream, CUgraph* phGraph);

// CUDA 13 variants of functions whose signature changed: they take the context.
typedef CUresult (*PFN_cuCtxGetDevice_v13000)(CUdevice* device, CUcontext ctx);
typedef CUresult (*PFN_cuCtxSynchronize_v13000)(CUcontext ctx);

// Memory a context gains after creation: modules, libraries, limits, green contexts.
typedef CUresult (*PFN_cuModuleLoad_v2000)(CUmodule* module, const char* fname);
typedef CUresult (*PFN_cuModuleLoadDataEx_v2010)(CUmodule* module, const void* image, unsigned int numOptions,
                                                 CUjit_option* options, void** optionValues);
typedef CUresult (*PFN_cuModuleLoadFatBinary_v2000)(CUmodule* module, const void* fatCubin);
typedef CUresult (*PFN_cuLibraryLoadData_v12000)(CUlibrary* library, const void* code, CUjit_option* jitOptions,
                                                 void** jitOptionsValues, unsigned int numJitOptions,
                                                 CUlibraryOption* libraryOptions, void** libraryOptionValues,
                                                 unsigned int numLibraryOptions);
typedef CUresult (*PFN_cuLibraryLoadFromFile_v12000)(CUlibrary* library, const char* fileName,
                                                     CUjit_option* jitOptions, void** jitOptionsValues,
                                                     unsigned int numJitOptions, CUlibraryOption* libraryOptions,
                                                     void** libraryOptionValues, unsigned int numLibraryOptions);
typedef CUresult (*PFN_cuLibraryUnload_v12000)(CUlibrary library);
typedef CUresult (*PFN_cuCtxSetLimit_v3010)(CUlimit limit, size_t value);
typedef CUresult (*PFN_cuGreenCtxCreate_v12040)(CUgreenCtx* phCtx, CUdevResourceDesc desc, CUdevice dev,
                                                unsigned int flags);
typedef CUresult (*PFN_cuGreenCtxDestroy_v12040)(CUgreenCtx hCtx);

// Pools: what they keep, their release threshold, trims.
typedef CUresult (*PFN_cuMemPoolTrimTo_v11020)(CUmemoryPool pool, size_t minBytesToKeep);
typedef CUresult (*PFN_cuMemPoolSetAttribute_v11020)(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
typedef CUresult (*PFN_cuMemPoolGetAttribute_v11020)(CUmemoryPool pool, CUmemPool_attribute attr, void* value);
typedef CUresult (*PFN_cuDeviceGetMemPool_v11020)(CUmemoryPool* pool, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceGetDefaultMemPool_v11020)(CUmemoryPool* pool_out, CUdevice_v1 dev);
typedef CUresult (*PFN_cuDeviceSetMemPool_v11020)(CUdevice_v1 dev, CUmemoryPool pool);

// Graph memory: backed at launch, kept in the device's graph pool until trimmed.
typedef CUresult (*PFN_cuDeviceGraphMemTrim_v11040)(CUdevice device);
typedef CUresult (*PFN_cuDeviceGetGraphMemAttribute_v11040)(CUdevice device, CUgraphMem_attribute attr,
                                                            void* value);
typedef CUresult (*PFN_cuGraphAddMemFreeNode_v11040)(CUgraphNode* phGraphNode, CUgraph hGraph,
                                                     const CUgraphNode* dependencies, size_t numDependencies,
                                                     CUdeviceptr dptr);
typedef CUresult (*PFN_cuGraphAddNode_v12020)(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies, size_t numDependencies,
                                              CUgraphNodeParams* nodeParams);
typedef CUresult (*PFN_cuGraphAddNode_v12030)(CUgraphNode* phGraphNode, CUgraph hGraph,
                                              const CUgraphNode* dependencies, const CUgraphEdgeData* dependencyData,
                                              size_t numDependencies, CUgraphNodeParams* nodeParams);
typedef CUresult (*PFN_cuGraphGetNodes_v10000)(CUgraph hGraph, CUgraphNode* nodes, size_t* numNodes);
typedef CUresult (*PFN_cuGraphNodeGetType_v10000)(CUgraphNode hNode, CUgraphNodeType* type);
typedef CUresult (*PFN_cuGraphMemAllocNodeGetParams_v11040)(CUgraphNode hNode, CUDA_MEM_ALLOC_NODE_PARAMS* params_out);

// Pages moved onto a device.
typedef CUresult (*PFN_cuMemPrefetchAsync_v8000)(CUdeviceptr_v2 devPtr, size_t count, CUdevice_v1 dstDevice,
                                                 CUstream hStream);
typedef CUresult (*PFN_cuMemPrefetchAsync_v8000_ptsz)(CUdeviceptr_v2 devPtr, size_t count, CUdevice_v1 dstDevice,
                                                      CUstream hStream);
typedef CUresult (*PFN_cuMemPrefetchAsync_v12020)(CUdeviceptr_v2 devPtr, size_t count, CUmemLocation_v1 location,
                                                  unsigned int flags, CUstream hStream);
typedef CUresult (*PFN_cuMemPrefetchAsync_v12020_ptsz)(CUdeviceptr_v2 devPtr, size_t count,
                                                       CUmemLocation_v1 location, unsigned int flags,
                                                       CUstream hStream);
typedef CUresult (*PFN_cuMemPrefetchBatchAsync_v13000)(CUdeviceptr_v2* dptrs, size_t* sizes, size_t count,
                                                       CUmemLocation_v1* prefetchLocs, size_t* prefetchLocIdxs,
                                                       size_t numPrefetchLocs, unsigned long long flags,
                                                       CUstream hStream);
typedef CUresult (*PFN_cuMemPrefetchBatchAsync_v13000_ptsz)(CUdeviceptr_v2* dptrs, size_t* sizes, size_t count,
                                                            CUmemLocation_v1* prefetchLocs,
                                                            size_t* prefetchLocIdxs, size_t numPrefetchLocs,
                                                            unsigned long long flags, CUstream hStream);
typedef CUresult (*PFN_cuMemDiscardAndPrefetchBatchAsync_v13000)(
    CUdeviceptr_v2* dptrs, size_t* sizes, size_t count, CUmemLocation_v1* prefetchLocs, size_t* prefetchLocIdxs,
    size_t numPrefetchLocs, unsigned long long flags, CUstream hStream);
typedef CUresult (*PFN_cuMemDiscardAndPrefetchBatchAsync_v13000_ptsz)(
    CUdeviceptr_v2* dptrs, size_t* sizes, size_t count, CUmemLocation_v1* prefetchLocs, size_t* prefetchLocIdxs,
    size_t numPrefetchLocs, unsigned long long flags, CUstream hStream);
typedef CUresult (*PFN_cuMemAdvise_v8000)(CUdeviceptr_v2 devPtr, size_t count, CUmem_advise advice,
                                          CUdevice_v1 device);
typedef CUresult (*PFN_cuMemAdvise_v12020)(CUdeviceptr_v2 devPtr, size_t count, CUmem_advise advice,
                                           CUmemLocation_v1 location);

// Synchronization points (stream-ordered pools release what they keep above their threshold there).
typedef CUresult (*PFN_cuStreamSynchronize_v7000_ptsz)(CUstream hStream);

// cuGraphInstantiateWithParams' parameters (read by the driver only; opaque here).
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS;
typedef CUresult (*PFN_cuGraphInstantiateWithParams_v12000)(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                            CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams);
typedef CUresult (*PFN_cuGraphInstantiateWithParams_v12000_ptsz)(CUgraphExec* phGraphExec, CUgraph hGraph,
                                                                 CUDA_GRAPH_INSTANTIATE_PARAMS* instantiateParams);

// Capture: a capture into an existing graph, and the calling thread's capture mode.
typedef CUresult (*PFN_cuStreamBeginCaptureToGraph_v12030)(CUstream hStream, CUgraph hGraph,
                                                           const CUgraphNode* dependencies,
                                                           const CUgraphEdgeData* dependencyData,
                                                           size_t numDependencies, CUstreamCaptureMode mode);
typedef CUresult (*PFN_cuStreamBeginCaptureToGraph_v12030_ptsz)(CUstream hStream, CUgraph hGraph,
                                                                const CUgraphNode* dependencies,
                                                                const CUgraphEdgeData* dependencyData,
                                                                size_t numDependencies, CUstreamCaptureMode mode);
typedef CUresult (*PFN_cuThreadExchangeStreamCaptureMode_v10010)(CUstreamCaptureMode* mode);

}  // extern "C"

#endif  // TESSERA_HOOK_CUDA_CUDA_API_H_
