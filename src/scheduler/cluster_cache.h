// The scheduler extender's view of the cluster: nodes and their GPUs, the pods that hold shares of them, and
// the decisions in flight. Every verb of the extender goes through it, and it places through the core library
// exactly as the simulator does.
//
//   ClusterCache cache(options);
//   cache.UpsertNode(node_info);                        // from the agents' inventory annotations
//   cache.ObservePod(pod_object);                       // from the API: bound pods with an assignment
//   FilterOutcome f = cache.Filter(request, nodes);     // the filter verb
//   std::vector<HostScore> s = cache.Prioritize(request, nodes);
//   absl::StatusOr<Reservation> r = cache.Reserve(request, node);  // bind: assume, then write the API
//   cache.Confirm(uid) / cache.Unreserve(uid);          // the bind went through / failed
//
// A reservation holds the pod's share from the moment the bind verb decides until the API confirms the bind
// or the bind fails, so that no other decision can take the same share meanwhile; the state itself is always
// rebuilt from the API (ObservePod), never kept only here.
//
// It is split along the extender's extension points, as a scheduler plugin is (cache/): the ledger they
// share (cache/ledger.h: the cluster, the pods' records and reservations, the policy and its workload), and
// one class per point: filter (cache/filter.h), score (cache/score.h), reserve (cache/reserve.h), preempt
// (cache/preempt.h), quota (cache/quota.h), and the warming thread (cache/warmer.h). ClusterCache keeps what
// the API says (nodes, pods) and routes each verb to its point.
//
// Thread-safety: thread-safe. One mutex, the ledger's, guards the state; filter and prioritize over 5,000
// nodes hold it for about a millisecond, a reservation for microseconds; no API call is ever made under it. A
// background thread (CacheOptions::warm_shapes) takes it for a few node evaluations at a time, after the
// verbs waiting for it.
#ifndef TESSERA_SCHEDULER_CLUSTER_CACHE_H_
#define TESSERA_SCHEDULER_CLUSTER_CACHE_H_

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/placement/fragmentation.h"
#include "formats/pod_object.h"
#include "scheduler/cache/filter.h"
#include "scheduler/cache/ledger.h"
#include "scheduler/cache/preempt.h"
#include "scheduler/cache/quota.h"
#include "scheduler/cache/reserve.h"
#include "scheduler/cache/score.h"
#include "scheduler/cache/warmer.h"

namespace tessera::scheduler {

// What the operators' page shows (page.h), copied under the lock in one go and serialized after it is
// released.
struct PageView {
  core::Cluster cluster;
  // FGD's measure over the workload the policy was last built from (its typical pods); null before the first
  // build.
  std::shared_ptr<const core::FragmentationModel> fragmentation;
  std::string policy;
  struct Pod {
    std::string name;  // namespace/name
    core::ComputePolicy compute = core::ComputePolicy::kHard;
    bool reserved = false;  // decided here, bind not yet confirmed
  };
  std::unordered_map<std::string, Pod> pods;  // by pod UID: every pod holding or reserving GPUs
};

class ClusterCache {
 public:
  explicit ClusterCache(CacheOptions options);
  ~ClusterCache();

  // Nodes. A node whose GPUs changed (replaced, added, removed) is rebuilt and its pods re-recorded; pods
  // whose GPUs are gone are kept aside and reported by Orphans(). Health and schedulability change in place.
  absl::Status UpsertNode(core::NodeInfo info);
  void RemoveNode(const core::NodeName& name);
  absl::Status SetSchedulable(const core::NodeName& name, bool schedulable);
  // Per-namespace quota of GPU share per model (Gaia's heterogeneous cluster quota).
  void SetQuota(const core::Namespace& ns, std::string_view model, core::MilliGpu limit);
  // Replaces every quota at once (a quota file read again): no placement sees half of the new set.
  void ReplaceQuotas(const std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>>& quotas);
  // Every quota with what the extender's pods hold of it (held_here) and what Tessera's DRA claims do
  // (held_elsewhere, as the DRA controller last said with SetQuotaHeldByDra): the DRA controller reads it
  // before each round, so that both paths count one quota (docs/dra.md, "Quotas on both paths").
  std::vector<core::QuotaStanding> QuotaStandings() const;
  void SetQuotaHeldByDra(std::span<const core::QuotaStanding> held);

