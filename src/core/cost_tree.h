// The resource-access cost tree of the Gaia Scheduler (Song et al., "Gaia Scheduler: A Kubernetes-based
// Scheduler Framework", section III-B), and its allocation algorithms 1-4.
//
// Leaves are the GPUs of one node. Each inner node joins GPUs that are all connected at one link level
// (NVLink, PIX, PXB, PHB, NODE, SYS) and carries that level's access cost; a GPU leaf carries the cost of the
// level that joins it to its nearest siblings. The tree is built from the pairwise link matrix by
// complete-linkage clustering, nearest level first: at each level, groups whose every cross pair is at most
// that far apart are joined under one new node.
//
// The tree holds only the structure. The use of each GPU (its free share) is passed to every operation, so
// the paper's per-node counters (free whole GPUs, fragment GPUs) are computed from the truth each time, in
// one pass over at most 2n nodes, and can never disagree with it.
//
//   absl::StatusOr<AccessCostTree> tree = AccessCostTree::Build(links);
//   std::vector<MilliGpu> free = ...;                  // per GPU index, 0..1000
//   std::optional<GpuMask> gpus = tree->Schedule(free, GpuMask::All(n), MilliGpu(2000), rng);   // 2 GPUs
//
// Thread-safety: immutable after Build; the operations are const and may run concurrently with their own Rng.
#ifndef TESSERA_CORE_COST_TREE_H_
#define TESSERA_CORE_COST_TREE_H_

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/gpu_mask.h"
#include "core/random.h"
#include "core/topology.h"
#include "core/units.h"

namespace tessera::core {

class AccessCostTree {
 public:
  struct Node {
    int parent = -1;
    std::vector<int> children;
    int gpu = -1;  // leaves: the GPU index; inner nodes: -1
    Link level;    // inner nodes: the link level that joins the children
    int cost = 0;  // inner nodes: the level's access cost; leaves: the cost of the parent's level
    GpuMask gpus;  // the GPUs under this node
  };

  // Builds the tree of the GPUs in `links` (1..64 GPUs).
  static absl::StatusOr<AccessCostTree> Build(const LinkMatrix& links);

  int root() const { return root_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  int gpu_count() const { return gpu_count_; }
  const Node& node(int i) const { return nodes_[static_cast<size_t>(i)]; }
  int leaf(int gpu) const { return leaf_of_[static_cast<size_t>(gpu)]; }

  // Access cost of one GPU (the paper's GPU-node communication overhead).
  int AccessCost(int gpu) const { return node(leaf(gpu)).cost; }
  // Cost of the lowest node that holds all of `gpus`: what traffic among them pays. 0 for one GPU.
  int CostOf(GpuMask gpus) const;

  // Algorithm 2, Fragment (0 < m < 1 GPU): among fragment GPUs (partly used) with at least m free, the one
  // with the least free (best fit); if none, the wholly free GPU of lowest access cost. Ties: random.
  std::optional<int> ScheduleFragment(std::span<const MilliGpu> free, GpuMask eligible, MilliGpu m,
                                      Rng& rng) const;

  // Algorithm 3, Singular (m = 1 GPU): a wholly free GPU whose siblings are not wholly free (so intact groups
  // stay intact; a GPU with no sibling GPUs qualifies too), lowest access cost first; if none, the wholly
  // free GPU of lowest access cost. Ties: random.
  std::optional<int> ScheduleSingular(std::span<const MilliGpu> free, GpuMask eligible, Rng& rng) const;

  // Algorithm 4, Link (m > 1 whole GPUs): the subtree of lowest total cost (m x its level cost) that holds m
  // wholly free GPUs, and m GPUs inside it. The paper leaves ties open: among subtrees of equal cost the one
  // with the fewest free GPUs wins (best fit), then a random one. Within the subtree, children whose free
  // GPUs add up to exactly m are taken whole, fewest children first, so the rest stay intact.
  std::optional<GpuMask> ScheduleLink(std::span<const MilliGpu> free, GpuMask eligible, int m,
                                      Rng& rng) const;

  // Algorithm 1, the main algorithm: Fragment for 0 < m < 1000, Singular for m = 1000, Link for m > 1000
  // (a multiple of 1000). Returns the chosen GPUs.
  std::optional<GpuMask> Schedule(std::span<const MilliGpu> free, GpuMask eligible, MilliGpu m,
                                  Rng& rng) const;

  // An indented picture, one node a line:  "SYS (60)\n  PIX (20)\n    GPU0\n    GPU1\n ..."
  std::string ToString() const;

 private:
  GpuMask PickWithin(int node_index, GpuMask available, int m, Rng& rng) const;

  std::vector<Node> nodes_;
  std::vector<int> leaf_of_;
  int root_ = -1;
  int gpu_count_ = 0;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_COST_TREE_H_
