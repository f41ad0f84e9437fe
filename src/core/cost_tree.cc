#include "core/cost_tree.h"

#include <algorithm>
#include <array>
#include <functional>

#include "absl/status/status.h"
#include "core/strings.h"

namespace tessera::core {

namespace {

// Wholly free GPUs among `eligible`.
GpuMask WhollyFree(std::span<const MilliGpu> free, GpuMask eligible) {
  GpuMask out;
  for (int g : eligible) {
    if (free[static_cast<size_t>(g)] >= kWholeGpu) out.Add(g);
  }
  return out;
}

}  // namespace

absl::StatusOr<AccessCostTree> AccessCostTree::Build(const LinkMatrix& links) {
  const int n = links.size();
  if (n < 1 || n > kMaxGpusPerNode) {
    return absl::InvalidArgumentError(
        StrCat("a node must have between 1 and ", kMaxGpusPerNode, " GPUs for its cost tree, not ", n));
  }
  AccessCostTree tree;
  tree.gpu_count_ = n;
  tree.leaf_of_.resize(static_cast<size_t>(n));
  std::vector<int> clusters;  // roots of the current clusters
  for (int g = 0; g < n; ++g) {
    Node leaf;
    leaf.gpu = g;
    leaf.gpus = GpuMask::Of(g);
    tree.leaf_of_[static_cast<size_t>(g)] = static_cast<int>(tree.nodes_.size());
    clusters.push_back(static_cast<int>(tree.nodes_.size()));
    tree.nodes_.push_back(std::move(leaf));
  }

  // The farthest link between two clusters (complete linkage).
  auto farthest = [&](GpuMask a, GpuMask b) {
    Link worst = Link::Self();
    for (int x : a) {
      for (int y : b) {
        if (links.at(x, y).Cost() > worst.Cost()) worst = links.at(x, y);
      }
    }
    return worst;
  };

  std::vector<int> costs;
  for (int a = 0; a < n; ++a) {
    for (int b = a + 1; b < n; ++b) costs.push_back(links.at(a, b).Cost());
  }
  std::sort(costs.begin(), costs.end());
  costs.erase(std::unique(costs.begin(), costs.end()), costs.end());

  for (int level_cost : costs) {
    // Greedy cliques, lowest GPU first: a cluster joins a group when it is within level_cost of every member.
    std::vector<bool> used(clusters.size(), false);
    std::vector<int> next;
    for (size_t i = 0; i < clusters.size(); ++i) {
      if (used[i]) continue;
      used[i] = true;
      std::vector<int> group{clusters[i]};
      GpuMask members = tree.nodes_[static_cast<size_t>(clusters[i])].gpus;
      for (size_t j = i + 1; j < clusters.size(); ++j) {
        if (used[j]) continue;
        GpuMask other = tree.nodes_[static_cast<size_t>(clusters[j])].gpus;
        if (farthest(members, other).Cost() <= level_cost) {
          used[j] = true;
          group.push_back(clusters[j]);
          members = members | other;
        }
      }
      if (group.size() == 1) {
        next.push_back(group[0]);
        continue;
      }
      Node inner;
      inner.gpus = members;
      inner.children = group;
      // The level is the farthest link inside the group (it has cost level_cost).
      Link level = Link::Self();
      for (int a : members) {
        for (int b : members) {
          if (links.at(a, b).Cost() > level.Cost()) level = links.at(a, b);
        }
      }
      inner.level = level;
      inner.cost = level.Cost();
      const int index = static_cast<int>(tree.nodes_.size());
      for (int c : group) tree.nodes_[static_cast<size_t>(c)].parent = index;
      tree.nodes_.push_back(std::move(inner));
      next.push_back(index);
    }
    clusters = std::move(next);
    if (clusters.size() == 1) break;
  }
  tree.root_ = clusters.front();
  // A leaf's access cost is the cost of the level that joins it to its siblings.
  for (Node& node : tree.nodes_) {
    if (node.gpu >= 0) node.cost = node.parent >= 0 ? tree.nodes_[static_cast<size_t>(node.parent)].cost : 0;
  }
  return tree;
}

int AccessCostTree::CostOf(GpuMask gpus) const {
  if (gpus.Count() <= 1) return 0;
  int best = node(root_).cost;
  for (const Node& n : nodes_) {
    if (n.gpu < 0 && (n.gpus & gpus) == gpus) best = std::min(best, n.cost);
  }
  return best;
}

std::optional<int> AccessCostTree::ScheduleFragment(std::span<const MilliGpu> free, GpuMask eligible,
                                                    MilliGpu m, Rng& rng) const {
  // Step 1: fragment GPUs (partly allocated) with m <= free < 1; the one with the least free.
  TieBreaker<int> best_fragment(rng);
  for (int g : eligible) {
    MilliGpu f = free[static_cast<size_t>(g)];
    if (f >= m && f < kWholeGpu) best_fragment.Offer(f.value(), g);
  }
  if (best_fragment.has_value()) return best_fragment.value();
  // Step 2: the wholly free GPU of lowest access cost.
  TieBreaker<int> best_whole(rng);
  for (int g : WhollyFree(free, eligible)) best_whole.Offer(AccessCost(g), g);
  if (best_whole.has_value()) return best_whole.value();
  return std::nullopt;
}

std::optional<int> AccessCostTree::ScheduleSingular(std::span<const MilliGpu> free, GpuMask eligible,
                                                    Rng& rng) const {
  const GpuMask whole = WhollyFree(free, eligible);
  // All wholly free GPUs, whether eligible or not: a sibling that is free keeps its group intact.
  GpuMask any_whole;
  for (int g = 0; g < gpu_count_; ++g) {
    if (free[static_cast<size_t>(g)] >= kWholeGpu) any_whole.Add(g);
  }
  TieBreaker<int> best_broken(rng);
  TieBreaker<int> best_any(rng);
  for (int g : whole) {
    const Node& leaf_node = node(leaf(g));
    bool sibling_free = false;
    if (leaf_node.parent >= 0) {
      for (int c : node(leaf_node.parent).children) {
        const Node& sibling = node(c);
        if (sibling.gpu >= 0 && sibling.gpu != g && any_whole.Has(sibling.gpu)) sibling_free = true;
      }
    }
    if (!sibling_free) best_broken.Offer(leaf_node.cost, g);
    best_any.Offer(leaf_node.cost, g);
  }
  if (best_broken.has_value()) return best_broken.value();
  if (best_any.has_value()) return best_any.value();
  return std::nullopt;
}

std::optional<GpuMask> AccessCostTree::ScheduleLink(std::span<const MilliGpu> free, GpuMask eligible, int m,
                                                    Rng& rng) const {
  const GpuMask whole = WhollyFree(free, eligible);
  if (m < 1 || whole.Count() < m) return std::nullopt;
  // Lowest total cost; among equals, the subtree with the fewest free GPUs (best fit), so that a subtree
  // that could serve a larger request later stays intact; then random.
  TieBreaker<int, std::pair<int64_t, int>> best(rng);
  for (int i = 0; i < size(); ++i) {
    const Node& n = node(i);
    if (n.gpu >= 0 && m > 1) continue;
    const int free_here = (n.gpus & whole).Count();
    if (free_here >= m) best.Offer({static_cast<int64_t>(m) * n.cost, free_here}, i);
  }
  if (!best.has_value()) return std::nullopt;
  return PickWithin(best.value(), whole, m, rng);
}

GpuMask AccessCostTree::PickWithin(int node_index, GpuMask available, int m, Rng& rng) const {
  const Node& n = node(node_index);
  GpuMask here = n.gpus & available;
  if (here.Count() == m) return here;
  if (n.gpu >= 0) return here;

  struct Child {
    int index;
    int count;
  };
  std::array<Child, kMaxGpusPerNode> children{};
  size_t k = 0;
  for (int c : n.children) {
    int count = (node(c).gpus & available).Count();
    if (count > 0) children[k++] = {c, count};
  }
  // A child that alone holds m: the nearest such child, best fit (fewest free) on equal cost.
  TieBreaker<int, std::pair<int, int>> inner(rng);
  for (size_t i = 0; i < k; ++i) {
    if (children[i].count >= m)
      inner.Offer({node(children[i].index).cost, children[i].count}, children[i].index);
  }
  if (inner.has_value()) return PickWithin(inner.value(), available, m, rng);

  // Children whose free GPUs add up to exactly m, fewest children: 0/1 knapsack over sums, remembering which
  // children make each sum.
  constexpr int kUnreachable = 1 << 20;
  std::array<int, kMaxGpusPerNode + 1> fewest;
  std::array<uint64_t, kMaxGpusPerNode + 1> used{};
  fewest.fill(kUnreachable);
  fewest[0] = 0;
  for (size_t i = 0; i < k; ++i) {
    for (int sum = m; sum >= children[i].count; --sum) {
      const int prev = sum - children[i].count;
      if (fewest[static_cast<size_t>(prev)] + 1 < fewest[static_cast<size_t>(sum)]) {
        fewest[static_cast<size_t>(sum)] = fewest[static_cast<size_t>(prev)] + 1;
        used[static_cast<size_t>(sum)] = used[static_cast<size_t>(prev)] | (uint64_t{1} << i);
      }
    }
  }
  GpuMask picked;
  if (fewest[static_cast<size_t>(m)] < kUnreachable) {
    for (size_t i = 0; i < k; ++i) {
      if (used[static_cast<size_t>(m)] >> i & 1U)
        picked = picked | (node(children[i].index).gpus & available);
    }
    return picked;
  }
  // No exact fit: whole children, largest first, then the remainder from the child that fits it best.
  std::stable_sort(children.begin(), children.begin() + static_cast<std::ptrdiff_t>(k),
                   [](const Child& a, const Child& b) { return a.count > b.count; });
  int remaining = m;
  uint64_t taken = 0;
  for (size_t i = 0; i < k && remaining > 0; ++i) {
    if (children[i].count <= remaining) {
      picked = picked | (node(children[i].index).gpus & available);
      remaining -= children[i].count;
      taken |= uint64_t{1} << i;
    }
  }
  if (remaining > 0) {
    TieBreaker<int, std::pair<int, int>> rest(rng);
    for (size_t i = 0; i < k; ++i) {
      if (!(taken >> i & 1U) && children[i].count >= remaining) {
        rest.Offer({children[i].count, node(children[i].index).cost}, children[i].index);
      }
    }
    if (rest.has_value()) picked = picked | PickWithin(rest.value(), available, remaining, rng);
  }
  return picked;
}

std::optional<GpuMask> AccessCostTree::Schedule(std::span<const MilliGpu> free, GpuMask eligible, MilliGpu m,
                                                Rng& rng) const {
  if (m.value() <= 0) return std::nullopt;
  if (m < kWholeGpu) {
    std::optional<int> g = ScheduleFragment(free, eligible, m, rng);
    return g ? std::optional<GpuMask>(GpuMask::Of(*g)) : std::nullopt;
  }
  if (m == kWholeGpu) {
    std::optional<int> g = ScheduleSingular(free, eligible, rng);
    return g ? std::optional<GpuMask>(GpuMask::Of(*g)) : std::nullopt;
  }
  if (m.value() % kWholeGpu.value() != 0) return std::nullopt;  // the paper: above one GPU, whole GPUs only
  return ScheduleLink(free, eligible, m.value() / kWholeGpu.value(), rng);
}

std::string AccessCostTree::ToString() const {
  std::string out;
  std::function<void(int, int)> walk = [&](int i, int depth) {
    const Node& n = node(i);
    out.append(static_cast<size_t>(depth * 2), ' ');
    if (n.gpu >= 0) {
      StrAppend(&out, "GPU", n.gpu, " (", n.cost, ")\n");
    } else {
      StrAppend(&out, n.level.ToString(), " (", n.cost, ")\n");
    }
    for (int c : n.children) walk(c, depth + 1);
  };
  walk(root_, 0);
  return out;
}

}  // namespace tessera::core
