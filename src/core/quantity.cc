#include "core/quantity.h"

#include <cctype>
#include <limits>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera::core {

namespace {

__extension__ using uint128 = unsigned __int128;

absl::Status Bad(std::string_view text, std::string_view why) {
  return absl::InvalidArgumentError(
      StrCat("\"", text, "\" is not a quantity: ", why, " (write a number such as 2, 500m, 1.5 or 4Gi)"));
}

// value = mantissa (digits, with `frac_digits` of them after the point) x base^exp10 x 2^exp2, in
// thousandths.
absl::StatusOr<int64_t> Scale(std::string_view text, uint128 mantissa, int frac_digits, int exp10, int exp2,
                              bool negative) {
  // Work in thousandths: multiply by 10^(3 + exp10 - frac_digits) and 2^exp2, rounding up a remainder.
  int shift10 = 3 + exp10 - frac_digits;
  uint128 v = mantissa;
  const uint128 limit = static_cast<uint128>(std::numeric_limits<int64_t>::max());
  for (int i = 0; i < exp2; ++i) {
    v <<= 1;
    if (v > limit) return Bad(text, "it is too large");
  }
  for (; shift10 > 0; --shift10) {
    v *= 10;
    if (v > limit) return Bad(text, "it is too large");
  }
  bool remainder = false;
  for (; shift10 < 0; ++shift10) {
    if (v % 10 != 0) remainder = true;
    v /= 10;
  }
  if (remainder) v += 1;  // Kubernetes rounds up what milli cannot hold
  if (v > limit) return Bad(text, "it is too large");
  int64_t out = static_cast<int64_t>(v);
  return negative ? -out : out;
}

}  // namespace

absl::StatusOr<K8sQuantity> ParseQuantity(std::string_view text) {
  std::string_view t = StripWhitespace(text);
  if (t.empty()) return Bad(text, "it is empty");
  size_t i = 0;
  bool negative = false;
  if (t[i] == '+' || t[i] == '-') {
    negative = t[i] == '-';
    ++i;
  }
  uint128 mantissa = 0;
  int digits = 0;
  int frac_digits = 0;
  bool point = false;
  for (; i < t.size(); ++i) {
    char c = t[i];
    if (c == '.') {
      if (point) return Bad(text, "it has two decimal points");
      point = true;
      continue;
    }
    if (!std::isdigit(static_cast<unsigned char>(c))) break;
    if (digits >= 30) return Bad(text, "it has too many digits");
    mantissa = mantissa * 10 + static_cast<unsigned>(c - '0');
    ++digits;
    if (point) ++frac_digits;
  }
  if (digits == 0) return Bad(text, "it does not start with a number");
  std::string_view suffix = t.substr(i);
  int exp10 = 0;
  int exp2 = 0;
  if (suffix.empty()) {
  } else if (suffix == "Ki") {
    exp2 = 10;
  } else if (suffix == "Mi") {
    exp2 = 20;
  } else if (suffix == "Gi") {
    exp2 = 30;
  } else if (suffix == "Ti") {
    exp2 = 40;
  } else if (suffix == "Pi") {
    exp2 = 50;
  } else if (suffix == "Ei") {
    exp2 = 60;
  } else if (suffix == "n") {
    exp10 = -9;
  } else if (suffix == "u") {
    exp10 = -6;
  } else if (suffix == "m") {
    exp10 = -3;
  } else if (suffix == "k") {
    exp10 = 3;
  } else if (suffix == "M") {
    exp10 = 6;
  } else if (suffix == "G") {
    exp10 = 9;
  } else if (suffix == "T") {
    exp10 = 12;
  } else if (suffix == "P") {
    exp10 = 15;
  } else if (suffix == "E") {
    exp10 = 18;
  } else if ((suffix[0] == 'e' || suffix[0] == 'E') && suffix.size() > 1 &&
             ParseInt(suffix.substr(1), &exp10) && exp10 >= -30 && exp10 <= 30) {
  } else {
    return Bad(text, StrCat("unknown suffix \"", suffix, "\""));
  }
  absl::StatusOr<int64_t> milli = Scale(text, mantissa, frac_digits, exp10, exp2, negative);
  if (!milli.ok()) return milli.status();
  return K8sQuantity{*milli, std::string(suffix)};
}

}  // namespace tessera::core
