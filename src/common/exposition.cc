#include "common/exposition.h"

#include <cmath>
#include <cstdio>

#include "core/strings.h"

#ifndef TESSERA_VERSION
#error "TESSERA_VERSION must be defined (src/CMakeLists.txt)"
#endif
#ifndef TESSERA_REVISION
#define TESSERA_REVISION "unknown"
#endif

namespace tessera::exposition {

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string LabelSet(std::initializer_list<Label> labels) {
  if (labels.size() == 0) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out += ',';
    first = false;
    StrAppend(&out, name, "=\"", EscapeLabelValue(value), "\"");
  }
  out += '}';
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return StrCat(static_cast<int64_t>(value));
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.6g", value);
  return buf;
}

std::string FormatValue(uint64_t value) {
  return StrCat(value);
}
std::string FormatValue(int64_t value) {
  return StrCat(value);
}

void AppendSample(std::string* out, std::string_view name, std::string_view label_set,
                  std::string_view value) {
  StrAppend(out, name, label_set, " ", value, "\n");
}

void AppendFamily(std::string* out, std::string_view name, std::string_view help, std::string_view type,
                  std::string_view samples) {
  // HELP text escapes backslash and newline (the format's rule for docstrings).
  std::string escaped;
  for (char c : help) {
    if (c == '\\') {
      escaped += "\\\\";
    } else if (c == '\n') {
      escaped += "\\n";
    } else {
      escaped += c;
    }
  }
  StrAppend(out, "# HELP ", name, " ", escaped, "\n# TYPE ", name, " ", type, "\n", samples);
}

std::string_view Version() {
  return TESSERA_VERSION;
}
std::string_view Revision() {
  return TESSERA_REVISION;
}

void AppendBuildInfo(std::string* out) {
  std::string samples;
  AppendSample(&samples, "tessera_build_info", {{"version", Version()}, {"revision", Revision()}}, 1);
  AppendFamily(
      out, "tessera_build_info",
      "Always 1; the labels say which Tessera build this is (version, and the git commit it was built "
      "from).",
      "gauge", samples);
}

}  // namespace tessera::exposition
