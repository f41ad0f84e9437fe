// Helpers shared by the fuzz targets (fuzz/README.md).
#ifndef TESSERA_FUZZ_FUZZ_UTIL_H_
#define TESSERA_FUZZ_FUZZ_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tessera::fuzz {

inline std::string_view Text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// Splits the input into lines (the last one may lack its newline).
inline std::vector<std::string_view> Lines(std::string_view text) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    out.push_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return out;
}

// "key=value" -> {key, value}; no '=' -> {line, ""}.
inline std::pair<std::string, std::string> KeyValue(std::string_view line) {
  const size_t eq = line.find('=');
  if (eq == std::string_view::npos) return {std::string(line), ""};
  return {std::string(line.substr(0, eq)), std::string(line.substr(eq + 1))};
}

}  // namespace tessera::fuzz

#endif  // TESSERA_FUZZ_FUZZ_UTIL_H_
