// Remembers nodes' answers for pods, so that a node that has not changed is not evaluated again for a pod
// that every node answers like the last one of its kind (same CompiledRequest::fingerprint). Replaying a
// trace, most pods share a handful of shapes and one node changes per pod: nearly every evaluation is a hit.
//
//   EvaluationCache cache;
//   for (...) placer.Place(cluster, pod, rng, {}, ranks, &cache);
//
// Only deterministic policies' answers are kept (Policy::deterministic). Entries are keyed by the node's
// version, which changes with every change to the node, so a stale answer is never used.
//
// Thread-safety: not thread-safe. One cache per Placer and per Cluster: its keys carry neither the policy nor
// the cluster, and a copied Cluster reissues node versions.
#ifndef TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_
#define TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "core/placement/placer.h"

namespace tessera::core {

class EvaluationCache {
 public:
  // The answer remembered for this node (by position in the cluster) and pod, or nullptr.
  const NodeFit* Find(size_t node, uint64_t node_version, uint64_t fingerprint) const {
    if (node >= slots_.size()) return nullptr;
    const Slot& s = slots_[node][fingerprint % kWays];
    return s.version == node_version && s.fingerprint == fingerprint && s.generation == generation_ ? &s.fit
                                                                                                    : nullptr;
  }
  void Store(size_t node, uint64_t node_version, uint64_t fingerprint, const NodeFit& fit) {
    // Grow geometrically: growing one node at a time moved every row (32 slots) on each new node.
    if (node >= slots_.size()) slots_.resize(std::max(node + 1, slots_.size() * 2));
    Slot& s = slots_[node][fingerprint % kWays];
    s.version = node_version;
    s.fingerprint = fingerprint;
    s.generation = generation_;
    s.fit = fit;
  }
  // Forgets every answer (the policy changed) in O(1), keeping the memory: refilling tens of megabytes of
  // fresh pages after each policy rebuild cost the scheduler more than the evaluations themselves.
  void Clear() { ++generation_; }

 private:
  static constexpr size_t kWays = 32;  // distinct pod shapes remembered per node
  struct Slot {
    uint64_t version = 0;  // 0: empty (node versions start at 1)
    uint64_t fingerprint = 0;
    uint64_t generation = 0;
    NodeFit fit;
  };
  std::vector<std::array<Slot, kWays>> slots_;
  uint64_t generation_ = 0;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_
