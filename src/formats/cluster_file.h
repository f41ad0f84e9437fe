// The project's own cluster and workload files (YAML, or JSON, which is YAML too). Documented with examples
// in docs/file-formats.md; the bundled examples are in examples/.
//
//   absl::StatusOr<ClusterFile> c = ParseClusterFile(text, "examples/cluster-small.yaml");
//   for (NodeInfo& n : c->nodes) cluster.AddNode(std::move(n));
//   absl::StatusOr<std::vector<core::PodSpec>> pods = ParseWorkloadFile(text, "examples/pods-demo.yaml");
//
// Errors name the file, the line and the field, and say what was expected.
//
// Thread-safety: pure functions (text in, values out).
#ifndef TESSERA_FORMATS_CLUSTER_FILE_H_
#define TESSERA_FORMATS_CLUSTER_FILE_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/cluster_types.h"
#include "core/request_parser.h"

namespace tessera::formats {

// What a cluster or workload file may expand to (after replicas and YAML aliases; formats/yaml_fields.h
// bounds the document itself). The node caps are the trace's (sim/trace.h); a workload's pods are built in
// memory before any is placed, so their total is bounded by count and by an estimate of their bytes.
inline constexpr int64_t kMaxFileNodes = 50'000;
inline constexpr int64_t kMaxFileGpus = 400'000;
inline constexpr int64_t kMaxFilePods = 1'000'000;
inline constexpr int64_t kMaxFileContainers = 2'000'000;
inline constexpr int64_t kMaxFilePodBytes = int64_t{512} << 20;

struct QuotaEntry {
  core::Namespace ns;
  std::string model;
  core::MilliGpu limit{0};
};

struct ClusterFile {
  std::vector<core::NodeInfo> nodes;
  std::vector<QuotaEntry> quotas;
};

absl::StatusOr<ClusterFile> ParseClusterFile(std::string_view text, std::string_view source = "cluster file");

// A quota file: tessera-scheduler's --quota-file on a cluster (Helm: scheduler.quotas, a ConfigMap).
//
//   apiVersion: tessera.dev/v1
//   kind: GpuQuotas
//   quotas:
//     - {namespace: research, model: A100-SXM4-80GB, gpus: 6.5}
absl::StatusOr<std::vector<QuotaEntry>> ParseQuotaFile(std::string_view text, std::string_view source);

// Builds a Cluster from a parsed file (nodes and quotas).
absl::StatusOr<core::Cluster> BuildCluster(const ClusterFile& file);

absl::StatusOr<std::vector<core::PodSpec>> ParseWorkloadFile(std::string_view text,
                                                             std::string_view source = "workload file");

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_CLUSTER_FILE_H_
