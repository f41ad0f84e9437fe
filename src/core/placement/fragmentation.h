// GPU fragmentation as the FGD paper measures it (Weng et al., "Beware of Fragmentation: Scheduling
// GPU-Sharing Workloads with Fragmentation Gradient Descent", ATC '23, section 4).
//
// A workload is summed up by its typical pods: the distinct pod shapes (CPU, GPU share per GPU, GPU count,
// allowed models), most frequent first, up to 95% of all pods, each with its popularity. For a node n and a
// typical pod m, the fragment F_n(m) is the node's idle GPU (in thousandths) that m could not use:
//   - all of it when m cannot be placed on n at all (m needs no GPU, n's model is not allowed, n lacks the
//     CPU, or fewer than m's count of GPUs have m's share free);
//   - otherwise only the idle GPU of the GPUs whose free share is below m's share.
// The node's fragmentation is F_n = sum over m of popularity(m) x F_n(m); the cluster's is the sum over
// nodes.

//
//   WorkloadProfile profile = WorkloadProfile::FromPods(pods);
//   FragmentationModel model(profile, cluster);
//   double f = model.NodeFragment(node);
//   FragmentationModel::NodeView v = model.Prepare(node);
//   double after = model.FragmentAfter(v, MilliCpu(4000), {{gpu_free_before, gpu_free_after}});
//
// Thread-safety: immutable after construction.
#ifndef TESSERA_CORE_PLACEMENT_FRAGMENTATION_H_
#define TESSERA_CORE_PLACEMENT_FRAGMENTATION_H_

#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/cluster.h"
#include "core/request.h"
#include "core/units.h"

namespace tessera::core {

// One typical pod of a workload.
struct TypicalPod {
  MilliCpu cpu{0};
  MilliGpu share{0};  // per GPU; 0 for a pod without GPU
  int gpus = 0;
  std::vector<std::string> models;  // allowed GPU models; empty: any
  int64_t count = 0;                // how many pods of the workload have this shape
  double popularity = 0;            // count over the counts of all typical pods (they add up to 1)
};

struct WorkloadProfile {
  std::vector<TypicalPod> pods;

  // The typical pods of a list of pods: shapes by count, most frequent first (equal counts: larger CPU,
  // share, GPU count and model list first), the shortest prefix that covers `coverage` of the pods. Pods
  // whose share follows their memory (known only on a GPU) are left out.
  static WorkloadProfile FromPods(std::span<const PodRequest> pods, double coverage = 0.95);
};

class FragmentationModel {
 public:
  FragmentationModel(WorkloadProfile profile, const Cluster& cluster);

  const WorkloadProfile& profile() const { return profile_; }

  // What F_n needs to know of a node, prepared once per node state so that candidate placements are scored in
  // O(typical pods x GPUs changed).
  struct NodeView {
    int model_id = -1;
    MilliCpu cpu{0};               // free CPU
    int64_t idle = 0;              // free GPU, thousandths
    std::vector<int> fit_count;    // per share threshold: GPUs with at least that share free
    std::vector<int64_t> partial;  // per share threshold: free share of the GPUs below it
    // The typical pods that may use this node's GPUs, ordered by share threshold; all others count the
    // node's whole idle GPU, with these popularities in all.
    std::vector<uint16_t> active;
    double idle_weight = 0;
  };
  NodeView Prepare(const NodeState& node) const;
  NodeView Prepare(int model_id, MilliCpu cpu, std::span<const MilliGpu> free) const;

  // F_n of a prepared node.
  double Fragment(const NodeView& view) const;
  // F_n once `cpu_taken` and the GPU changes (free share before -> after) are applied.
  double FragmentAfter(const NodeView& view, MilliCpu cpu_taken,
                       std::span<const std::pair<MilliGpu, MilliGpu>> changes) const;
  // F_n of a node as it is.
  double NodeFragment(const NodeState& node) const { return Fragment(Prepare(node)); }
  // F_n split over the node's GPUs (by index; unhealthy GPUs 0): each typical pod's fragment is the idle
  // share of the GPUs it cannot use, so GPU g's part is the popularity-weighted idle share of g for every
  // typical pod that cannot use g (it cannot be placed on the node at all, or g has less than its share
  // free). The parts add up to NodeFragment(node). What the operators' page draws per GPU.
  std::vector<double> GpuFragments(const NodeState& node) const;

 private:
  bool Allowed(size_t typical, int model_id) const;

  WorkloadProfile profile_;
  std::vector<MilliGpu> thresholds_;  // the distinct shares of GPU typical pods
  std::vector<int> threshold_of_;     // per typical pod: index into thresholds_, -1 for no GPU
  int model_count_ = 0;
  std::vector<char> allowed_;  // [typical * model_count_ + model]
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_FRAGMENTATION_H_
