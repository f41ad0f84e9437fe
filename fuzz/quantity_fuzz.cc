// Kubernetes quantities ("500m", "4Gi", "1e3", "-0.5E-2"): parsed without overflow or a crash.
#include "core/quantity.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::StatusOr<tessera::core::K8sQuantity> q =
      tessera::core::ParseQuantity(tessera::fuzz::Text(data, size));
  if (q.ok()) (void)q->Ceil();
  return 0;
}
