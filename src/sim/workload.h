// Loads a simulation's cluster and workload from the trace's CSV files or from the project's own cluster and
// workload files (YAML or JSON; docs/file-formats.md). CSV is recognized by its header.
//
//   absl::StatusOr<core::Cluster> c = LoadCluster(text, "nodes.csv");
//   absl::StatusOr<std::vector<core::PodRequest>> pods = LoadPods(text, "pods.csv");
//   // the trace's latency-sensitive pods as SharedGPU's high priority:
//   pods = LoadPods(text, "pods.csv", {.high_priority_qos = {"LS"}});
//
// Thread-safety: pure functions.
#ifndef TESSERA_SIM_WORKLOAD_H_
#define TESSERA_SIM_WORKLOAD_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/request.h"

namespace tessera::sim {

absl::StatusOr<core::Cluster> LoadCluster(std::string_view text, std::string_view source);
struct WorkloadOptions {
  // Pods of these QoS classes (the trace CSV's qos column, sim/trace.h) are placed as high priority
  // (SharedGPU: idle GPUs first, and compression of low-priority tenants when they fit nowhere); all others
  // low. Empty: every trace pod is low priority, as before. Refused for a workload without the qos column (a
  // workload file gives each pod its own tessera.dev/priority).
  std::vector<std::string> high_priority_qos;
  // How a share of one GPU whose memory is left out (every share of the trace) accounts GPU memory:
  //   kProportional  memory in proportion to the share (docs/requests.md), as the scheduler does;
  //   kNone          no memory at all, compute only: the trace's one dimension, as the FGD study models it.
  // The two place alike (proportional memory never runs out before compute), except where compression is
  // asked: memory is never compressed, so with proportional memory a GPU whose compute is short is as short
  // of memory, and no tenant can make room (docs/simulator.md, "Priorities").
  enum class ShareMemory { kProportional, kNone };
  ShareMemory share_memory = ShareMemory::kProportional;
};

absl::StatusOr<std::vector<core::PodRequest>> LoadPods(std::string_view text, std::string_view source,
                                                       const WorkloadOptions& options = {});

}  // namespace tessera::sim

#endif  // TESSERA_SIM_WORKLOAD_H_
