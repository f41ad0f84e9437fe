// The facts of cuda_api_facts.inc as Tessera's cuda_api.h declares them.
#include <cstddef>
#include <cstdint>
#include <typeinfo>

#include "hook/cuda/cuda_api.h"
#include "hook/cuda_api_facts.h"

namespace tessera::testing {

std::map<std::string, std::string> OurCudaFacts() {
  std::map<std::string, std::string> facts;
#define FACT_SIZE(t) facts["sizeof(" #t ")"] = std::to_string(sizeof(t));
#define FACT_OFFSET(t, m) facts["offsetof(" #t ", " #m ")"] = std::to_string(offsetof(t, m));
#define FACT_VALUE(v) facts[#v] = std::to_string(static_cast<long long>(v));
#define FACT_PFN(t) facts[#t] = typeid(t).name();
#include "hook/cuda_api_facts.inc"
  return facts;
}

}  // namespace tessera::testing
