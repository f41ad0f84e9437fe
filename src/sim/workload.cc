#include "sim/workload.h"

#include <algorithm>

#include "absl/status/status.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/cluster_file.h"
#include "sim/trace.h"

namespace tessera::sim {

namespace {

// The first line of the text, trimmed.
std::string_view FirstLine(std::string_view text) {
  const size_t end = text.find('\n');
  return StripWhitespace(text.substr(0, end));
}

}  // namespace

absl::StatusOr<core::Cluster> LoadCluster(std::string_view text, std::string_view source) {
  if (FirstLine(text).starts_with("sn,")) {
    absl::StatusOr<std::vector<TraceNode>> nodes = ParseNodeCsv(text, source);
    if (!nodes.ok()) return nodes.status();
    core::Cluster cluster;
    for (const TraceNode& n : *nodes) {
      absl::Status s = cluster.AddNode(ToNodeInfo(n));
      if (!s.ok()) return absl::InvalidArgumentError(StrCat(source, ": ", s.message()));
    }
    return cluster;
  }
  absl::StatusOr<formats::ClusterFile> file = formats::ParseClusterFile(text, source);
  if (!file.ok()) return file.status();
  absl::StatusOr<core::Cluster> cluster = formats::BuildCluster(*file);
  if (!cluster.ok()) return absl::InvalidArgumentError(StrCat(source, ": ", cluster.status().message()));
  return cluster;
}

namespace {

void ApplyShareMemory(WorkloadOptions::ShareMemory mode, std::vector<core::PodRequest>& pods) {
  if (mode == WorkloadOptions::ShareMemory::kProportional) return;
  for (core::PodRequest& p : pods) {
    for (core::ContainerRequest& c : p.containers) {
      for (core::VGpuDemand& v : c.vgpus) {
        // A share asking compute, memory left out: 0 MiB (a whole GPU keeps its whole memory).
        if (v.memory.kind == core::MemorySpec::Kind::kDefault && v.cores.value() > 0 && !v.exclusive())
          v.memory = core::MemorySpec{core::MemorySpec::Kind::kMiB, 0};
      }
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<core::PodRequest>> LoadPods(std::string_view text, std::string_view source,
                                                       const WorkloadOptions& options) {
  std::vector<core::PodRequest> out;
  if (FirstLine(text).starts_with("name,")) {
    std::vector<std::string> qos;
    absl::StatusOr<std::vector<TracePod>> pods = ParsePodCsv(text, source, &qos);
    if (!pods.ok()) return pods.status();
    const std::vector<std::string>& high = options.high_priority_qos;
    if (!high.empty() && qos.size() != pods->size()) {
      return absl::InvalidArgumentError(
          StrCat(source,
                 ": the header has no qos column, so no pod can be given a priority by its QoS class; use a "
                 "pod CSV with the trace's qos column, or leave out --high-priority-qos"));
    }
    out.reserve(pods->size());
    // The row makes the uid unique even where a file repeats a name.
    for (size_t i = 0; i < pods->size(); ++i) {
      out.push_back(ToPodRequest((*pods)[i], StrCat("row-", i + 2)));
      if (!high.empty() && std::find(high.begin(), high.end(), qos[i]) != high.end())
        out.back().priority = core::Priority::kHigh;
    }
    ApplyShareMemory(options.share_memory, out);
    return out;
  }
  if (!options.high_priority_qos.empty()) {
    return absl::InvalidArgumentError(
        StrCat(source,
               ": a workload file has no qos column, so no pod can be given a priority by its QoS "
               "class; give the pods tessera.dev/priority: high in the file instead, or leave out "
               "--high-priority-qos"));
  }
  absl::StatusOr<std::vector<core::PodSpec>> specs = formats::ParseWorkloadFile(text, source);
  if (!specs.ok()) return specs.status();
  for (const core::PodSpec& spec : *specs) {
    absl::StatusOr<core::PodRequest> r = core::ParsePodRequest(spec);
    if (!r.ok()) {
      return absl::InvalidArgumentError(
          StrCat(source, ": pod ", spec.ns, "/", spec.name, ": ", r.status().message()));
    }
    out.push_back(*std::move(r));
  }
  ApplyShareMemory(options.share_memory, out);
  return out;
}

}  // namespace tessera::sim
