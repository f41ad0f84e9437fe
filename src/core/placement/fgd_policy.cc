// FGD, fragmentation gradient descent (Weng et al., ATC '23): each pod goes where the cluster's GPU
// fragmentation (fragmentation.h) grows least, scored as the FGD study's simulator scores it.
#include <algorithm>
#include <cmath>

#include "core/placement/policies_internal.h"

namespace tessera::core {

namespace {

// The study's score of a fragmentation change: int(100 * sigmoid(decrease / 1000)).
double StudyScore(double decrease) {
  return std::floor(100.0 / (1.0 + std::exp(-decrease / 1000.0)));
}

class FgdPolicy : public Policy {
 public:
  explicit FgdPolicy(std::shared_ptr<const FragmentationModel> model)
      : model_(model), views_(std::move(model)) {}
  std::string_view name() const override { return "fgd"; }

  bool SelectGpus(const NodeScratch& node, const CompiledRequest& pod, std::span<const VGpuDemand> vgpus,
                  GpuMask eligible, Rng&, std::span<int8_t> out, double& cost) const override {
    const FragmentationViews::View& e = views_.Get(node.node());
    // Earlier containers of this pod already changed some GPUs: start from there. The pod's CPU is taken
    // once: in the first container's change, and already in the others' "before".
    FragmentationViews::Changes changes;
    size_t n = FragmentationViews::EarlierChanges(node, changes);
    const MilliCpu cpu = pod.request().cpu;
    const double before = n == 0 ? e.fragment : model_->FragmentAfter(e.node, cpu, {changes.data(), n});
    if (vgpus.size() == 1 && !vgpus[0].exclusive()) {
      // A share: the GPU whose use grows fragmentation least; the first such GPU on ties, as in the study.
      double best = -1;
      int best_gpu = -1;
      // GPUs with the same free share score the same, and a later GPU wins only when strictly better: each
      // free share needs scoring once.
      std::array<MilliGpu, kMaxGpusPerNode> seen;
      size_t seen_count = 0;
      for (int g : node.Fitting(vgpus[0], eligible)) {
        const MilliGpu free = node.free_cores(g);
        if (std::find(seen.begin(), seen.begin() + static_cast<std::ptrdiff_t>(seen_count), free) !=
            seen.begin() + static_cast<std::ptrdiff_t>(seen_count)) {
          continue;
        }
        seen[seen_count++] = free;
        changes[n] = {free, free - node.RealizeOn(vgpus[0], g).cores};
        const double s = StudyScore(before - model_->FragmentAfter(e.node, cpu, {changes.data(), n + 1}));
        if (s > best) {
          best = s;
          best_gpu = g;
        }
      }
      if (best_gpu < 0) return false;
      out[0] = static_cast<int8_t>(best_gpu);
      cost -= best;
      return true;
    }
    if (!StudyBestGpus(node, vgpus, eligible, out)) return false;
    for (size_t i = 0; i < vgpus.size(); ++i) {
      const MilliGpu free = node.free_cores(out[i]);
      changes[n++] = {free, free - node.RealizeOn(vgpus[i], out[i]).cores};
    }
    cost -= StudyScore(before - model_->FragmentAfter(e.node, cpu, {changes.data(), n}));
    return true;
  }

  double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice& choice,
               Rng&) const override {
    if (choice.count > 0) return -choice.selection_cost;
    // A pod without GPU: its CPU changes which typical pods still fit.
    const FragmentationViews::View& e = views_.Get(after.node());
    return StudyScore(e.fragment - model_->FragmentAfter(e.node, pod.request().cpu, {}));
  }

 private:
  std::shared_ptr<const FragmentationModel> model_;
  FragmentationViews views_;
};

}  // namespace

const FragmentationViews::View& FragmentationViews::Get(const NodeState& node) const {
  View& v = views_[&node];
  if (v.version != node.version()) {
    v.version = node.version();
    v.node = model_->Prepare(node);
    v.fragment = model_->Fragment(v.node);
  }
  return v;
}

size_t FragmentationViews::EarlierChanges(const NodeScratch& scratch, Changes& out) {
  size_t n = 0;
  for (int g = 0; g < scratch.gpu_count(); ++g) {
    const MilliGpu before = scratch.node().free_cores(g);
    if (scratch.free_cores(g) != before) out[n++] = {before, scratch.free_cores(g)};
  }
  return n;
}

std::unique_ptr<Policy> NewFgdPolicy(const PolicyContext& context) {
  return std::make_unique<FgdPolicy>(context.fragmentation);
}

}  // namespace tessera::core
