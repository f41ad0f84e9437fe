// The limits file the hooks read (written by the agent; a container user may point TESSERA_LIMITS_FILE
// anywhere). Whatever parses must validate or be refused, never crash.
#include "fuzz_util.h"
#include "hook/common/base.h"
#include "hook/common/limits.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(tessera::fuzz::Text(data, size));
  tessera::hook::Limits limits;
  tessera::hook::Error error;
  if (tessera::hook::ParseLimits(text.data(), text.size(), &limits, &error)) {
    (void)tessera::hook::ValidateLimits(limits, &error);
  }
  uint64_t bytes = 0;
  (void)tessera::hook::ParseByteSize(text.c_str(), &bytes);
  return 0;
}
