// The facts of cuda_api_facts.inc as the CUDA toolkit's cuda.h declares them, when the build found one
// (TESSERA_HAVE_CUDA_H; the toolkit is not needed to build or test Tessera).
#include <cstddef>
#include <cstdint>
#include <typeinfo>

#include "hook/cuda_api_facts.h"

#if defined(TESSERA_HAVE_CUDA_H)
#define __CUDA_API_VERSION_INTERNAL 1  // every versioned entry point and structure under its own name
#include <cuda.h>
#include <cudaTypedefs.h>
#endif

namespace tessera::testing {

std::map<std::string, std::string> ToolkitCudaFacts() {
  std::map<std::string, std::string> facts;
#if defined(TESSERA_HAVE_CUDA_H)
#define FACT_SIZE(t) facts["sizeof(" #t ")"] = std::to_string(sizeof(t));
#define FACT_OFFSET(t, m) facts["offsetof(" #t ", " #m ")"] = std::to_string(offsetof(t, m));
#define FACT_VALUE(v) facts[#v] = std::to_string(static_cast<long long>(v));
#define FACT_PFN(t) facts[#t] = typeid(t).name();
#include "hook/cuda_api_facts.inc"
#endif
  return facts;
}

}  // namespace tessera::testing
