#include "scheduler/cluster_cache.h"

#include <utility>

#include "core/strings.h"
#include "formats/assignment.h"

namespace tessera::scheduler {

using core::NodeName;
using core::PodUid;

ClusterCache::ClusterCache(CacheOptions options)
    : ledger_(options),
      warmer_(ledger_),
      filter_(ledger_, warmer_),
      score_(ledger_, warmer_),
      reserve_(ledger_),
      preempt_(ledger_),
      quota_(ledger_) {}

ClusterCache::~ClusterCache() = default;

void ClusterCache::NoteWorkload(const core::PodRequest& request) {
  LedgerLock lock(&ledger_);
  ledger_.NoteWorkloadLocked(request);
}

absl::Status ClusterCache::SetSchedulable(const NodeName& name, bool schedulable) {
  LedgerLock lock(&ledger_);
  return ledger_.cluster.SetSchedulable(name, schedulable);
}

// The extension points (cache/).

void ClusterCache::SetQuota(const core::Namespace& ns, std::string_view model, core::MilliGpu limit) {
  quota_.Set(ns, model, limit);
}

void ClusterCache::ReplaceQuotas(
    const std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>>& quotas) {
  quota_.Replace(quotas);
}

std::vector<core::QuotaStanding> ClusterCache::QuotaStandings() const {
  return quota_.Standings();
}

void ClusterCache::SetQuotaHeldByDra(std::span<const core::QuotaStanding> held) {
  quota_.SetHeldElsewhere(held);
}

FilterVerdicts ClusterCache::FilterAt(const core::PodRequest& request,
                                      std::span<const std::string_view> nodes) {
  return filter_.FilterAt(request, nodes);
}

std::vector<PositionScore> ClusterCache::PrioritizeAt(const core::PodRequest& request,
                                                      std::span<const std::string_view> nodes) {
  return score_.PrioritizeAt(request, nodes);
}

absl::StatusOr<Reservation> ClusterCache::Reserve(const core::PodRequest& request, const NodeName& node) {
  return reserve_.Reserve(request, node);
}

void ClusterCache::Confirm(const PodUid& uid) {
  reserve_.Confirm(uid);
}

void ClusterCache::Unreserve(const PodUid& uid) {
  reserve_.Unreserve(uid);
}

int ClusterCache::ExpireReservations(std::chrono::steady_clock::duration age) {
  return reserve_.ExpireReservations(age);
}

std::vector<PodEntry> ClusterCache::TakeChangedShares() {
  return reserve_.TakeChangedShares();
}

std::set<std::string> ClusterCache::FitsAfterEvicting(
    const core::PodRequest& request, const std::map<std::string, std::vector<std::string>>& victims) {
  return preempt_.FitsAfterEvicting(request, victims);
}

void ClusterCache::WaitForWarming() const {
  warmer_.WaitForWarming();
}

uint64_t ClusterCache::warmed_evaluations() const {
  return warmer_.warmed_evaluations();
}

uint64_t ClusterCache::policy_builds() const {
  LedgerLock lock(&ledger_);
  return ledger_.policy_generation;
}

// What the API says: nodes and pods.

absl::Status ClusterCache::UpsertNode(core::NodeInfo info) {
  LedgerLock lock(&ledger_);
  const core::NodeState* existing = ledger_.cluster.FindNode(info.name);
  if (existing != nullptr) {
    const core::NodeInfo& old = existing->info();
    bool same_hardware = old.gpus.size() == info.gpus.size() && old.links == info.links &&
                         old.cpu == info.cpu && old.memory == info.memory && old.numa_cpus == info.numa_cpus;
    for (size_t g = 0; same_hardware && g < info.gpus.size(); ++g) {
      const core::GpuInfo& a = old.gpus[g];
      const core::GpuInfo& b = info.gpus[g];
      same_hardware = a.uuid == b.uuid && a.index == b.index && a.model == b.model && a.memory == b.memory &&
                      a.numa_node == b.numa_node;
    }
    if (same_hardware) {
      for (const core::GpuInfo& g : info.gpus) {
        if (absl::Status st = ledger_.cluster.SetGpuHealth(info.name, g.uuid, g.health); !st.ok()) return st;
      }
      return ledger_.cluster.SetSchedulable(info.name, info.schedulable);
    }
    // The hardware changed: rebuild the node and record its pods again.
    std::vector<PodUid> on_node;
    for (const auto& [uid, entry] : ledger_.pods) {
      if (entry.placement.node == info.name) on_node.push_back(uid);
    }
    std::vector<PodEntry> entries;
    for (const PodUid& uid : on_node) {
      entries.push_back(ledger_.pods[uid]);
      (void)ledger_.cluster.Release(uid);
      ledger_.pods.erase(uid);
    }
    if (absl::Status st = ledger_.cluster.RemoveNode(info.name); !st.ok()) return st;
    if (absl::Status st = ledger_.cluster.AddNode(info); !st.ok()) return st;
    for (PodEntry& e : entries) {
      const PodUid uid = e.request.uid;
      if (!ledger_.RecordLocked(e.request, e.placement).ok()) ledger_.orphans[uid.value()] = std::move(e);
    }
    // Pods that waited for a GPU the node did not have.
    ledger_.AdoptOrphansLocked(info.name);
    return absl::OkStatus();
  }
  const NodeName name = info.name;
  if (absl::Status st = ledger_.cluster.AddNode(std::move(info)); !st.ok()) return st;
  // Pods that waited for this node (seen before it, or their node was removed and has come back).
  ledger_.AdoptOrphansLocked(name);
  return absl::OkStatus();
}

void ClusterCache::RemoveNode(const NodeName& name) {
  LedgerLock lock(&ledger_);
  std::vector<PodUid> on_node;
  for (const auto& [uid, entry] : ledger_.pods) {
    if (entry.placement.node == name) on_node.push_back(uid);
  }
  for (const PodUid& uid : on_node) {
    ledger_.orphans[uid.value()] = ledger_.pods[uid];
    (void)ledger_.cluster.Release(uid);
    ledger_.pods.erase(uid);
  }
  (void)ledger_.cluster.RemoveNode(name);
}

absl::Status ClusterCache::ObservePod(const formats::PodObject& pod) {
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod.spec, ledger_.options().parse);
  LedgerLock lock(&ledger_);
  absl::Status st = ObservePodLocked(pod, request);
  ledger_.ApplyMovesLocked();  // a release above may have made room for a move waiting for it
  return st;
}

