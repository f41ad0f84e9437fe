// The admission webhook (mutate and validate) on arbitrary AdmissionReview bodies: what the API server
// relays from anyone who may create pods. Answers must be JSON; nothing may crash or throw.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "scheduler/admission.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tessera::scheduler::Admission* admission =
      new tessera::scheduler::Admission({"tessera-scheduler", {}});
  const std::string_view body = tessera::fuzz::Text(data, size);
  for (const tessera::scheduler::Response& r : {admission->Mutate(body), admission->Validate(body)}) {
    if (!nlohmann::json::accept(r.body)) __builtin_trap();
  }
  return 0;
}
