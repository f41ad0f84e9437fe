#include "sim/workload.h"

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

absl::StatusOr<std::vector<core::PodRequest>> LoadPods(std::string_view text, std::string_view source) {
  std::vector<core::PodRequest> out;
  if (FirstLine(text).starts_with("name,")) {
    absl::StatusOr<std::vector<TracePod>> pods = ParsePodCsv(text, source);
    if (!pods.ok()) return pods.status();
    out.reserve(pods->size());
    // The row makes the uid unique even where a file repeats a name.
    for (size_t i = 0; i < pods->size(); ++i) out.push_back(ToPodRequest((*pods)[i], StrCat("row-", i + 2)));
    return out;
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
  return out;
}

}  // namespace tessera::sim
