// The Prometheus text exposition format (version 0.0.4), as both binaries write it: one metric family at a
// time, with its HELP and TYPE lines before its samples, label values escaped. `promtool check metrics`
// passes on what these write (tests/metrics/promtool_check.py runs it on both binaries' /metrics).
//
//   std::string out;
//   std::string samples;
//   AppendSample(&samples, "tessera_gpu_tenants", {{"gpu", "0"}, {"UUID", uuid}}, 3);
//   AppendFamily(&out, "tessera_gpu_tenants", "Containers sharing the GPU.", "gauge", samples);
//   AppendBuildInfo(&out);   // tessera_build_info{version="0.1.0",revision="..."} 1
//
// Thread-safety: functions of their arguments only.
#ifndef TESSERA_COMMON_EXPOSITION_H_
#define TESSERA_COMMON_EXPOSITION_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

namespace tessera::exposition {

using Label = std::pair<std::string_view, std::string_view>;

// A label value as the format wants it: backslash, double quote and newline escaped.
std::string EscapeLabelValue(std::string_view value);

// `{a="x",b="y"}` (empty for no labels).
std::string LabelSet(std::initializer_list<Label> labels);

// A number as a sample value: integers exactly, other values with up to 6 significant decimals.
std::string FormatValue(double value);
std::string FormatValue(uint64_t value);
std::string FormatValue(int64_t value);
inline std::string FormatValue(int value) {
  return FormatValue(static_cast<int64_t>(value));
}

// `name{labels} value\n` onto `out`.
void AppendSample(std::string* out, std::string_view name, std::string_view label_set,
                  std::string_view value);
template <typename T>
void AppendSample(std::string* out, std::string_view name, std::initializer_list<Label> labels, T value) {
  AppendSample(out, name, LabelSet(labels), FormatValue(value));
}

// One family: `# HELP name help`, `# TYPE name type`, then `samples` (lines written by AppendSample for this
// name; empty is allowed: the family is declared with no series).
void AppendFamily(std::string* out, std::string_view name, std::string_view help, std::string_view type,
                  std::string_view samples);

// tessera_build_info{version="<project version>",revision="<git commit the build was configured at, or
// unknown>"} 1
void AppendBuildInfo(std::string* out);
std::string_view Version();
std::string_view Revision();

}  // namespace tessera::exposition

#endif  // TESSERA_COMMON_EXPOSITION_H_
