// The placement policies of the seed papers: Gaia's topology-aware allocation, binpack and spread (GPU
// Sharing in Kubernetes, HAMi), and gpushare's memory binpack. See docs/placement.md.
#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "core/placement/policies_internal.h"
#include "core/strings.h"

namespace tessera::core {

Realized Realize(const VGpuDemand& demand, MiB gpu_memory, const PlacementOptions& options) {
  Realized r;
  switch (demand.memory.kind) {
    case MemorySpec::Kind::kMiB:
      r.memory_limit = MiB(demand.memory.value);
      break;
    case MemorySpec::Kind::kPercent:
      r.memory_limit = MiB(gpu_memory.value() * demand.memory.value / 100);
      break;
    case MemorySpec::Kind::kDefault:
      break;
  }
  r.cores = demand.cores.value() > 0 ? demand.cores : ProportionalShare(r.memory_limit, gpu_memory);
  if (demand.memory.kind == MemorySpec::Kind::kDefault) {
    r.memory_limit =
        (IsWholeGpu(r.cores) || options.default_memory == PlacementOptions::DefaultMemory::kWholeGpuMemory)
            ? gpu_memory
            : ProportionalMemory(r.cores, gpu_memory);
  }
  r.memory_accounted = IsWholeGpu(r.cores) ? gpu_memory : r.memory_limit;
  return r;
}

// NOLINTNEXTLINE: the arrays are filled for the node's GPUs only, on purpose.
NodeScratch::NodeScratch(const NodeState& node, const PlacementOptions& options)
    : node_(&node), options_(&options), n_(node.gpu_count()) {
  Reset();
}

void NodeScratch::Reset() {
  for (int g = 0; g < n_; ++g) {
    free_cores_[g] = node_->free_cores(g);
    free_memory_[g] = node_->free_memory(g);
  }
  taken_cores_ = MilliGpu(0);
  taken_memory_ = MiB(0);
}

GpuMask NodeScratch::Fitting(const VGpuDemand& demand, GpuMask eligible) const {
  GpuMask out;
  if (node_->uniform_memory().value() > 0) {
    // Every GPU has the same size: realize the demand once.
    const Realized r = Realize(demand, node_->uniform_memory(), *options_);
    for (int g : eligible) {
      if (Fits(r, g)) out.Add(g);
    }
    return out;
  }
  for (int g : eligible) {
    if (Fits(demand, g)) out.Add(g);
  }
  return out;
}

void NodeScratch::Take(const VGpuDemand& demand, int g) {
  Realized r = RealizeOn(demand, g);
  free_cores_[g] -= r.cores;
  free_memory_[g] -= r.memory_accounted;
  taken_cores_ += r.cores;
  taken_memory_ += r.memory_accounted;
}

namespace {

// Share of the node's healthy GPU compute and memory in use once the pod is placed, each 0..1.
std::pair<double, double> Utilization(const NodeScratch& s) {
  const NodeState& node = s.node();
  if (node.healthy_cores().value() == 0) return {1.0, 1.0};
  const double cores_free = (node.total_free_cores() - s.taken_cores()).value();
  const double mem_free = static_cast<double>((node.total_free_memory() - s.taken_memory()).value());
  return {1.0 - cores_free / node.healthy_cores().value(),
          1.0 - mem_free / static_cast<double>(node.healthy_memory().value())};
}

// Picks GPUs one vGPU at a time, each the GPU that minimizes `key(scratch, realized, gpu)`; ties random.
template <typename Key>
bool GreedySelect(const NodeScratch& node, std::span<const VGpuDemand> vgpus, GpuMask eligible, Rng& rng,
                  std::span<int8_t> out, double& cost, Key key) {
  GpuMask taken;
  const MiB uniform = node.node().uniform_memory();
  for (size_t i = 0; i < vgpus.size(); ++i) {
    TieBreaker<int, double> best(rng);
    const Realized same = Realize(vgpus[i], uniform, node.options());
    for (int g : eligible & ~taken) {
      const Realized r = uniform.value() > 0 ? same : node.RealizeOn(vgpus[i], g);
      if (node.Fits(r, g)) best.Offer(key(node, r, g), g);
    }
    if (!best.has_value()) return false;
    out[i] = static_cast<int8_t>(best.value());
    taken.Add(best.value());
    cost += best.key();
  }
  return true;
}

// Binpack (GPU Sharing in Kubernetes, HAMi "binpack"): the GPU left with the least free share, then the least
// free memory; the node most used after the placement.
class BinpackPolicy : public Policy {
 public:
  std::string_view name() const override { return "binpack"; }
  bool deterministic() const override { return false; }  // random ties
  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng& rng, std::span<int8_t> out, double& cost) const override {
    return GreedySelect(node, vgpus, eligible, rng, out, cost,
                        [](const NodeScratch& s, const Realized& r, int g) {
                          return static_cast<double>((s.free_cores(g) - r.cores).value()) * 1e6 +
                                 static_cast<double>((s.free_memory(g) - r.memory_accounted).value());
                        });
  }
  double Score(const NodeScratch& after, const CompiledRequest&, const PodChoice&, Rng&) const override {
    auto [cores, memory] = Utilization(after);
    return cores + memory;
  }
};

// Spread (HAMi "spread"): the GPU with the most free share; the node least used after the placement.
class SpreadPolicy : public Policy {
 public:
  std::string_view name() const override { return "spread"; }
  bool deterministic() const override { return false; }  // random ties
  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng& rng, std::span<int8_t> out, double& cost) const override {
    return GreedySelect(node, vgpus, eligible, rng, out, cost,
                        [](const NodeScratch& s, const Realized& r, int g) {
                          return -(static_cast<double>((s.free_cores(g) - r.cores).value()) * 1e6 +
                                   static_cast<double>((s.free_memory(g) - r.memory_accounted).value()));
                        });
  }
  double Score(const NodeScratch& after, const CompiledRequest&, const PodChoice&, Rng&) const override {
    auto [cores, memory] = Utilization(after);
    return -(cores + memory);
  }
};