  // Pods from the API. A pod bound to a node with a valid assignment is recorded (or its record refreshed);
  // a pod that has finished, or has no assignment, is released. Returns an error (and records nothing) for an
  // assignment that does not fit the node as known: the caller reports it on the pod.
  absl::Status ObservePod(const formats::PodObject& pod);
  // A pod whose changed share this replica may not write (it does not lead): its next assignment observed is
  // taken over the record, though the record's share changed here (PodEntry::unwritten), so that the ledger
  // follows what the leader writes.
  void LeaveShareToLeader(const core::PodUid& uid);
  // The recorded pods replaced by `pods` (the API's), at once: what a replica that takes the lead starts from,
  // as a restarted one does (its ledger followed the leader's writes one event at a time, and its own changes
  // of shares, which it did not write, may differ from them). Reservations stay. Returns, by index into
  // `pods`, those whose assignment did not fit (ObservePod's errors).
  std::vector<std::pair<size_t, absl::Status>> ReplacePods(std::span<const formats::PodObject> pods);
  void ForgetPod(const core::PodUid& uid);
  // Notes a pending pod's request as part of the workload (filter calls do this too).
  void NoteWorkload(const core::PodRequest& request);

  // The extender's verbs, over the nodes named (kube-scheduler's candidates; none named, none fit).
  FilterOutcome Filter(const core::PodRequest& request, std::span<const std::string> nodes);
  std::vector<HostScore> Prioritize(const core::PodRequest& request, std::span<const std::string> nodes);
  // The same by position in `nodes` (see FilterVerdicts). Prioritize's answer is in the verb's order: the
  // fitting nodes as asked, then the others (unknown or not fitting) as asked.
  FilterVerdicts FilterAt(const core::PodRequest& request, std::span<const std::string_view> nodes);
  std::vector<PositionScore> PrioritizeAt(const core::PodRequest& request,
                                          std::span<const std::string_view> nodes);
  // Decides the pod's GPUs on `node` and holds them. AlreadyExists when the pod already holds GPUs on `node`
  // (an earlier bind of the same pod: FindPod gives what it holds); FailedPrecondition when on another node.
  absl::StatusOr<Reservation> Reserve(const core::PodRequest& request, const core::NodeName& node);
  // The bind reached the API: the reservation becomes a record.
  void Confirm(const core::PodUid& uid);
  // The bind failed: the share is free again and compressed tenants get their share back.
  void Unreserve(const core::PodUid& uid);
  // Unreserves reservations older than `age` (a bind that never finished). Returns how many.
  int ExpireReservations(std::chrono::steady_clock::duration age);

  // The preempt verb: the nodes of `victims` (node -> pod UIDs to evict) where the pod would fit once those
  // pods are gone.
  std::set<std::string> FitsAfterEvicting(const core::PodRequest& request,
                                          const std::map<std::string, std::vector<std::string>>& victims);

  // Pods whose shares changed under them since the last call: low-priority tenants compressed for a
  // high-priority pod, or given their share back when it left. Their assignments must be rewritten in the API
  // (the node agent then rewrites their limits live).
  std::vector<PodEntry> TakeChangedShares();

  // Reading.
  std::optional<PodEntry> FindPod(const core::PodUid& uid) const;
  // A copy of the cluster, for inspection and tests.
  core::Cluster Snapshot() const;
  std::vector<std::string> Orphans() const;
  // The cluster, its pods and the fragmentation model, for the operators' page.
  PageView PageSnapshot() const;
  // Pod UID -> "namespace/name" of every pod holding or reserving GPUs.
  std::map<std::string, std::string> PodNames() const;
  // The same for the pods held because the API showed them or a bind of ours went through (records, and
  // orphans waiting for their node): not the reservations, whose bind is still on its way.
  std::map<core::PodUid, std::string> RecordedPods() const;
  int pod_count() const;
  int node_count() const;
  std::string policy_name() const;
  // How many times the policy was built (at start, then from the workload window:
  // CacheOptions::rebuild_after).
  uint64_t policy_builds() const;

  // Warming (CacheOptions::warm_shapes), for tests: waits until the warming thread has nothing left to do
  // for what it has been asked so far; the node evaluations it has made.
  void WaitForWarming() const;
  uint64_t warmed_evaluations() const;

 private:
  absl::Status ObservePodLocked(const formats::PodObject& pod,
                                const absl::StatusOr<core::PodRequest>& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger_.mu);

  CacheLedger ledger_;
  ShapeWarmer warmer_;  // its thread starts once the ledger is built
  FilterPoint filter_;
  ScorePoint score_;
  ReservePoint reserve_;
  PreemptPoint preempt_;
  QuotaPoint quota_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CLUSTER_CACHE_H_
