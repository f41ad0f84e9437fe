// NVML loaded at run time: dlopen("libnvidia-ml.so.1") and the symbols of nvml_api.h looked up one by one.
//
//   absl::StatusOr<std::unique_ptr<NvmlLibrary>> nvml = NvmlLibrary::Load();        // or Load("/path/to.so")
//   if (!nvml.ok()) ...                              // "cannot load NVML from libnvidia-ml.so.1: ... ; ..."
//   unsigned int n = 0;
//   (*nvml)->api().nvmlDeviceGetCount_v2(&n);
//
// Load() also calls nvmlInit_v2 and the destructor nvmlShutdown, so a loaded library is ready to query.
// Errors say what is missing and what to do (install the driver, run with the NVIDIA runtime, or use a
// fake-GPU file).
//
// Thread-safety: api() may be used from any thread (NVML is thread-safe once initialized).
#ifndef TESSERA_GPU_NVML_LIBRARY_H_
#define TESSERA_GPU_NVML_LIBRARY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "gpu/nvml_api.h"

namespace tessera::gpu {

inline constexpr char kDefaultNvmlLibrary[] = "libnvidia-ml.so.1";

// Pointers to the NVML functions tessera-node uses; optional ones may be null.
struct NvmlApi {
#define TESSERA_NVML_POINTER(name, required) decltype(&::name) name = nullptr;
  TESSERA_NVML_SYMBOLS(TESSERA_NVML_POINTER)
#undef TESSERA_NVML_POINTER
};

class NvmlLibrary {
 public:
  // Loads the library (a name searched by the dynamic loader, or a path), resolves the symbols and
  // initializes NVML.
  static absl::StatusOr<std::unique_ptr<NvmlLibrary>> Load(const std::string& library = kDefaultNvmlLibrary);
  ~NvmlLibrary();
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  const NvmlApi& api() const { return api_; }
  const std::string& path() const { return path_; }
  // "NVML_ERROR_GPU_IS_LOST (15): GPU is lost" style text for a return code.
  std::string ErrorString(nvmlReturn_t r) const;

 private:
  NvmlLibrary() = default;
  void* handle_ = nullptr;
  bool initialized_ = false;
  std::string path_;
  NvmlApi api_;
};

}  // namespace tessera::gpu

#endif  // TESSERA_GPU_NVML_LIBRARY_H_
