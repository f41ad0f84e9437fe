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
// With a fixed ranking of the nodes (the simulator's tie rule), the cache also keeps, per recent pod shape,
// which node is best (RankedIndex): a pod then costs the evaluations of the nodes that changed since its
// shape was last placed, not a look at every node.
//
// Thread-safety: not thread-safe. One cache per Placer and per Cluster: its keys carry neither the policy nor
// the cluster, and a copied Cluster reissues node versions.
#ifndef TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_
#define TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "core/placement/placer.h"

namespace tessera::core {

// For each of the most recently asked pod shapes, the best node under a fixed node ranking: highest tier,
// then highest score, then lowest rank, among the nodes that fit (what Placer::Place chooses given
// `node_rank`). Each shape keeps every node's answer and a tournament tree over them; asking again
// re-evaluates only the nodes whose version is newer than the shape's last look and replays their way up the
// tree, O(changed x log nodes). Answers are exact: a node is re-evaluated whenever its version changed, and
// the key must name everything else the answers depend on (the pod's fingerprint and the policy's state).
class RankedIndex {
 public:
  struct Answer {
    bool fits = false;
    int tier = 0;
    double score = 0;
  };

  // The position of the best node for `key`, or -1 when none fits. `versions` are the nodes' versions by
  // position (Cluster::node_versions), `rank` one number per node (lower wins ties); `evaluate(i)` returns
  // node i's Answer and is called only for nodes that changed since the shape was last asked.
  template <typename Evaluate>
  int Best(uint64_t key, std::span<const uint64_t> versions, std::span<const uint32_t> rank,
           Evaluate&& evaluate);

  // Forgets every shape (the policy changed).
  void Clear() {
    for (Shape& s : shapes_) s.key_valid = false;
  }

  // How many node evaluations the index asked for, and how many pods it answered (for benchmarks).
  uint64_t evaluations() const { return evaluations_; }
  uint64_t queries() const { return queries_; }

 private:
  // Shapes remembered at once: the Alibaba trace's 130% replay asks about a few hundred keys, mostly a few
  // dozen again and again; a forgotten shape is rebuilt from the evaluation cache.
  static constexpr size_t kMaxShapes = 128;

  struct Shape {
    uint64_t key = 0;
    bool key_valid = false;
    uint64_t last_use = 0;
    uint64_t synced = 0;  // the newest node version seen when the answers were last brought up to date
    std::vector<Answer> answers;
    std::vector<int32_t> tree;  // tree[1] is the winner; node i's leaf is tree[leaves + i]; -1: none fits
    size_t leaves = 0;
  };

  // The better of two nodes (-1: none).
  int32_t Better(const Shape& s, int32_t a, int32_t b) const {
    if (a < 0) return b;
    if (b < 0) return a;
    const Answer& x = s.answers[static_cast<size_t>(a)];
    const Answer& y = s.answers[static_cast<size_t>(b)];
    if (x.tier != y.tier) return x.tier > y.tier ? a : b;
    if (x.score != y.score) return x.score > y.score ? a : b;
    return rank_[static_cast<size_t>(a)] <= rank_[static_cast<size_t>(b)] ? a : b;
  }
  void Replay(Shape& s, size_t i) {
    size_t at = s.leaves + i;
    s.tree[at] = s.answers[i].fits ? static_cast<int32_t>(i) : -1;
    for (at /= 2; at >= 1; at /= 2) s.tree[at] = Better(s, s.tree[2 * at], s.tree[2 * at + 1]);
  }
  Shape& Lookup(uint64_t key, size_t nodes, bool& fresh);

  std::vector<Shape> shapes_;
  std::vector<uint32_t> rank_;  // the ranking the shapes were built with
  uint64_t clock_ = 0;
  uint64_t evaluations_ = 0;
  uint64_t queries_ = 0;
};

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
  void Clear() {
    ++generation_;
    ranked_.Clear();
  }

  RankedIndex& ranked() { return ranked_; }

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
  RankedIndex ranked_;
};

// ---------------------------------------------------------------------------------------------------------

inline RankedIndex::Shape& RankedIndex::Lookup(uint64_t key, size_t nodes, bool& fresh) {
  Shape* oldest = nullptr;
  for (Shape& s : shapes_) {
    if (s.key_valid && s.key == key) {
      fresh = s.answers.size() != nodes;  // nodes were added or removed: rebuild
      return s;
    }
    if (oldest == nullptr || !s.key_valid || (oldest->key_valid && s.last_use < oldest->last_use))
      oldest = &s;
  }
  if (shapes_.size() < kMaxShapes) {
    shapes_.emplace_back();
    oldest = &shapes_.back();
  }
  oldest->key = key;
  oldest->key_valid = true;
  fresh = true;
  return *oldest;
}

template <typename Evaluate>
int RankedIndex::Best(uint64_t key, std::span<const uint64_t> versions, std::span<const uint32_t> rank,
                      Evaluate&& evaluate) {
  ++queries_;
  if (rank.size() != rank_.size() || !std::equal(rank.begin(), rank.end(), rank_.begin())) {
    rank_.assign(rank.begin(), rank.end());
    Clear();
  }
  const size_t n = versions.size();
  bool fresh = false;
  Shape& s = Lookup(key, n, fresh);
  s.last_use = ++clock_;
  uint64_t newest = s.synced;
  if (fresh) {
    s.answers.resize(n);
    for (size_t i = 0; i < n; ++i) {
      s.answers[i] = evaluate(i);
      newest = std::max(newest, versions[i]);
    }
    evaluations_ += n;
    s.leaves = 1;
    while (s.leaves < n) s.leaves *= 2;
    s.tree.assign(2 * s.leaves, -1);
    for (size_t i = 0; i < n; ++i) s.tree[s.leaves + i] = s.answers[i].fits ? static_cast<int32_t>(i) : -1;
    for (size_t at = s.leaves - 1; at >= 1; --at) s.tree[at] = Better(s, s.tree[2 * at], s.tree[2 * at + 1]);
  } else {
    const uint64_t synced = s.synced;
    for (size_t i = 0; i < n; ++i) {
      if (versions[i] <= synced) continue;
      s.answers[i] = evaluate(i);
      ++evaluations_;
      newest = std::max(newest, versions[i]);
      Replay(s, i);
    }
  }
  s.synced = newest;
  return n == 0 ? -1 : s.tree[1];
}

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_EVALUATION_CACHE_H_
