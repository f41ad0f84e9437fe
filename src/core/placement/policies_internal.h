// The policies' constructors and helpers they share; the registry (registry.cc) names them. Not part of the
// core's interface: use MakePolicy.
#ifndef TESSERA_CORE_PLACEMENT_POLICIES_INTERNAL_H_
#define TESSERA_CORE_PLACEMENT_POLICIES_INTERNAL_H_

#include <array>
#include <memory>
#include <unordered_map>
#include <utility>

#include "core/placement/policy.h"

namespace tessera::core {

// Seed papers (policies.cc).
std::unique_ptr<Policy> NewGaiaPolicy();
std::unique_ptr<Policy> NewBinpackPolicy();
std::unique_ptr<Policy> NewSpreadPolicy();
std::unique_ptr<Policy> NewGpusharePolicy();

// The FGD study's baselines (study_policies.cc).
std::unique_ptr<Policy> NewRandomPolicy();
std::unique_ptr<Policy> NewBestFitPolicy(const PolicyContext& context);
std::unique_ptr<Policy> NewDotProductPolicy(const PolicyContext& context);
std::unique_ptr<Policy> NewPackingPolicy();
std::unique_ptr<Policy> NewClusteringPolicy(const PolicyContext& context);

// Fragmentation-aware (fgd_policy.cc, tessera_policy.cc).
std::unique_ptr<Policy> NewFgdPolicy(const PolicyContext& context);
std::unique_ptr<Policy> NewTesseraPolicy(const PolicyContext& context);

// Nodes' prepared fragmentation views (FGD's measure), each recomputed only when its node changes, for the
// policies that weigh fragmentation. Not thread-safe (a cache behind const policies: one per policy
// instance).
class FragmentationViews {
 public:
  struct View {
    uint64_t version = 0;
    FragmentationModel::NodeView node;
    double fragment = 0;
  };
  explicit FragmentationViews(std::shared_ptr<const FragmentationModel> model) : model_(std::move(model)) {}
  const FragmentationModel& model() const { return *model_; }
  const View& Get(const NodeState& node) const;

  // The GPU changes (free share before -> after) that earlier containers of the pod made on `scratch`.
  using Changes = std::array<std::pair<MilliGpu, MilliGpu>, kMaxGpusPerNode + 1>;
  static size_t EarlierChanges(const NodeScratch& scratch, Changes& out);

 private:
  std::shared_ptr<const FragmentationModel> model_;
  mutable std::unordered_map<const NodeState*, View> views_;
};

// The FGD study's GPU choice ("best"): each share goes to the fitting GPU with the least free share (the
// lowest index on ties); whole GPUs are the first fitting ones by index. Deterministic.
bool StudyBestGpus(const NodeScratch& node, std::span<const VGpuDemand> vgpus, GpuMask eligible,
                   std::span<int8_t> out);

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_POLICIES_INTERNAL_H_
