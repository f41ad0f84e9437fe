// The Placer decides where a pod goes: which node, which GPUs, what share of each, and, for a high-priority
// pod with nowhere to go, which low-priority tenants are compressed. The scheduler extender, `tessera place`
// and the simulator all place through it, so they never disagree about what fits where (the node agent does
// not place: it applies the placement the scheduler wrote into the pod).
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
// Thread-safety: immutable after construction; const methods may run concurrently given their own Rng, except
// with the policies that keep caches (fgd, tessera): give each thread its own Placer and Policy then.
#ifndef TESSERA_CORE_PLACEMENT_PLACER_H_
#define TESSERA_CORE_PLACEMENT_PLACER_H_

#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/placement/compiled_request.h"
#include "core/placement/policy.h"
#include "core/random.h"
#include "core/request.h"

namespace tessera::core {

class EvaluationCache;

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

  // The same through `cache`: the node's remembered answer when neither it nor the pod's shape changed
  // (deterministic policies only; others are evaluated afresh). The answer is returned by reference: to the
  // cache's entry, or to `scratch`. `node` must belong to `cluster`.
  const NodeFit& EvaluateCached(const Cluster& cluster, const NodeState& node, const CompiledRequest& request,
                                Rng& rng, EvaluationCache* cache, NodeFit& scratch) const;

  // Why it does not fit, in words a user can act on.
  Explanation Explain(const Cluster& cluster, const NodeState& node, const PodRequest& request) const;

  // The best node among `candidates` (all nodes when empty), with its GPUs, or an error that explains every
  // node's refusal. A high-priority pod that fits nowhere may compress low-priority tenants (SharedGPU).
  // Nodes of equal rank and score are chosen between at random, or, when `node_rank` is given (one number per
  // node of `cluster.nodes()`), the node of lowest rank wins, as in the FGD study's simulator.
  // `cache`, when given, remembers answers of unchanged nodes between calls (see EvaluationCache).
  absl::StatusOr<Placement> Place(const Cluster& cluster, const PodRequest& request, Rng& rng,
                                  std::span<const NodeName> candidates = {},
                                  std::span<const uint32_t> node_rank = {},
                                  EvaluationCache* cache = nullptr) const;

  // What EvaluationCache remembers an answer under: the pod's fingerprint and the policy's state_key.
  uint64_t CacheKey(const CompiledRequest& request) const;

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
