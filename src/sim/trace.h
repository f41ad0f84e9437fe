// The Alibaba GPU cluster trace (v2023, "openb") in its CSV form, as the FGD paper's simulator reads it.
//
//   Nodes: sn,cpu_milli,memory_mib,gpu,model
//   Pods:  name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,pod_phase,creation_time,...]
//
// Columns are found by their header names; extra columns are ignored. A pod asks for num_gpu GPUs of
// gpu_milli thousandths each (below 1000 only when num_gpu is 1), gpu_spec lists the GPU models it may use,
// separated by '|' (empty: any), and qos is its QoS class (LS, BE, Burstable, Guaranteed), which the
// simulator may map to SharedGPU's priorities (sim/workload.h).
//
//   absl::StatusOr<std::vector<TraceNode>> nodes = ParseNodeCsv(text, "nodes.csv");
//   core::NodeInfo info = ToNodeInfo((*nodes)[0]);
//
// Thread-safety: pure functions.
#ifndef TESSERA_SIM_TRACE_H_
#define TESSERA_SIM_TRACE_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/request.h"

namespace tessera::sim {

struct TraceNode {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int gpus = 0;
  std::string model;
};

struct TracePod {
  std::string name;
  int64_t cpu_milli = 0;
  int64_t memory_mib = 0;
  int num_gpu = 0;
  int gpu_milli = 0;
  std::vector<std::string> gpu_spec;  // allowed models; empty: any
};

// The QoS classes of the trace's pods (its README: latency-sensitive, best-effort, and Kubernetes' Burstable
// and Guaranteed), spelt as the qos column spells them.
inline constexpr std::array<std::string_view, 4> kTraceQosClasses = {"LS", "BE", "Burstable", "Guaranteed"};

// A comma-separated list of those classes ("LS", "LS,Guaranteed"), each once. InvalidArgument, naming the
// classes, for an empty list or a class the trace does not have.
absl::StatusOr<std::vector<std::string>> ParseQosList(std::string_view text);

// Larger traces are refused with a message (a 200,000-node file used to end in bad_alloc during the replay):
// 10x the largest published cluster trace, and well within what a replay holds in memory.
inline constexpr size_t kMaxTraceNodes = 50000;
inline constexpr size_t kMaxTracePods = 5000000;

absl::StatusOr<std::vector<TraceNode>> ParseNodeCsv(std::string_view text, std::string_view source);
// `qos`, when given, receives each pod's qos column as written (in the order of the pods), or stays empty
// when the header has no qos column.
absl::StatusOr<std::vector<TracePod>> ParsePodCsv(std::string_view text, std::string_view source,
                                                  std::vector<std::string>* qos = nullptr);

// GPU memory of the trace's models, in MiB. The trace gives none; placement needs a size, and since trace
// pods ask for memory in proportion to their share, the size does not change any decision.
core::MiB TraceGpuMemory(std::string_view model);

core::NodeInfo ToNodeInfo(const TraceNode& node);
// A pod of the trace as a request: num_gpu vGPUs of gpu_milli each, memory in proportion, its CPU and memory.
core::PodRequest ToPodRequest(const TracePod& pod, std::string uid);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_TRACE_H_