void ClusterCache::LeaveShareToLeader(const PodUid& uid) {
  LedgerLock lock(&ledger_);
  if (auto it = ledger_.pods.find(uid); it != ledger_.pods.end()) it->second.unwritten = false;
}

std::vector<std::pair<size_t, absl::Status>> ClusterCache::ReplacePods(std::span<const formats::PodObject> pods) {
  std::vector<absl::StatusOr<core::PodRequest>> requests;
  requests.reserve(pods.size());
  for (const formats::PodObject& pod : pods)
    requests.push_back(core::ParsePodRequest(pod.spec, ledger_.options().parse));
  std::vector<std::pair<size_t, absl::Status>> errors;
  LedgerLock lock(&ledger_);
  ledger_.ForgetRecordedLocked();
  for (size_t i = 0; i < pods.size(); ++i) {
    if (absl::Status st = ObservePodLocked(pods[i], requests[i]); !st.ok()) errors.emplace_back(i, std::move(st));
  }
  ledger_.ApplyMovesLocked();
  return errors;
}

absl::Status ClusterCache::ObservePodLocked(const formats::PodObject& pod,
                                            const absl::StatusOr<core::PodRequest>& request) {
  const PodUid uid(pod.spec.uid);
  if (!request.ok()) {
    ledger_.ReleaseLocked(uid);
    return request.status();
  }
  ledger_.NoteWorkloadLocked(*request);
  auto annotation = pod.spec.annotations.find(formats::kAnnotationAssignment);
  const bool holds = !pod.node_name.empty() && !pod.terminated() && annotation != pod.spec.annotations.end();
  if (!holds) {
    // A pod we hold, seen unbound and not finished: an event from before our bind, delivered after it (a pod
    // never loses its node once bound). Our reservation or record stays; the bound state follows.
    auto it = ledger_.pods.find(uid);
    if (it != ledger_.pods.end() && pod.node_name.empty() && !pod.terminated()) return absl::OkStatus();
    ledger_.ReleaseLocked(uid);
    return absl::OkStatus();
  }
  absl::StatusOr<formats::Assignment> assignment = formats::ParseAssignment(annotation->second);
  if (!assignment.ok()) {
    ledger_.ReleaseLocked(uid);
    return assignment.status();
  }
  if (assignment->node.value() != pod.node_name) {
    ledger_.ReleaseLocked(uid);
    return absl::FailedPreconditionError(StrCat("pod ", request->FullName(), " runs on node ", pod.node_name,
                                                " but its assignment names node ", assignment->node.value()));
  }
  core::Placement placement = formats::ToPlacement(*assignment);
  auto it = ledger_.pods.find(uid);
  if (it != ledger_.pods.end()) {
    // Known: our own reservation confirmed by the API, or a record seen before. Keep it when it says the
    // same.
    it->second.reserved = false;
    bool same = it->second.placement.node == placement.node &&
                it->second.placement.containers.size() == placement.containers.size();
    for (size_t c = 0; same && c < placement.containers.size(); ++c) {
      const auto& a = it->second.placement.containers[c].vgpus;
      const auto& b = placement.containers[c].vgpus;
      same = a.size() == b.size();
      for (size_t k = 0; same && k < a.size(); ++k) {
        same = a[k].uuid == b[k].uuid && a[k].cores == b[k].cores && a[k].memory == b[k].memory;
      }
    }
    if (same) {
      it->second.unwritten = false;
      return absl::OkStatus();
    }
    // An event from before our own rewrite of its shares: the record is newer, and the write is on its way.
    if (it->second.unwritten) return absl::OkStatus();
    // Another part than ours: tessera-node corrected an allocation the kubelet swapped, and the pod's
    // counterparts show up one by one. Moved with them, all or none (CacheLedger::MoveLocked); released and
    // recorded alone, its old part was free for a bind before the pod taking it showed up (the fault
    // harness and the cluster tier: two whole-GPU pods on one GPU in the pods' annotations).
    ledger_.MoveLocked(uid, std::move(placement));
    return absl::OkStatus();
  }
  ledger_.orphans.erase(uid.value());
  absl::Status st = ledger_.RecordLocked(*request, std::move(placement));
  if (!st.ok() && absl::IsNotFound(st)) {
    // Its node (or GPU) is not known yet: keep it aside until the node's inventory arrives.
    formats::Assignment copy = *assignment;
    ledger_.orphans[uid.value()] = PodEntry{*request, formats::ToPlacement(copy), false, {}};
  }
  return st;
}

