#include "gpu/nvml_library.h"

#include <dlfcn.h>

#include <vector>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera::gpu {

namespace {

const char* ReturnName(nvmlReturn_t r) {
  switch (r) {
    case NVML_SUCCESS:
      return "NVML_SUCCESS";
    case NVML_ERROR_UNINITIALIZED:
      return "NVML_ERROR_UNINITIALIZED";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "NVML_ERROR_INVALID_ARGUMENT";
    case NVML_ERROR_NOT_SUPPORTED:
      return "NVML_ERROR_NOT_SUPPORTED";
    case NVML_ERROR_NO_PERMISSION:
      return "NVML_ERROR_NO_PERMISSION";
    case NVML_ERROR_NOT_FOUND:
      return "NVML_ERROR_NOT_FOUND";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "NVML_ERROR_INSUFFICIENT_SIZE";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "NVML_ERROR_DRIVER_NOT_LOADED";
    case NVML_ERROR_TIMEOUT:
      return "NVML_ERROR_TIMEOUT";
    case NVML_ERROR_GPU_IS_LOST:
      return "NVML_ERROR_GPU_IS_LOST";
    case NVML_ERROR_RESET_REQUIRED:
      return "NVML_ERROR_RESET_REQUIRED";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH:
      return "NVML_ERROR_LIB_RM_VERSION_MISMATCH";
    case NVML_ERROR_UNKNOWN:
      return "NVML_ERROR_UNKNOWN";
    default:
      return "NVML error";
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<NvmlLibrary>> NvmlLibrary::Load(const std::string& library) {
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* err = dlerror();
    return absl::FailedPreconditionError(
        StrCat("cannot load NVML from ", library, ": ", err != nullptr ? err : "unknown dlopen error",
               "; on a GPU node install the NVIDIA driver and run tessera-node with the NVIDIA container runtime "
               "(or mount the driver's libnvidia-ml.so.1), or run it with --fake-gpus FILE to use fake GPUs"));
  }
  std::unique_ptr<NvmlLibrary> lib(new NvmlLibrary());
  lib->handle_ = handle;
  lib->path_ = library;
  std::vector<std::string> missing;
#define TESSERA_NVML_RESOLVE(name, required)                                          \
  lib->api_.name = reinterpret_cast<decltype(&::name)>(dlsym(handle, #name));          \
  if (lib->api_.name == nullptr && (required)) missing.push_back(#name);
  TESSERA_NVML_SYMBOLS(TESSERA_NVML_RESOLVE)
#undef TESSERA_NVML_RESOLVE
  if (!missing.empty()) {
    return absl::FailedPreconditionError(StrCat(
        "NVML library ", library, " lacks ", StrJoin(missing, ", "),
        "; the NVIDIA driver is too old (tessera-node needs driver 450 or newer) or the file is not NVML"));
  }
  nvmlReturn_t r = lib->api_.nvmlInit_v2();
  if (r != NVML_SUCCESS) {
    return absl::FailedPreconditionError(
        StrCat("nvmlInit_v2 failed: ", lib->ErrorString(r),
               "; check that the NVIDIA kernel driver is loaded (nvidia-smi works on the host) and that "
               "/dev/nvidia* are visible to tessera-node"));
  }
  lib->initialized_ = true;
  return lib;
}

NvmlLibrary::~NvmlLibrary() {
  if (initialized_) {
    api_.nvmlShutdown();
    // The library stays mapped once initialized: NVML may keep threads that outlive nvmlShutdown, and
    // unmapping their code would crash them.
  } else if (handle_ != nullptr) {
    dlclose(handle_);
  }
}

std::string NvmlLibrary::ErrorString(nvmlReturn_t r) const {
  const char* text = api_.nvmlErrorString != nullptr ? api_.nvmlErrorString(r) : nullptr;
  return StrCat(ReturnName(r), " (", static_cast<int>(r), ")", text != nullptr ? StrCat(": ", text) : "");
}

}  // namespace tessera::gpu
