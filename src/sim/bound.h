// How far from the optimum is a placement? A lower bound on the GPU that any placement of a pod set must
// leave unallocated, by linear programming (GLPK's simplex), and the same bound with the pods an online
// scheduler cannot refuse forced in.
//
// The relaxation (docs/quality.md, "The distance to the optimum"), over classes of identical nodes (model,
// GPU count, CPU, memory) and shapes of identical pods (GPU count, share, CPU, memory, allowed models):
//   y[c,s] >= 0   pods of shape s on class c (only where the model is allowed and the GPU count fits a node)
//   z[c,p] >= 0   GPUs of class c filled by pattern p, a multiset of shares adding up to at most one GPU
//   maximize      sum y[c,s] x GPU(s)
//   subject to    sum_c y[c,s] <= pods of shape s                      (and >= the forced ones: the floor)
//                 sum_s y[c,s] cpu(s) <= CPU of class c; the same for memory
//                 whole GPUs of y[c,.] + sum_p z[c,p] <= GPUs of class c  (whole-GPU pods need wholly free
//                 GPUs) shares v asked of class c <= sum_p z[c,p] x (copies of v in p), for each share size v
// Any placement is a solution (each GPU holding shares holds one pattern), so capacity minus the optimum is a
// bound no placement beats. The patterns are too many to list; they are generated (column generation): after
// each solve, the pattern of largest reduced cost per class is a knapsack over the share sizes, priced by the
// duals of the share rows against the dual of the class's GPU row, solved exactly by dynamic programming over
// thousandths of a GPU. When no pattern has a positive reduced cost, the LP is solved over all patterns.
// A workload whose shares take hundreds of sizes would need a pattern for nearly every pair: past
// BoundOptions::exact_share_sizes, sizes are grouped, each share rounded down to its group's smallest (still
// a relaxation, so still a bound) and, in a second LP, up to its largest (a restriction); the distance
// between the two is reported as what grouping may have cost.
//
//   absl::StatusOr<Bound> b = LowerBound(cluster, arrived_pods, forced_pods);
//
// Thread-safety: LowerBound may run concurrently (each call has its own GLPK problem).
#ifndef TESSERA_SIM_BOUND_H_
#define TESSERA_SIM_BOUND_H_

#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/request.h"

namespace tessera::sim {

struct Bound {
  double max_allocated_milli = 0;  // the LP's optimum: GPU placed, thousandths
  double unallocated_pct = 0;      // (capacity - optimum) / capacity, %
  int patterns = 0;                // patterns generated
  int iterations = 0;              // LP solves
  bool feasible = true;            // false: not even the relaxation places every forced pod
  // Share sizes grouped (BoundOptions): the bound is the relaxed LP's, and `grouping_slack_pct` the distance
  // to the restricted one, which the exact LP lies within (NaN: the restriction could not place every forced
  // pod). Not grouped: the LP is exact and the slack 0.
  bool share_sizes_grouped = false;
  double grouping_slack_pct = 0;
};

struct BoundOptions {
  // Up to this many distinct share sizes, one share row each (the exact LP); more are grouped into
  // `share_groups` groups of consecutive sizes. The shared traces have at most 20; bench/variants.py's
  // odd-shares 875, where 128 groups take about 5 minutes a seed (four LPs) and leave the exact bound within
  // 0.3 points.
  size_t exact_share_sizes = 128;
  size_t share_groups = 128;
};

// The bound for placing `pods` on the (empty) `cluster`, with every pod of `forced` (a subset of `pods`, by
// address) placed. Pods whose share follows their memory (known only on a GPU) are left out: they can only
// loosen the bound.
absl::StatusOr<Bound> LowerBound(const core::Cluster& cluster, std::span<const core::PodRequest* const> pods,
                                 std::span<const core::PodRequest* const> forced = {},
                                 const BoundOptions& options = {});

struct SeedBound {
  uint64_t seed = 0;
  Bound offline;       // no pod forced
  Bound online_floor;  // every pod that arrived before `forced_until` of capacity placed
};

// For one seed of the FGD protocol (sim/replay.h): the pods arrived when they ask for 100% of the cluster's
// GPUs, in the order Replay uses, and the bound without and with the early pods forced.
absl::StatusOr<SeedBound> BoundForSeed(const core::Cluster& cluster,
                                       const std::vector<core::PodRequest>& pods, int64_t capacity_milli,
                                       uint64_t seed, double inflate, double forced_until = 0.95);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_BOUND_H_
