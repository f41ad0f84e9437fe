// The tessera.dev/assignment annotation (anyone with patch rights on pods writes it): parsed, and what
// parses must survive a round trip.
#include "formats/assignment.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<tessera::formats::Assignment> a =
      tessera::formats::ParseAssignment(tessera::fuzz::Text(data, size));
  if (!a.ok()) return 0;
  const std::string again = tessera::formats::FormatAssignment(tessera::formats::ToPlacement(*a));
  if (!tessera::formats::ParseAssignment(again).ok()) __builtin_trap();
  return 0;
}
