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
#include <deque>
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

// A family whose name, help and type are said once, with the samples added through it. Families keeps a set
// of them in the order they were added and writes them in that order, so no list of names, help texts and
// sample buffers is kept in step by index:
//
//   Families families;
//   Family& used = families.Add("tessera_gpu_memory_used_bytes", "GPU memory held on the GPU.", "gauge");
//   used.Add(labels, FormatValue(bytes));                 // once per series
//   families.AppendTo(&out);
//
// name, help and type are viewed, not copied: pass string literals.
class Family {
 public:
  Family(std::string_view name, std::string_view help, std::string_view type)
      : name_(name), help_(help), type_(type) {}

  void Add(std::string_view label_set, std::string_view value) {
    AppendSample(&samples_, name_, label_set, value);
  }
  template <typename T>
  void Add(std::initializer_list<Label> labels, T value) {
    AppendSample(&samples_, name_, labels, value);
  }
  void AppendTo(std::string* out) const { AppendFamily(out, name_, help_, type_, samples_); }

 private:
  std::string_view name_, help_, type_;
  std::string samples_;
};

class Families {
 public:
  // The reference stays valid as long as the set.
  Family& Add(std::string_view name, std::string_view help, std::string_view type) {
    return families_.emplace_back(name, help, type);
  }
  void AppendTo(std::string* out) const {
    for (const Family& f : families_) f.AppendTo(out);
  }

 private:
  std::deque<Family> families_;
};

// tessera_build_info{version="<project version>",revision="<git commit the build was configured at, or
// unknown>"} 1
void AppendBuildInfo(std::string* out);
std::string_view Version();
std::string_view Revision();

}  // namespace tessera::exposition

#endif  // TESSERA_COMMON_EXPOSITION_H_
