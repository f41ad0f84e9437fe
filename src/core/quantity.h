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
#include <limits>
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

// Sums and products of quantities that cannot wrap: past the largest int64 they stay there (and below the
// smallest, there), so a total that is too large stays too large for every node instead of wrapping to a
// small number that fits (17 containers each under a cap once summed past 2^64 to one core). Callers compare
// the result with their own cap and refuse with a message.
constexpr int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) {
    return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
  }
  return out;
}
constexpr int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) {
    return (a < 0) != (b < 0) ? std::numeric_limits<int64_t>::min() : std::numeric_limits<int64_t>::max();
  }
  return out;
}

}  // namespace tessera::core

#endif  // TESSERA_CORE_QUANTITY_H_
