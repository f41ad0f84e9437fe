// The fake CUDA driver and NVML (tools/fakecuda) called directly, without the hook: an entry point given a
// null out-pointer answers CUDA_ERROR_INVALID_VALUE (NVML: NVML_ERROR_INVALID_ARGUMENT) as the real ones do,
// instead of crashing the test program; arrays take the device memory cuda.h's contract gives them. Loaded
// with dlopen, as programs reach the real driver.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "hook/cuda/cuda_api.h"
#include "hook/cuda/nvml_types.h"

namespace {

class FakeDriverTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // A state file of this test's own: the fake's memory ledger is shared through it.
    state_ = ::testing::TempDir() + "fake-driver-test-" + std::to_string(getpid()) + ".state";
    setenv("FAKECUDA_STATE", state_.c_str(), 1);
    cuda_ = dlopen(TESSERA_BINARY_DIR "/fakecuda/libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    nvml_ = dlopen(TESSERA_BINARY_DIR "/fakecuda/libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  }
  static void TearDownTestSuite() { unlink(state_.c_str()); }

  template <typename F>
  static F Cuda(const char* name) {
    void* f = cuda_ != nullptr ? dlsym(cuda_, name) : nullptr;
    EXPECT_NE(f, nullptr) << name;
    return reinterpret_cast<F>(f);
  }
  template <typename F>
  static F* Nvml(const char* name) {
    void* f = nvml_ != nullptr ? dlsym(nvml_, name) : nullptr;
    EXPECT_NE(f, nullptr) << name;
    return reinterpret_cast<F*>(f);
  }
  // An initialized driver with a current context: what a tenant has when it calls cuMemAlloc(NULL, n).
  void SetUp() override {
    ASSERT_NE(cuda_, nullptr) << dlerror();
    ASSERT_NE(nvml_, nullptr) << dlerror();
    ASSERT_EQ(Cuda<PFN_cuInit_v2000>("cuInit")(0), CUDA_SUCCESS);
    CUcontext ctx = nullptr;
    ASSERT_EQ(Cuda<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain")(&ctx, 0), CUDA_SUCCESS);
    ASSERT_EQ(Cuda<PFN_cuCtxSetCurrent_v4000>("cuCtxSetCurrent")(ctx), CUDA_SUCCESS);
  }

  static inline std::string state_;
  static inline void* cuda_ = nullptr;
  static inline void* nvml_ = nullptr;
};

TEST_F(FakeDriverTest, MemoryEntryPointsRefuseANullPointer) {
  EXPECT_EQ(Cuda<PFN_cuMemAlloc_v3020>("cuMemAlloc_v2")(nullptr, 1 << 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemAlloc_v2000>("cuMemAlloc")(nullptr, 1 << 20), CUDA_ERROR_INVALID_VALUE);
  size_t pitch = 0;
  CUdeviceptr ptr = 0;
  EXPECT_EQ(Cuda<PFN_cuMemAllocPitch_v3020>("cuMemAllocPitch_v2")(nullptr, &pitch, 256, 4, 4),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemAllocPitch_v3020>("cuMemAllocPitch_v2")(&ptr, nullptr, 256, 4, 4),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemAllocManaged_v6000>("cuMemAllocManaged")(nullptr, 1 << 20, 1),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemAllocHost_v3020>("cuMemAllocHost_v2")(nullptr, 1 << 20), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemAllocAsync_v11020>("cuMemAllocAsync")(nullptr, 1 << 20, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  size_t free = 0;
  EXPECT_EQ(Cuda<PFN_cuMemGetInfo_v3020>("cuMemGetInfo_v2")(&free, nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuMemGetInfo_v3020>("cuMemGetInfo_v2")(nullptr, &free), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuDeviceTotalMem_v3020>("cuDeviceTotalMem_v2")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  // Nothing was charged by the refused calls, and a good call still works.
  ASSERT_EQ(Cuda<PFN_cuMemAlloc_v3020>("cuMemAlloc_v2")(&ptr, 1 << 20), CUDA_SUCCESS);
  EXPECT_NE(ptr, 0u);
}

TEST_F(FakeDriverTest, OtherEntryPointsRefuseANullPointer) {
  EXPECT_EQ(Cuda<PFN_cuDriverGetVersion_v2020>("cuDriverGetVersion")(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuDeviceGetCount_v2000>("cuDeviceGetCount")(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuDeviceGet_v2000>("cuDeviceGet")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuDeviceGetAttribute_v2000>("cuDeviceGetAttribute")(
                nullptr, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuDevicePrimaryCtxRetain_v7000>("cuDevicePrimaryCtxRetain")(nullptr, 0),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuCtxGetCurrent_v4000>("cuCtxGetCurrent")(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuCtxGetDevice_v2000>("cuCtxGetDevice")(nullptr), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuStreamCreate_v2000>("cuStreamCreate")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuEventCreate_v2000>("cuEventCreate")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuModuleLoadData_v2000>("cuModuleLoadData")(nullptr, "image"), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuGraphCreate_v10000>("cuGraphCreate")(nullptr, 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Cuda<PFN_cuGetErrorString_v6000>("cuGetErrorString")(CUDA_SUCCESS, nullptr),
            CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(
      Cuda<PFN_cuGetProcAddress_v12000>("cuGetProcAddress_v2")("cuMemAlloc", nullptr, 12000, 0, nullptr),
      CUDA_ERROR_INVALID_VALUE);
}

// Device memory taken by creating an array, by cuMemGetInfo before and after.
class FakeArrayTest : public FakeDriverTest {
 protected:
  uint64_t Free() {
    size_t free = 0;
    size_t total = 0;
    EXPECT_EQ(Cuda<PFN_cuMemGetInfo_v3020>("cuMemGetInfo_v2")(&free, &total), CUDA_SUCCESS);
    return free;
  }
  // What cuArray3DCreate_v2 (levels 0) or cuMipmappedArrayCreate takes; the result in `r`.
  uint64_t Taken(CUDA_ARRAY3D_DESCRIPTOR d, unsigned levels, CUresult* r) {
    const uint64_t before = Free();
    if (levels == 0) {
      CUarray a = nullptr;
      *r = Cuda<PFN_cuArray3DCreate_v3020>("cuArray3DCreate_v2")(&a, &d);
    } else {
      CUmipmappedArray a = nullptr;
      *r = Cuda<PFN_cuMipmappedArrayCreate_v5000>("cuMipmappedArrayCreate")(&a, &d, levels);
    }
    return before - Free();
  }
};

// cuda.h: an array element is NumChannels (1, 2 or 4) components of its CU_AD_FORMAT_*'s size; a mipmapped
// array holds levels whose extents halve (rounded down, at least 1) per dimension, the levels clamped to
// 1 + floor(log2(largest extent)) (cudaMallocMipmappedArray). The fake takes exactly the elements, the least
// a real driver takes (the old fake took 4 bytes per component whatever the format, and a mipmapped array as
// twice its level 0).
TEST_F(FakeArrayTest, ArraysTakeTheirElementsAndMipmapsTheSumOfTheirLevels) {
  CUresult r = CUDA_ERROR_UNKNOWN;
  EXPECT_EQ(Taken({1000, 10, 0, CU_AD_FORMAT_UNSIGNED_INT8, 1, 0}, 0, &r), 10000u);
  EXPECT_EQ(r, CUDA_SUCCESS);
  EXPECT_EQ(Taken({64, 64, 0, CU_AD_FORMAT_HALF, 2, 0}, 0, &r), 64u * 64 * 2 * 2);
  EXPECT_EQ(Taken({32, 32, 8, CU_AD_FORMAT_FLOAT, 4, 0}, 0, &r), 32u * 32 * 8 * 16);
  EXPECT_EQ(Taken({512, 0, 0, CU_AD_FORMAT_SIGNED_INT16, 1, 0}, 0, &r), 1024u);  // 1D: Height 0
  // 256x256 floats, 9 levels: 4 x (256^2 + 128^2 + ... + 1^2) = 4 x 87381; 20 levels asked are 9.
  EXPECT_EQ(Taken({256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0}, 9, &r), 4u * 87381);
  EXPECT_EQ(Taken({256, 256, 0, CU_AD_FORMAT_FLOAT, 1, 0}, 20, &r), 4u * 87381);
  // 16x4x2 uint8 x 2, 3D, 3 levels: 16x4x2 + 8x2x1 + 4x1x1 elements of 2 bytes.
  EXPECT_EQ(Taken({16, 4, 2, CU_AD_FORMAT_UNSIGNED_INT8, 2, 0}, 3, &r), 2u * (128 + 16 + 4));
  // Layered: the layers are not halved (8x8 x 3 layers, 2 levels).
  EXPECT_EQ(Taken({8, 8, 3, CU_AD_FORMAT_UNSIGNED_INT8, 1, CUDA_ARRAY3D_LAYERED}, 2, &r), 3u * (64 + 16));
  EXPECT_EQ(r, CUDA_SUCCESS);
  // Three channels, or no width, are not an array.
  EXPECT_EQ(Taken({64, 64, 0, CU_AD_FORMAT_FLOAT, 3, 0}, 0, &r), 0u);
  EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(Taken({0, 64, 0, CU_AD_FORMAT_FLOAT, 1, 0}, 1, &r), 0u);
  EXPECT_EQ(r, CUDA_ERROR_INVALID_VALUE);
}

TEST_F(FakeDriverTest, NvmlRefusesANullPointer) {
  ASSERT_EQ(Nvml<nvmlInit_fn>("nvmlInit_v2")(), NVML_SUCCESS);
  EXPECT_EQ(Nvml<nvmlDeviceGetCount_fn>("nvmlDeviceGetCount_v2")(nullptr), NVML_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(Nvml<nvmlDeviceGetHandleByIndex_fn>("nvmlDeviceGetHandleByIndex_v2")(0, nullptr),
            NVML_ERROR_INVALID_ARGUMENT);
  nvmlDevice_t d = nullptr;
  EXPECT_EQ(Nvml<nvmlDeviceGetHandleByUUID_fn>("nvmlDeviceGetHandleByUUID")(nullptr, &d),
            NVML_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(Nvml<nvmlDeviceGetHandleByIndex_fn>("nvmlDeviceGetHandleByIndex_v2")(0, &d), NVML_SUCCESS);
  EXPECT_EQ(Nvml<nvmlDeviceGetUUID_fn>("nvmlDeviceGetUUID")(d, nullptr, 80), NVML_ERROR_INVALID_ARGUMENT);
}

}  // namespace
