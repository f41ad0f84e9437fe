// The registration protocol's lines: HELLO from a tenant's process (untrusted), and the agent's answers as a
// hook parses them.
#include "fuzz_util.h"
#include "hook/common/registration.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tessera::fuzz::Text(data, size);
  tessera::hook::Hello hello;
  tessera::hook::AgentMessage message;
  tessera::hook::Error error;
  (void)tessera::hook::ParseHello(text.data(), text.size(), &hello, &error);
  (void)tessera::hook::ParseAgentMessage(text.data(), text.size(), &message, &error);
  return 0;
}
