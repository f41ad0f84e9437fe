// The fake CUDA driver and NVML (tools/fakecuda) called directly, without the hook: an entry point given a
// null out-pointer answers CUDA_ERROR_INVALID_VALUE (NVML: NVML_ERROR_INVALID_ARGUMENT) as the real ones do,
// instead of crashing the test program. Loaded with dlopen, as programs reach the real driver.
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
