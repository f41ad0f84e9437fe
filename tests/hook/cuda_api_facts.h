// Collects the facts of tests/hook/cuda_api_facts.inc from one set of CUDA declarations: Tessera's cuda_api.h
// (cuda_api_ours.cc) or the toolkit's cuda.h (cuda_api_toolkit.cc, when one is installed).
//
//   std::map<std::string, std::string> ours = tessera::testing::OurCudaFacts();
//
// Thread-safety: pure functions.
#ifndef TESSERA_TESTS_HOOK_CUDA_API_FACTS_H_
#define TESSERA_TESTS_HOOK_CUDA_API_FACTS_H_

#include <map>
#include <string>

namespace tessera::testing {

// Fact name ("sizeof(CUuuid)", "CUDA_ERROR_OUT_OF_MEMORY", "PFN_cuMemAlloc_v3020") -> value as text.
std::map<std::string, std::string> OurCudaFacts();
// Empty when the toolkit's cuda.h was not found at build time.
std::map<std::string, std::string> ToolkitCudaFacts();

}  // namespace tessera::testing

#endif  // TESSERA_TESTS_HOOK_CUDA_API_FACTS_H_
