// Kubernetes resource quantities ("500m", "4Gi", "2", "1.5", "1e3"), as the API server accepts them.
//
//   absl::StatusOr<K8sQuantity> q = ParseQuantity("4Gi");
//   q->milli   == 4294967296000     // the value in thousandths
//   q->suffix  == "Gi"
//
// Thread-safety: pure functions.
#ifndef TESSERA_CORE_QUANTITY_H_
#define TESSERA_CORE_QUANTITY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::core {

struct K8sQuantity {
  int64_t milli = 0;   // value x 1000, rounded up (as Kubernetes rounds sub-milli quantities)
  std::string suffix;  // "", "m", "k", "Ki", "Mi", "Gi", "e3", ...

  bool IsInteger() const { return milli % 1000 == 0; }
  int64_t Ceil() const { return milli / 1000 + (milli % 1000 > 0 ? 1 : 0); }
};

// Parses a quantity in Kubernetes' syntax: an optionally signed decimal number, then one of the binary
// suffixes (Ki Mi Gi Ti Pi Ei), the decimal suffixes (n u m k M G T P E) or an exponent (e3, E-2).
// Errors say what was wrong. Values beyond 2^63 thousandths are refused.
absl::StatusOr<K8sQuantity> ParseQuantity(std::string_view text);

}  // namespace tessera::core

#endif  // TESSERA_CORE_QUANTITY_H_
