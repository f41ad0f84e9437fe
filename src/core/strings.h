// Small string helpers for building messages and reading text.
//
// Debian's abseil is built with its own absl::string_view (not std::string_view), so its string functions do
// not take the std::string_view this project uses everywhere; these few helpers stand in for them.
//
//   std::string m = StrCat("GPU ", 3, " has ", 2048, " MiB free");
//   std::vector<std::string_view> parts = StrSplit("a,b,,c", ',');        // {"a", "b", "", "c"}
//   int n = 0; bool ok = ParseInt(" 42", &n);                            // false: no whitespace allowed
//
// Thread-safety: pure functions.
#ifndef TESSERA_CORE_STRINGS_H_
#define TESSERA_CORE_STRINGS_H_

#include <charconv>
#include <concepts>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace tessera {

namespace strings_internal {

inline void Append(std::string& out, std::string_view s) {
  out.append(s);
}
inline void Append(std::string& out, const char* s) {
  out.append(s);
}
inline void Append(std::string& out, const std::string& s) {
  out.append(s);
}
inline void Append(std::string& out, char c) {
  out.push_back(c);
}
inline void Append(std::string& out, absl::string_view s) {
  out.append(s.data(), s.size());
}
template <std::integral T>
requires(!std::same_as<T, char> && !std::same_as<T, bool>) void Append(std::string& out, T v) {
  char buf[24];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  out.append(buf, r.ptr);
}
void Append(std::string& out, double v);

}  // namespace strings_internal

// Concatenates strings, characters and integers (and doubles, to 6 significant digits).
template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (strings_internal::Append(out, args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (strings_internal::Append(*out, args), ...);
}

// Joins the elements of a range of strings (or string_views) with a separator.
template <typename Range>
std::string StrJoin(const Range& range, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& item : range) {
    if (!first) out.append(sep);
    first = false;
    strings_internal::Append(out, item);
  }
  return out;
}

// Splits at every `sep`; empty pieces are kept.
std::vector<std::string_view> StrSplit(std::string_view text, char sep);
// Splits at any run of the characters in `seps`; empty pieces are dropped.
std::vector<std::string_view> SplitAny(std::string_view text, std::string_view seps);

std::string_view StripWhitespace(std::string_view text);
std::string AsciiLower(std::string_view text);
// Whether two strings are equal ignoring ASCII case (Go's encoding/json matches field names so).
bool EqualsIgnoreCase(std::string_view a, std::string_view b);
std::string AsciiUpper(std::string_view text);

// Parses a whole string as a decimal integer (optional leading '-'), nothing else allowed.
bool ParseInt(std::string_view text, int* out);
bool ParseInt(std::string_view text, int64_t* out);

// A Status's message as a std::string (absl's message() is an absl::string_view).
inline std::string Message(const absl::Status& s) {
  return std::string(s.message());
}

}  // namespace tessera

#endif  // TESSERA_CORE_STRINGS_H_