// gpushare (Aliyun's GPU Sharing scheduler extender): memory is the only measure. The GPU with the least free
// memory that fits ("GPU1 (8138), which has the least remaining resources, is selected"); the node with the
// most memory in use.
class GpusharePolicy : public Policy {
 public:
  std::string_view name() const override { return "gpushare"; }
  bool deterministic() const override { return false; }  // random ties
  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng& rng, std::span<int8_t> out, double& cost) const override {
    return GreedySelect(node, vgpus, eligible, rng, out, cost,
                        [](const NodeScratch& s, const Realized&, int g) {
                          return static_cast<double>(s.free_memory(g).value());
                        });
  }
  double Score(const NodeScratch& after, const CompiledRequest&, const PodChoice&, Rng&) const override {
    return Utilization(after).second;
  }
};

// Gaia (Song et al., Algorithms 1-4) on each node's access-cost tree. Whole vGPUs go by Singular (one) or
// Link (several), shares by Fragment. Across nodes, the node whose choice Gaia ranks best: a fitting fragment
// before a whole GPU (best fit first), a GPU that breaks no intact group before one that does, lower access
// cost first; as if the nodes were subtrees of one cluster-wide tree.
class GaiaPolicy : public Policy {
 public:
  std::string_view name() const override { return "gaia"; }
  bool deterministic() const override { return false; }  // random ties

  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng& rng, std::span<int8_t> out, double& cost) const override {
    const AccessCostTree& tree = node.node().tree();
    std::span<const MilliGpu> free = node.free_cores();
    GpuMask taken;
    // Whole GPUs first, linked by topology.
    std::array<size_t, kMaxGpusPerNode> whole{};
    size_t whole_count = 0;
    for (size_t i = 0; i < vgpus.size(); ++i) {
      if (vgpus[i].exclusive()) whole[whole_count++] = i;
    }
    if (whole_count > 0) {
      const GpuMask candidates = node.Fitting(vgpus[whole[0]], eligible);
      std::optional<GpuMask> chosen;
      if (whole_count == 1) {
        std::optional<int> g = tree.ScheduleSingular(free, candidates, rng);
        if (!g) return false;
        chosen = GpuMask::Of(*g);
        cost += SingularCost(tree, free, *g);
      } else {
        chosen = tree.ScheduleLink(free, candidates, static_cast<int>(whole_count), rng);
        if (!chosen || chosen->Count() != static_cast<int>(whole_count)) return false;
        cost += static_cast<double>(whole_count) * tree.CostOf(*chosen);
      }
      size_t k = 0;
      for (int g : *chosen) out[whole[k++]] = static_cast<int8_t>(g);
      taken = *chosen;
    }
    // Then each share, by Fragment, on GPUs not yet used by this container.
    for (size_t i = 0; i < vgpus.size(); ++i) {
      if (vgpus[i].exclusive()) continue;
      const GpuMask candidates = node.Fitting(vgpus[i], eligible & ~taken);
      if (candidates.Empty()) return false;
      // Every candidate fits its own realized share; Fragment's "m <= free" must not exclude any of them.
      MilliGpu m = kWholeGpu;
      for (int g : candidates) m = std::min(m, node.RealizeOn(vgpus[i], g).cores);
      std::optional<int> g = tree.ScheduleFragment(free, candidates, m, rng);
      if (!g) return false;
      out[i] = static_cast<int8_t>(*g);
      taken.Add(*g);
      const MilliGpu f = free[static_cast<size_t>(*g)];
      cost += f < kWholeGpu ? static_cast<double>(f.value()) : 1000.0 + tree.AccessCost(*g);
    }
    return true;
  }

  double Score(const NodeScratch&, const CompiledRequest&, const PodChoice& choice, Rng&) const override {
    return -choice.selection_cost;
  }

 private:
  // Singular's ranking of its choice: a GPU that breaks no intact group ranks by access cost; one that does,
  // after all of those.
  static double SingularCost(const AccessCostTree& tree, std::span<const MilliGpu> free, int g) {
    const AccessCostTree::Node& leaf = tree.node(tree.leaf(g));
    bool sibling_free = false;
    if (leaf.parent >= 0) {
      for (int c : tree.node(leaf.parent).children) {
        const AccessCostTree::Node& s = tree.node(c);
        if (s.gpu >= 0 && s.gpu != g && free[static_cast<size_t>(s.gpu)] >= kWholeGpu) sibling_free = true;
      }
    }
    return (sibling_free ? 100.0 : 0.0) + leaf.cost;
  }
};

}  // namespace

std::unique_ptr<Policy> NewBinpackPolicy() {
  return std::make_unique<BinpackPolicy>();
}
std::unique_ptr<Policy> NewSpreadPolicy() {
  return std::make_unique<SpreadPolicy>();
}
std::unique_ptr<Policy> NewGpusharePolicy() {
  return std::make_unique<GpusharePolicy>();
}
std::unique_ptr<Policy> NewGaiaPolicy() {
  return std::make_unique<GaiaPolicy>();
}

}  // namespace tessera::core
