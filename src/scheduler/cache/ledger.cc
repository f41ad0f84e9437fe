#include "scheduler/cache/ledger.h"

#include <algorithm>
#include <set>
#include <utility>
#include <vector>

#include "common/log.h"
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
namespace {

// Commits `placement` (GPU indices resolved from the UUIDs) to `c`.
absl::Status CommitAt(core::Cluster& c, const core::PodRequest& request, core::Placement placement) {
  const core::NodeState* node = c.FindNode(placement.node);
  if (node == nullptr) {
    return absl::NotFoundError(StrCat("pod ", request.FullName(), " is assigned to node ",
                                      placement.node.value(),
                                      ", which the scheduler does not know (no Tessera inventory on it)"));
  }
  for (core::ContainerAssignment& ct : placement.containers) {
    for (core::VGpuAssignment& v : ct.vgpus) {
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
  return c.Commit(request, placement);
}

// What a part is: its node and every vGPU's GPU, share and memory (a swap exchanges whole parts).
std::string PartKey(const core::Placement& p) {
  std::vector<std::string> vgpus;
  for (const core::ContainerAssignment& c : p.containers) {
    for (const core::VGpuAssignment& v : c.vgpus) {
      vgpus.push_back(StrCat(v.uuid.value(), ":", v.cores.value(), ":", v.memory.value()));
    }
  }
  std::sort(vgpus.begin(), vgpus.end());
  return StrCat(p.node.value(), "|", StrJoin(vgpus, ","));
}

std::set<std::string> GpusOf(const core::Placement& p) {
  std::set<std::string> out;
  for (const core::ContainerAssignment& c : p.containers) {
    for (const core::VGpuAssignment& v : c.vgpus) out.insert(v.uuid.value());
  }
  return out;
}

}  // namespace

absl::Status CacheLedger::RecordLocked(const core::PodRequest& request, core::Placement placement) {
  if (absl::Status st = CommitAt(cluster, request, std::move(placement)); !st.ok()) return st;
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

void CacheLedger::MoveLocked(const PodUid& uid, core::Placement to) {
  if (!pods.contains(uid)) return;
  moves[uid] = PendingMove{std::move(to), SteadyNow()};
  moves_due_ = true;
  ApplyMovesLocked();
}

void CacheLedger::ApplyMovesLocked() {
  // Tried again only when something changed since (a new move, a release): the try copies the cluster.
  if (!moves_due_) return;
  moves_due_ = false;
  for (auto it = moves.begin(); it != moves.end();)
    it = pods.contains(it->first) ? std::next(it) : moves.erase(it);
  if (moves.empty()) return;
  // The moves to other GPUs (the others changed shares, not GPUs: no swap).
  std::set<PodUid> swapped;
  for (const auto& [uid, m] : moves) {
    if (GpusOf(pods.at(uid).placement) != GpusOf(m.to)) swapped.insert(uid);
  }
  // What the batch leaves and takes. A part taken that the batch leaves is the swap's other half; one it does
  // not leave was left earlier (a hold) or is still held by a pod the API has not shown leaving it.
  std::multiset<std::string> unmatched_left;
  for (const PodUid& uid : swapped) unmatched_left.insert(PartKey(pods.at(uid).placement));
  std::vector<size_t> used_holds;
  std::vector<std::string> early;
  for (const auto& [uid, m] : moves) {
    if (!swapped.contains(uid)) continue;
    const std::string key = PartKey(m.to);
    if (auto f = unmatched_left.find(key); f != unmatched_left.end()) {
      unmatched_left.erase(f);
      continue;
    }
    bool found = false;
    for (size_t i = 0; i < holds.size() && !found; ++i) {
      if (holds[i].key == key && std::find(used_holds.begin(), used_holds.end(), i) == used_holds.end()) {
        used_holds.push_back(i);
        found = true;
      }
    }
    if (!found) early.push_back(key);
  }
  // All or none: tried on a copy first.
  core::Cluster trial = cluster;
  for (const auto& [uid, m] : moves) (void)trial.Release(uid);
  for (size_t i : used_holds) (void)trial.Release(holds[i].hold);
  for (const auto& [uid, m] : moves) {
    if (!CommitAt(trial, pods.at(uid).request, m.to).ok()) return;  // not yet: the pods stay where they were
  }
  std::set<PodUid> given_back;
  std::vector<std::pair<PodUid, core::Placement>> left;  // the parts no pod of the batch took
  for (const auto& [uid, m] : moves) {
    if (swapped.contains(uid)) left.emplace_back(uid, pods.at(uid).placement);
    if (absl::StatusOr<std::vector<core::ShareChange>> changes = cluster.Release(uid); changes.ok()) {
      for (const core::ShareChange& c : *changes) given_back.insert(c.tenant.pod);
    }
  }
  std::sort(used_holds.rbegin(), used_holds.rend());
  for (size_t i : used_holds) {
    (void)cluster.Release(holds[i].hold);
    holds.erase(holds.begin() + static_cast<std::ptrdiff_t>(i));
  }
  const auto now = SteadyNow();
  for (auto& [uid, m] : moves) {
    PodEntry& e = pods.at(uid);
    if (absl::Status st = CommitAt(cluster, e.request, m.to); !st.ok()) {
      // Cannot happen (the copy took it); counted nowhere otherwise, so kept aside as a pod of unknown GPUs.
      orphans[uid.value()] = PodEntry{e.request, m.to, false, {}};
      pods.erase(uid);
      continue;
    }
    e.placement = *cluster.FindPlacement(uid);
    e.reserved = false;
    e.unwritten = false;
  }
  // Each part left that no pod of the batch took is held for the pod that takes it, unless a pod took it
  // already (before the API showed this one leave).
  for (auto& [uid, before] : left) {
    const std::string key = PartKey(before);
    auto f = unmatched_left.find(key);
    if (f == unmatched_left.end()) continue;  // taken in this batch
    unmatched_left.erase(f);
    auto t = std::find_if(taken.begin(), taken.end(), [&](const MovedPart& p) { return p.key == key; });
    if (t != taken.end()) {
      taken.erase(t);
      continue;
    }
    core::PodRequest hold = pods.contains(uid) ? pods.at(uid).request : core::PodRequest{};
    hold.uid = PodUid(StrCat("tessera.dev/moved-part/", ++next_hold_));
    if (CommitAt(cluster, hold, before).ok()) holds.push_back({hold.uid, key, now});
  }
  for (std::string& key : early) taken.push_back({PodUid(), std::move(key), now});
  moves.clear();
  for (const PodUid& tenant : given_back) FollowShareLocked(tenant);
}

int CacheLedger::ExpireMovedPartsLocked(std::chrono::steady_clock::duration age) {
  const auto now = SteadyNow();
  int expired = 0;
  for (auto it = holds.begin(); it != holds.end();) {
    if (now - it->since <= age) {
      ++it;
      continue;
    }
    (void)cluster.Release(it->hold);
    it = holds.erase(it);
    ++expired;
  }
  expired += static_cast<int>(std::erase_if(taken, [&](const MovedPart& p) { return now - p.since > age; }));
  // A move that never fitted: the pod stays counted where it was, though the API shows it elsewhere.
  for (auto it = moves.begin(); it != moves.end();) {
    if (now - it->second.since <= age) {
      ++it;
      continue;
    }
    log::Warn("a pod's new assignment never fitted beside the others; it stays counted where it was",
              {{"uid", it->first.value()}, {"node", it->second.to.node.value()}});
    it = moves.erase(it);
    ++expired;
  }
  if (expired > 0) moves_due_ = true;  // room made, or a hold gone: the caller tries the moves again
  return expired;
}

void CacheLedger::ReleaseLocked(const PodUid& uid) {
  moves.erase(uid);
  moves_due_ = true;  // room made, maybe for a move waiting for it
  orphans.erase(uid.value());
  if (!pods.contains(uid)) return;
  absl::StatusOr<std::vector<core::ShareChange>> changes = cluster.Release(uid);
  pods.erase(uid);
  if (!changes.ok()) return;
  for (const core::ShareChange& c : *changes) FollowShareLocked(c.tenant.pod);
}

void CacheLedger::ForgetRecordedLocked() {
  for (auto it = pods.begin(); it != pods.end();) {
    if (it->second.reserved) {
      ++it;
      continue;
    }
    (void)cluster.Release(it->first);  // its give-backs go with the pods they went to
    it = pods.erase(it);
  }
  for (const MovedPart& h : holds) (void)cluster.Release(h.hold);
  holds.clear();
  taken.clear();
  moves.clear();
  moves_due_ = false;
  orphans.clear();
  changed.clear();
  // What stays is reservations, with no change of share left to write (`changed` is empty): none waits for its
  // write to show. The shares they compressed come back with their pods' records, as the API has them.
  for (auto& [uid, e] : pods) e.unwritten = false;
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