void ClusterCache::ForgetPod(const PodUid& uid) {
  LedgerLock lock(&ledger_);
  ledger_.ReleaseLocked(uid);
  ledger_.ApplyMovesLocked();  // room made for a move waiting for it
}

FilterOutcome ClusterCache::Filter(const core::PodRequest& request, std::span<const std::string> nodes) {
  const std::vector<std::string_view> views(nodes.begin(), nodes.end());
  FilterVerdicts v = FilterAt(request, views);
  FilterOutcome out;
  for (uint32_t k : v.fits) out.fits.push_back(nodes[k]);
  for (auto& [k, why] : v.failed) out.failed[nodes[k]] = std::move(why);
  for (auto& [k, why] : v.unresolvable) out.unresolvable[nodes[k]] = std::move(why);
  return out;
}

std::vector<HostScore> ClusterCache::Prioritize(const core::PodRequest& request,
                                                std::span<const std::string> nodes) {
  const std::vector<std::string_view> views(nodes.begin(), nodes.end());
  std::vector<HostScore> out;
  for (const PositionScore& p : PrioritizeAt(request, views)) out.push_back({nodes[p.position], p.score});
  return out;
}

std::optional<PodEntry> ClusterCache::FindPod(const PodUid& uid) const {
  LedgerLock lock(&ledger_);
  auto it = ledger_.pods.find(uid);
  if (it == ledger_.pods.end()) return std::nullopt;
  return it->second;
}

core::Cluster ClusterCache::Snapshot() const {
  LedgerLock lock(&ledger_);
  return ledger_.cluster;
}

PageView ClusterCache::PageSnapshot() const {
  PageView view;
  LedgerLock lock(&ledger_);
  view.cluster = ledger_.cluster;
  view.fragmentation = ledger_.context.fragmentation;
  view.policy = ledger_.policy_name;
  view.pods.reserve(ledger_.pods.size());
  for (const auto& [uid, entry] : ledger_.pods) {
    view.pods.emplace(uid.value(),
                      PageView::Pod{entry.request.FullName(), entry.request.compute_policy, entry.reserved});
  }
  return view;
}

std::map<std::string, std::string> ClusterCache::PodNames() const {
  LedgerLock lock(&ledger_);
  std::map<std::string, std::string> out;
  for (const auto& [uid, entry] : ledger_.pods) out[uid.value()] = entry.request.FullName();
  return out;
}

std::map<PodUid, std::string> ClusterCache::RecordedPods() const {
  LedgerLock lock(&ledger_);
  std::map<PodUid, std::string> out;
  for (const auto& [uid, entry] : ledger_.pods) {
    if (!entry.reserved) out[uid] = entry.request.FullName();
  }
  for (const auto& [uid, entry] : ledger_.orphans) out[PodUid(uid)] = entry.request.FullName();
  return out;
}

std::vector<std::string> ClusterCache::Orphans() const {
  LedgerLock lock(&ledger_);
  std::vector<std::string> out;
  for (const auto& [uid, entry] : ledger_.orphans) {
    out.push_back(StrCat(entry.request.FullName(), " (", uid, ") on node ", entry.placement.node.value()));
  }
  return out;
}

int ClusterCache::pod_count() const {
  LedgerLock lock(&ledger_);
  return static_cast<int>(ledger_.pods.size());
}

int ClusterCache::node_count() const {
  LedgerLock lock(&ledger_);
  return ledger_.cluster.node_count();
}

std::string ClusterCache::policy_name() const {
  LedgerLock lock(&ledger_);
  return ledger_.policy_name;
}

}  // namespace tessera::scheduler
