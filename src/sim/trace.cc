#include "sim/trace.h"

#include <algorithm>
#include <map>

#include "absl/status/status.h"
#include "core/gpu_mask.h"
#include "core/strings.h"

namespace tessera::sim {

namespace {

// A CSV of simple fields (the trace quotes nothing). Returns the header's column positions.
struct Csv {
  std::vector<std::string_view> lines;
  std::map<std::string, size_t, std::less<>> columns;
};

absl::StatusOr<Csv> ReadCsv(std::string_view text, std::string_view source,
                            std::initializer_list<const char*> required) {
  Csv csv;
  csv.lines = StrSplit(text, '\n');
  while (!csv.lines.empty() && StripWhitespace(csv.lines.back()).empty()) csv.lines.pop_back();
  if (csv.lines.empty()) return absl::InvalidArgumentError(StrCat(source, ": the file is empty"));
  std::vector<std::string_view> head = StrSplit(StripWhitespace(csv.lines[0]), ',');
  for (size_t i = 0; i < head.size(); ++i) {
    if (!csv.columns.emplace(std::string(StripWhitespace(head[i])), i).second) {
      return absl::InvalidArgumentError(
          StrCat(source, " line 1: column \"", StripWhitespace(head[i]), "\" appears twice in the header"));
    }
  }
  std::vector<std::string> missing;
  for (const char* r : required) {
    if (!csv.columns.contains(r)) missing.emplace_back(r);
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(StrCat(source, " line 1: the header lacks ", StrJoin(missing, ", "),
                                             "; expected the trace's columns (", StrJoin(required, ","),
                                             ")"));
  }
  return csv;
}

// Field i of a row, trimmed; empty when the row is short.
std::string Text(const std::vector<std::string_view>& fields, size_t i) {
  return i < fields.size() ? std::string(StripWhitespace(fields[i])) : std::string();
}

absl::Status Field(std::string_view source, size_t line, const std::vector<std::string_view>& fields,
                   const Csv& csv, const char* name, int64_t min, int64_t max, int64_t* out) {
  const size_t i = csv.columns.find(name)->second;
  std::string_view v = i < fields.size() ? StripWhitespace(fields[i]) : std::string_view();
  if (!ParseInt(v, out) || *out < min || *out > max) {
    return absl::InvalidArgumentError(StrCat(source, " line ", line + 1, ": ", name, " is \"", v,
                                             "\"; expected a whole number from ", min, " to ", max));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TraceNode>> ParseNodeCsv(std::string_view text, std::string_view source) {
  absl::StatusOr<Csv> csv = ReadCsv(text, source, {"sn", "cpu_milli", "memory_mib", "gpu", "model"});
  if (!csv.ok()) return csv.status();
  if (csv->lines.size() - 1 > kMaxTraceNodes) {
    return absl::InvalidArgumentError(StrCat(source, ": ", csv->lines.size() - 1,
                                             " nodes; a replay takes at most ", kMaxTraceNodes,
                                             " (split the trace, or sample it)"));
  }
  std::vector<TraceNode> nodes;
  for (size_t l = 1; l < csv->lines.size(); ++l) {
    std::string_view line = StripWhitespace(csv->lines[l]);
    if (line.empty()) continue;
    std::vector<std::string_view> f = StrSplit(line, ',');
    TraceNode n;
    n.name = Text(f, csv->columns["sn"]);
    int64_t gpus = 0;
    for (absl::Status s : {Field(source, l, f, *csv, "cpu_milli", 0, int64_t{1} << 40, &n.cpu_milli),
                           Field(source, l, f, *csv, "memory_mib", 0, int64_t{1} << 40, &n.memory_mib),
                           Field(source, l, f, *csv, "gpu", 0, core::kMaxGpusPerNode, &gpus)}) {
      if (!s.ok()) return s;
    }
    n.gpus = static_cast<int>(gpus);
    const size_t m = csv->columns["model"];
    n.model = m < f.size() ? std::string(StripWhitespace(f[m])) : "";
    if (n.name.empty())
      return absl::InvalidArgumentError(StrCat(source, " line ", l + 1, ": sn (the node name) is empty"));
    if (n.gpus > 0 && n.model.empty()) {
      return absl::InvalidArgumentError(
          StrCat(source, " line ", l + 1, ": node ", n.name, " has ", n.gpus, " GPUs but no model"));
    }
    nodes.push_back(std::move(n));
  }
  return nodes;
}

absl::StatusOr<std::vector<TracePod>> ParsePodCsv(std::string_view text, std::string_view source,
                                                  std::vector<std::string>* qos_out) {
  absl::StatusOr<Csv> csv =
      ReadCsv(text, source, {"name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"});
  if (!csv.ok()) return csv.status();
  const auto spec = csv->columns.find("gpu_spec");
  const auto qos = csv->columns.find("qos");
  if (qos_out != nullptr) qos_out->clear();
  if (csv->lines.size() - 1 > kMaxTracePods) {
    return absl::InvalidArgumentError(StrCat(source, ": ", csv->lines.size() - 1,
                                             " pods; a replay takes at most ", kMaxTracePods,
                                             " (split the trace, or sample it)"));
  }
  std::vector<TracePod> pods;
  for (size_t l = 1; l < csv->lines.size(); ++l) {
    std::string_view line = StripWhitespace(csv->lines[l]);
    if (line.empty()) continue;
    std::vector<std::string_view> f = StrSplit(line, ',');
    TracePod p;
    p.name = Text(f, csv->columns["name"]);
    if (p.name.empty())
      return absl::InvalidArgumentError(StrCat(source, " line ", l + 1, ": the pod has no name"));
    int64_t num_gpu = 0;
    int64_t gpu_milli = 0;
    for (absl::Status s : {Field(source, l, f, *csv, "cpu_milli", 0, int64_t{1} << 40, &p.cpu_milli),
                           Field(source, l, f, *csv, "memory_mib", 0, int64_t{1} << 40, &p.memory_mib),
                           Field(source, l, f, *csv, "num_gpu", 0, core::kMaxGpusPerNode, &num_gpu),
                           Field(source, l, f, *csv, "gpu_milli", 0, 1000, &gpu_milli)}) {
      if (!s.ok()) return s;
    }
    p.num_gpu = static_cast<int>(num_gpu);
    p.gpu_milli = static_cast<int>(gpu_milli);
    if (p.num_gpu > 1 && p.gpu_milli != 1000) {
      return absl::InvalidArgumentError(StrCat(source, " line ", l + 1, ": pod ", p.name, " asks for ",
                                               p.num_gpu, " GPUs of ", p.gpu_milli,
                                               " thousandths; several GPUs must be whole (gpu_milli 1000)"));
    }
    if ((p.num_gpu == 0) != (p.gpu_milli == 0)) {
      return absl::InvalidArgumentError(StrCat(source, " line ", l + 1, ": pod ", p.name, " has num_gpu ",
                                               p.num_gpu, " but gpu_milli ", p.gpu_milli,
                                               "; both are 0 for a pod without GPU"));
    }
    if (spec != csv->columns.end() && spec->second < f.size()) {
      for (std::string_view m : StrSplit(StripWhitespace(f[spec->second]), '|')) {
        if (!StripWhitespace(m).empty()) p.gpu_spec.emplace_back(StripWhitespace(m));
      }
    }
    if (qos_out != nullptr && qos != csv->columns.end()) qos_out->push_back(Text(f, qos->second));
    pods.push_back(std::move(p));
  }
  return pods;
}

absl::StatusOr<std::vector<std::string>> ParseQosList(std::string_view text) {
  const std::string classes = StrJoin(kTraceQosClasses, ", ");
  std::vector<std::string> out;
  for (std::string_view part : StrSplit(text, ',')) {
    part = StripWhitespace(part);
    if (part.empty()) continue;
    if (std::find(kTraceQosClasses.begin(), kTraceQosClasses.end(), part) == kTraceQosClasses.end()) {
      return absl::InvalidArgumentError(StrCat("qos class \"", part,
                                               "\" is not one of the trace's; name among: ", classes,
                                               " (as the pod CSV's qos column spells them)"));
    }
    if (std::find(out.begin(), out.end(), part) == out.end()) out.emplace_back(part);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(StrCat("no qos class named; name one or more of: ", classes));
  }
  return out;
}

core::MiB TraceGpuMemory(std::string_view model) {
  if (model == "V100M32") return core::MiB(32768);
  if (model == "A10") return core::MiB(24576);
  if (model == "G2" || model == "G3") return core::MiB(32768);  // undisclosed models
  return core::MiB(16384);                                      // P100, T4, V100M16
}

core::NodeInfo ToNodeInfo(const TraceNode& node) {
  core::NodeInfo info;
  info.name = core::NodeName(node.name);
  info.cpu = core::MilliCpu(node.cpu_milli);
  info.memory = core::MiB(node.memory_mib);
  for (int g = 0; g < node.gpus; ++g) {
    info.gpus.push_back(
        {core::GpuUuid(StrCat(node.name, "-gpu", g)), g, node.model, TraceGpuMemory(node.model), -1});
  }
  info.links = core::LinkMatrix(node.gpus);
  return info;
}

core::PodRequest ToPodRequest(const TracePod& pod, std::string uid) {
  core::PodRequest r;
  r.uid = core::PodUid(std::move(uid));
  r.name = pod.name;
  r.cpu = core::MilliCpu(pod.cpu_milli);
  r.memory = core::MiB(pod.memory_mib);
  r.model_include = pod.gpu_spec;
  if (pod.num_gpu > 0) {
    core::ContainerRequest c;
    c.name = "main";
    c.vgpus.assign(static_cast<size_t>(pod.num_gpu), core::VGpuDemand{core::MilliGpu(pod.gpu_milli), {}});
    r.containers.push_back(std::move(c));
  }
  return r;
}

}  // namespace tessera::sim
