#include "scheduler/cache/ledger.h"

#include <algorithm>
#include <vector>

#include "core/placement/policy.h"
#include "core/strings.h"

namespace tessera::scheduler {

using core::PodUid;

CacheLedger::CacheLedger(const CacheOptions& options) : options_(options) {
  uint64_t seed = options_.seed;
  if (seed == 0)
    seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) | 1;
  LedgerLock lock(this);
  rng = core::Rng(seed);
  RebuildPolicyLocked();
}

std::chrono::steady_clock::time_point CacheLedger::SteadyNow() const {
  return options_.clock->Steady();
}

void CacheLedger::RebuildPolicyLocked() {
  std::vector<core::PodRequest> window(workload_.begin(), workload_.end());
  context = core::MakePolicyContext(cluster, window);
  absl::StatusOr<std::unique_ptr<core::Policy>> built = core::MakePolicy(options_.policy, context);
  if (!built.ok()) {
    // The name was checked when the scheduler started (see ValidatePolicyName); a policy that cannot be built
    // yet falls back to binpack until it can.
    built = core::MakePolicy("binpack");
  }
  policy = *std::move(built);
  policy_name = std::string(policy->name());
  placer = std::make_unique<core::Placer>(*policy, options_.placement);
  evaluations.Clear();
  ++policy_generation;
  since_rebuild_ = 0;
  models_at_rebuild_ = cluster.model_count();
}

void CacheLedger::MaybeRebuildPolicyLocked() {
  // While the window fills (a scheduler just started), rebuild each time the workload doubles, so that the
  // first pods are not placed for an empty workload; then every `rebuild_after` pods.
  const size_t due = std::min(options_.rebuild_after, std::max<size_t>(1, workload_.size() / 2));
  if (since_rebuild_ >= due || models_at_rebuild_ != cluster.model_count()) RebuildPolicyLocked();
}

// What the policy weighs from the cluster as a whole (tessera: how full each GPU model is), read before each
// pod as Placer::Place does; answers cached under another reading are not reused (state_key). Observe reads
// nothing but the cluster, so an unchanged cluster needs no second reading.
void CacheLedger::ObserveLocked() {
  if (observed_generation_ == policy_generation && observed_version_ == cluster.last_version() &&
      observed_nodes_ == cluster.node_count()) {
    return;
  }
  policy->Observe(cluster);
  observed_generation_ = policy_generation;
  observed_version_ = cluster.last_version();
  observed_nodes_ = cluster.node_count();
}

void CacheLedger::NoteWorkloadLocked(const core::PodRequest& request) {
  if (!request.wants_gpu() || in_workload_.contains(request.uid)) return;
  workload_.push_back(request);
  in_workload_[request.uid] = 1;
  if (workload_.size() > options_.workload_window) {
    in_workload_.erase(workload_.front().uid);
    workload_.pop_front();
  }
  ++since_rebuild_;
}

// Resolves GPU indices from UUIDs (the node's order may differ from the one the assignment was written with)
// and commits.
absl::Status CacheLedger::RecordLocked(const core::PodRequest& request, core::Placement placement) {
  const core::NodeState* node = cluster.FindNode(placement.node);
  if (node == nullptr) {
    return absl::NotFoundError(StrCat("pod ", request.FullName(), " is assigned to node ",
                                      placement.node.value(),
                                      ", which the scheduler does not know (no Tessera inventory on it)"));
  }
  for (core::ContainerAssignment& c : placement.containers) {
    for (core::VGpuAssignment& v : c.vgpus) {
      int index = -1;
      for (int g = 0; g < node->gpu_count(); ++g) {
        if (node->gpu(g).uuid == v.uuid) index = g;
      }
      if (index < 0) {
        return absl::NotFoundError(StrCat("pod ", request.FullName(), " is assigned GPU ", v.uuid.value(),
                                          ", which node ", placement.node.value(), " does not have"));
      }
      v.gpu_index = index;
    }
  }
  if (absl::Status st = cluster.Commit(request, placement); !st.ok()) return st;
  const core::Placement* recorded = cluster.FindPlacement(request.uid);
  pods[request.uid] = PodEntry{request, *recorded, false, {}};
  return absl::OkStatus();
}

void CacheLedger::AdoptOrphansLocked(const core::NodeName& node) {
  std::vector<std::string> for_node;
  for (const auto& [uid, entry] : orphans) {
    if (entry.placement.node == node) for_node.push_back(uid);
  }
  for (const std::string& uid : for_node) {
    auto it = orphans.find(uid);
    if (RecordLocked(it->second.request, it->second.placement).ok()) orphans.erase(it);
  }
}

void CacheLedger::ReleaseLocked(const PodUid& uid) {
  orphans.erase(uid.value());
  if (!pods.contains(uid)) return;
  absl::StatusOr<std::vector<core::ShareChange>> changes = cluster.Release(uid);
  pods.erase(uid);
  if (!changes.ok()) return;
  for (const core::ShareChange& c : *changes) FollowShareLocked(c.tenant.pod);
}

void CacheLedger::FollowShareLocked(const PodUid& tenant) {
  auto it = pods.find(tenant);
  if (it == pods.end()) return;
  if (const core::Placement* p = cluster.FindPlacement(tenant))
    it->second.placement.containers = p->containers;
  it->second.unwritten = true;
  changed.insert(tenant);
}

}  // namespace tessera::scheduler
