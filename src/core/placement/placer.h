// The Placer decides where a pod goes: which node, which GPUs, what share of each, and, for a high-priority
// pod with nowhere to go, which low-priority tenants are compressed. The scheduler extender, the node agent
// and the simulator all place through it, so they never disagree about what fits where.
//
// It applies every constraint (schedulable nodes, healthy GPUs, GPU model include/exclude, UUID
// include/exclude, never two models in one pod, per-namespace quota per model, CPU and host memory, NUMA
// binding) and SharedGPU's priority rules, and leaves to the Policy only the choice among GPUs and the
// ranking of nodes.
//
//   Placer placer(*MakePolicy("gaia"));
//   Rng rng(42);
//   absl::StatusOr<Placement> p = placer.Place(cluster, request, rng);
//   if (!p.ok()) log(p.status().message());   // says, per node, what was missing
//
// For the extender's filter and prioritize verbs, Evaluate ranks one node without building a Placement, and
// Explain turns a rejection into words a user can act on ("node a: GPU 3 has 2048 MiB free, 4096 needed").
//
// Thread-safety: immutable after construction; const methods may run concurrently given their own Rng.
#ifndef TESSERA_CORE_PLACEMENT_PLACER_H_
#define TESSERA_CORE_PLACEMENT_PLACER_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/placement/policy.h"
#include "core/random.h"
#include "core/request.h"

namespace tessera::core {

// Why a node cannot take a pod (the detail is in Placer::Explain).
enum class RejectCode {
  kNone,
  kUnschedulable,  // cordoned, or its agent's heartbeat is stale
  kNoGpu,          // no healthy GPU
  kModel,          // no GPU of an allowed model
  kUuid,           // no GPU among those the pod names, or all of them excluded
  kQuota,          // the namespace's quota for this GPU model is used up
  kCpu,
  kHostMemory,
  kGpuCapacity,  // the GPUs lack the share or memory
  kNuma,         // fits, but not within one NUMA node
};
const char* ToString(RejectCode code);

// A request compiled against one cluster, once per pod: models resolved to ids, vGPUs flattened.
class CompiledRequest {
 public:
  CompiledRequest(const Cluster& cluster, const PodRequest& request);

  const PodRequest& request() const { return *request_; }
  std::span<const VGpuDemand> vgpus() const { return vgpus_; }
  // vGPUs of container i are vgpus()[container_start(i) .. container_start(i + 1)).
  size_t container_start(size_t i) const { return starts_[i]; }
  size_t container_count() const { return starts_.size() - 1; }
  bool ModelAllowed(int model_id) const;
  // The GPUs of `node` the UUID constraints allow.
  GpuMask UuidAllowed(const NodeState& node) const;
  int exclusive_count() const { return exclusive_; }
  // The most vGPUs any one container asks for (each of a container's vGPUs needs a GPU of its own).
  int max_container_vgpus() const { return max_container_vgpus_; }
  // Smallest compute share any vGPU needs, known before a GPU is chosen (proportional shares count as 1).
  MilliGpu min_cores() const { return min_cores_; }
  // Share of GPUs of this model the pod's namespace may still take; nullopt: no quota.
  std::optional<MilliGpu> QuotaLeft(int model_id) const;

 private:
  const PodRequest* request_;
  std::vector<std::optional<MilliGpu>> quota_left_;  // by model id
  std::vector<VGpuDemand> vgpus_;
  std::vector<size_t> starts_;
  std::vector<char> allowed_models_;  // by model id; empty: all allowed
  int exclusive_ = 0;
  int max_container_vgpus_ = 0;
  MilliGpu min_cores_{0};
};

// One node's answer for one pod: whether it fits, how it ranks, and the GPUs chosen.
struct NodeFit {
  RejectCode reject = RejectCode::kNone;
  int tier = 0;      // SharedGPU priority rules rank first: a higher tier wins whatever the score
  double score = 0;  // the policy's score, within a tier
  int model_id = -1;
  PodChoice choice;
  std::array<int16_t, kMaxGpusPerNode> numa_of_container{};  // -1 when not bound

  bool fits() const { return reject == RejectCode::kNone; }
};

struct Explanation {
  std::string message;        // "node a: GPU 3 has 2048 MiB free, 4096 needed"
  bool unresolvable = false;  // no preemption could help: the node could not take the pod even if empty
};

class Placer {
 public:
  explicit Placer(const Policy& policy, PlacementOptions options = {});

  const Policy& policy() const { return *policy_; }
  const PlacementOptions& options() const { return options_; }

  // Does the pod fit on this node, and how well? Allocates nothing.
  NodeFit Evaluate(const NodeState& node, const CompiledRequest& request, Rng& rng) const;
  NodeFit Evaluate(const Cluster& cluster, const NodeState& node, const PodRequest& request, Rng& rng) const;

  // Why it does not fit, in words a user can act on.
  Explanation Explain(const Cluster& cluster, const NodeState& node, const PodRequest& request) const;

  // The best node among `candidates` (all nodes when empty), with its GPUs, or an error that explains every
  // node's refusal. A high-priority pod that fits nowhere may compress low-priority tenants (SharedGPU).
  absl::StatusOr<Placement> Place(const Cluster& cluster, const PodRequest& request, Rng& rng,
                                  std::span<const NodeName> candidates = {}) const;

  // Turns a fitting NodeFit into a Placement (GPU UUIDs, shares, memory limits, NUMA CPUs).
  Placement Materialize(const NodeState& node, const CompiledRequest& request, const NodeFit& fit) const;

 private:
  bool EvaluateModel(const NodeState& node, const CompiledRequest& request, int model_id, GpuMask eligible,
                     Rng& rng, NodeFit& fit) const;
  // SharedGPU's compression: a high-priority pod that fits nowhere takes share from low-priority tenants.
  std::optional<Placement> PlanCompression(const CompiledRequest& request,
                                           std::span<const NodeState* const> nodes, Rng& rng) const;

  const Policy* policy_;
  PlacementOptions options_;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_PLACER_H_
