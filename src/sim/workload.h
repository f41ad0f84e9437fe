// Loads a simulation's cluster and workload from the trace's CSV files or from the project's own cluster and
// workload files (YAML or JSON; docs/file-formats.md). CSV is recognized by its header.
//
//   absl::StatusOr<core::Cluster> c = LoadCluster(text, "nodes.csv");
//   absl::StatusOr<std::vector<core::PodRequest>> pods = LoadPods(text, "pods.csv");
//
// Thread-safety: pure functions.
#ifndef TESSERA_SIM_WORKLOAD_H_
#define TESSERA_SIM_WORKLOAD_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/request.h"

namespace tessera::sim {

absl::StatusOr<core::Cluster> LoadCluster(std::string_view text, std::string_view source);
absl::StatusOr<std::vector<core::PodRequest>> LoadPods(std::string_view text, std::string_view source);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_WORKLOAD_H_
