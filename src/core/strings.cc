#include "core/strings.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace tessera {

namespace strings_internal {

void Append(std::string& out, double v) {
  char buf[32];
  int n = std::snprintf(buf, sizeof(buf), "%.6g", v);
  out.append(buf, static_cast<size_t>(n));
}

}  // namespace strings_internal

std::vector<std::string_view> StrSplit(std::string_view text, char sep) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    size_t pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      out.push_back(text.substr(start));
      return out;
    }
    out.push_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::vector<std::string_view> SplitAny(std::string_view text, std::string_view seps) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && seps.find(text[i]) != std::string_view::npos) ++i;
    size_t start = i;
    while (i < text.size() && seps.find(text[i]) == std::string_view::npos) ++i;
    if (i > start) out.push_back(text.substr(start, i - start));
  }
  return out;
}

std::string_view StripWhitespace(std::string_view text) {
  size_t b = 0;
  size_t e = text.size();
  while (b < e && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
  return text.substr(b, e - b);
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

std::string AsciiLower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string AsciiUpper(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

namespace {

template <typename T>
bool ParseWhole(std::string_view text, T* out) {
  if (text.empty()) return false;
  const char* begin = text.data();
  const char* end = begin + text.size();
  if (*begin == '+') ++begin;  // from_chars does not take '+'
  auto r = std::from_chars(begin, end, *out);
  return r.ec == std::errc() && r.ptr == end && begin != end;
}

}  // namespace

bool ParseInt(std::string_view text, int* out) {
  return ParseWhole(text, out);
}
bool ParseInt(std::string_view text, int64_t* out) {
  return ParseWhole(text, out);
}

}  // namespace tessera
