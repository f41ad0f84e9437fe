// The baselines of the FGD study (Weng et al., ATC '23, section 6.1), as its simulator scores them, so that
// Tessera's simulator reproduces the paper's table: random, best fit, dot product, GPU packing and GPU
// clustering. Scores are whole numbers, as in the study, so that ties (and how they are broken) match.
#include <cmath>

#include "core/placement/policies_internal.h"

namespace tessera::core {

bool StudyBestGpus(const NodeScratch& node, std::span<const VGpuDemand> vgpus, GpuMask eligible,
                   std::span<int8_t> out) {
  GpuMask taken;
  for (size_t i = 0; i < vgpus.size(); ++i) {
    const GpuMask fitting = node.Fitting(vgpus[i], eligible & ~taken);
    if (fitting.Empty()) return false;
    int best = -1;
    if (vgpus[i].exclusive()) {
      best = *fitting.begin();
    } else {
      for (int g : fitting) {
        if (best < 0 || node.free_cores(g) < node.free_cores(best)) best = g;
      }
    }
    out[i] = static_cast<int8_t>(best);
    taken.Add(best);
  }
  return true;
}

namespace {

// A node's free GPU in thousandths, before the pod (healthy GPUs).
double FreeGpuBefore(const NodeScratch& after) {
  return after.node().total_free_cores().value();
}

class StudyPolicy : public Policy {
 public:
  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng&, std::span<int8_t> out, double&) const override {
    return StudyBestGpus(node, vgpus, eligible, out);
  }
};

// Random: a uniformly random feasible node, a uniformly random fitting GPU for a share.
class RandomPolicy : public Policy {
 public:
  std::string_view name() const override { return "random"; }
  bool deterministic() const override { return false; }
  bool SelectGpus(const NodeScratch& node, const CompiledRequest&, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng& rng, std::span<int8_t> out, double&) const override {
    GpuMask taken;
    for (size_t i = 0; i < vgpus.size(); ++i) {
      const GpuMask fitting = node.Fitting(vgpus[i], eligible & ~taken);
      if (fitting.Empty()) return false;
      int pick = *fitting.begin();
      if (!vgpus[i].exclusive()) {
        uint32_t seen = 0;
        for (int g : fitting) {
          if (rng.Uniform(++seen) == 0) pick = g;
        }
      }
      out[i] = static_cast<int8_t>(pick);
      taken.Add(pick);
    }
    return true;
  }
  double Score(const NodeScratch&, const CompiledRequest&, const PodChoice&, Rng& rng) const override {
    return rng.UniformDouble();
  }
};

// Best fit: the node with the least CPU and GPU left after the pod, each normalized by the largest node.
class BestFitPolicy : public StudyPolicy {
 public:
  explicit BestFitPolicy(const PolicyContext& c)
      : cpu_(static_cast<double>(c.max_node_cpu.value())), gpu_(1000.0 * c.max_node_gpus) {}
  std::string_view name() const override { return "bestfit"; }
  double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice&, Rng&) const override {
    const double cpu_left = static_cast<double>((after.node().free_cpu() - pod.request().cpu).value());
    const double gpu_left = FreeGpuBefore(after) - after.taken_cores().value();
    return std::floor(100.0 * (1.0 - (0.5 * cpu_left / cpu_ + 0.5 * gpu_left / gpu_)));
  }

 private:
  double cpu_;
  double gpu_;
};

// Dot product: the node whose free (CPU, GPU) vector aligns least with the pod's demand (Tetris-style), both
// normalized by the largest node.
class DotProductPolicy : public StudyPolicy {
 public:
  explicit DotProductPolicy(const PolicyContext& c)
      : cpu_(static_cast<double>(c.max_node_cpu.value())), gpu_(1000.0 * c.max_node_gpus) {}
  std::string_view name() const override { return "dotprod"; }
  double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice&, Rng&) const override {
    const double cpu_free = static_cast<double>(after.node().free_cpu().value());
    const double cpu_ask = static_cast<double>(pod.request().cpu.value());
    const double gpu_ask = after.taken_cores().value();
    const double dot = cpu_free * cpu_ask / (cpu_ * cpu_) + FreeGpuBefore(after) * gpu_ask / (gpu_ * gpu_);
    return std::floor(100.0 * (1.0 - dot / 2.0));
  }

 private:
  double cpu_;
  double gpu_;
};

// GPU packing: shares first onto partly used GPUs (the fuller the better), then onto nodes with some GPUs in
// use, and idle nodes last, so that whole GPUs stay whole.
class PackingPolicy : public StudyPolicy {
 public:
  std::string_view name() const override { return "packing"; }
  double Score(const NodeScratch& after, const CompiledRequest&, const PodChoice& choice,
               Rng&) const override {
    if (choice.count == 0) return 0;
    const NodeState& node = after.node();
    const int free_gpus = node.whole_free_gpus();
    if (free_gpus == node.healthy().Count()) return std::max(33 - free_gpus, free_gpus);  // an idle node
    int whole_used = 0;
    for (int i = 0; i < choice.count; ++i) {
      if (node.free_cores(choice.gpus[static_cast<size_t>(i)]) >= kWholeGpu) ++whole_used;
    }
    if (whole_used > 0) return std::max(50 - whole_used, 33);
    // Only partly used GPUs: the less free the GPU chosen had, the better.
    return 100 - node.free_cores(choice.gpus[0]).value() / 100;
  }
};

// GPU clustering: pods of one shape together (nodes holding only that shape first, then nodes holding it
// among others, then idle nodes), and fuller nodes first within each group.
class ClusteringPolicy : public StudyPolicy {
 public:
  explicit ClusteringPolicy(const PolicyContext& c) : gpu_(1000 * c.max_node_gpus) {}
  std::string_view name() const override { return "clustering"; }
  double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice& choice,
               Rng&) const override {
    if (choice.count == 0) return 0;
    const NodeState& node = after.node();
    const int64_t base = 25 * (gpu_ - node.total_free_cores().value()) / gpu_;
    const int tag = pod.shape_tag();
    const auto shapes = node.pod_shapes();
    bool has = false;
    for (const auto& [shape, count] : shapes) has = has || (shape == tag && count > 0);
    if (has) return static_cast<double>(base + (shapes.size() == 1 ? 75 : 50));
    return static_cast<double>(base + (shapes.empty() ? 25 : 0));
  }

 private:
  int64_t gpu_;
};

}  // namespace

std::unique_ptr<Policy> NewRandomPolicy() {
  return std::make_unique<RandomPolicy>();
}
std::unique_ptr<Policy> NewBestFitPolicy(const PolicyContext& c) {
  return std::make_unique<BestFitPolicy>(c);
}
std::unique_ptr<Policy> NewDotProductPolicy(const PolicyContext& c) {
  return std::make_unique<DotProductPolicy>(c);
}
std::unique_ptr<Policy> NewPackingPolicy() {
  return std::make_unique<PackingPolicy>();
}
std::unique_ptr<Policy> NewClusteringPolicy(const PolicyContext& c) {
  return std::make_unique<ClusteringPolicy>(c);
}

}  // namespace tessera::core
