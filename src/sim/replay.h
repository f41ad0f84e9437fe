// Replays a workload on a modelled cluster, as the FGD study does (Weng et al., ATC '23, section 6.1):
//
//   1. the pods are sorted by name and shuffled with the seed;
//   2. the workload is scaled to `inflate` x the cluster's GPU capacity: random clones of the original pods
//   are
//      appended after the shuffled ones until the next clone would pass the target, or random pods are
//      removed while the workload is above it;
//   3. pods arrive one at a time and never leave; each is placed through the core Placer with the policy, or
//      stays unscheduled; the run goes on;
//   4. after every arrival the run records the GPU arrived so far (placed or not), the GPU allocated, and the
//      cluster's fragmentation by FGD's measure.
//
// Pods keep their priority (SharedGPU's two classes; sim/workload.h gives trace pods one by QoS class): a
// high-priority pod takes idle GPUs first, and one that fits nowhere may compress low-priority tenants,
// unless ReplayOptions::compression is off. A compressed tenant holds less than it asked, and the GPU
// allocated counts what tenants hold.
//
// Nodes that tie on a policy's score are chosen between by a random ranking of the nodes drawn once per run,
// as in the study's simulator.
//
//   ReplayInput input = ...;                      // nodes and pods (see workload.h)
//   absl::StatusOr<RunResult> r = Replay(input, "tessera", /*seed=*/42, /*inflate=*/1.3);
//
// Thread-safety: Replay may run concurrently on one ReplayInput (it copies the cluster).
#ifndef TESSERA_SIM_REPLAY_H_
#define TESSERA_SIM_REPLAY_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/placement/policy.h"
#include "core/request.h"

namespace tessera::sim {

struct ReplayInput {
  core::Cluster cluster;               // empty: no pods placed
  std::vector<core::PodRequest> pods;  // the original workload, in file order
  core::PolicyContext context;         // typical pods of `pods`, normalizers of `cluster`
  std::shared_ptr<const core::FragmentationModel> fragmentation;  // the measure the metrics use
  int64_t capacity_milli = 0;                                     // the cluster's GPUs, in thousandths

  // Builds the context and the measure from the cluster and pods.
  static ReplayInput Make(core::Cluster cluster, std::vector<core::PodRequest> pods);
};

// One arrival.
struct Event {
  int64_t arrived_milli = 0;  // GPU asked by all pods arrived so far, placed or not
  int64_t used_milli = 0;     // GPU allocated after this arrival
  double frag_milli = 0;      // the cluster's fragmentation (FGD's measure) after this arrival
  int64_t idle_milli = 0;     // GPU not allocated
};

// What priorities did in one run (all zero when no pod is high priority).
struct PriorityCounts {
  size_t high_pods = 0;    // high-priority arrivals
  size_t high_placed = 0;  // of them, placed
  // Of those placed, the ones that fit only by compressing low-priority tenants (Placement::compressions).
  size_t placed_by_compression = 0;
  // At the end of the run: low-priority tenants (a container's share of one GPU) holding less than they
  // asked, and the share they gave up in all, in thousandths of a GPU.
  size_t compressed_tenants = 0;
  int64_t compressed_milli = 0;

  size_t high_unplaced() const { return high_pods - high_placed; }
  bool operator==(const PriorityCounts&) const = default;
};

struct RunResult {
  std::string policy;
  uint64_t seed = 0;
  int64_t capacity_milli = 0;
  size_t pods = 0;  // after scaling
  size_t placed = 0;
  std::map<std::string, int> failed_by_shape;  // "share", "1-gpu", "8-gpu", "cpu", ...
  std::map<std::string, int> failed_by_cause;  // see FailureCause
  PriorityCounts priority;
  std::vector<Event> events;
  double seconds = 0;
};

struct ReplayOptions {
  // Remember unchanged nodes' answers between pods (core/placement/evaluation_cache.h); off only to measure
  // what it saves.
  bool evaluation_cache = true;
  // Stop after this many arrivals (0: all); for benchmarks.
  size_t max_pods = 0;
  // SharedGPU's compression for high-priority pods that fit nowhere (core::PlacementOptions); off to measure
  // what it buys.
  bool compression = true;
};

// `progress`, when given, is incremented once per arrival (for a progress bar across threads).
absl::StatusOr<RunResult> Replay(const ReplayInput& input, const std::string& policy, uint64_t seed,
                                 double inflate, std::atomic<int64_t>* progress = nullptr,
                                 const ReplayOptions& options = {});

// The pods of one run in arrival order (steps 1 and 2 above); exposed for tests. ResourceExhausted when the
// pods and their clones would pass kMaxTracePods (sim/trace.h): --inflate on a large cluster with small pods
// used to clone until bad_alloc.
absl::StatusOr<std::vector<const core::PodRequest*>> ArrivalOrder(const std::vector<core::PodRequest>& pods,
                                                                  int64_t capacity_milli, double inflate,
                                                                  uint64_t seed,
                                                                  std::vector<core::PodRequest>& clones);

// Refuses, before any run, an --inflate that needs more than kMaxTracePods arrivals even if every clone were
// the workload's largest pod (ArrivalOrder refuses the rest as it clones).
absl::Status CheckArrivals(const std::vector<core::PodRequest>& pods, int64_t capacity_milli, double inflate);

// "share", "k-gpu", "cpu", or "other" (several shares, whole GPUs with a share).
std::string ShapeLabel(const core::PodRequest& pod);

// Why a pod fit nowhere, looking at the whole cluster:
//   "gpu"         no GPU of a model it may use has room for it;
//   "gpu-model"   GPUs with room exist, but only of models it may not use;
//   "cpu-memory"  GPUs with room exist on models it may use, but those nodes lack the CPU or memory;
//   "other"       a node had it all: the namespace's quota or NUMA binding refused it.
// A pod without GPU fails only for CPU or memory.
std::string FailureCause(const core::Cluster& cluster, const core::PodRequest& pod);
// The GPU a pod asks for, in thousandths (a share whose size follows its memory counts as 0).
int64_t GpuMilli(const core::PodRequest& pod);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_REPLAY_H_
