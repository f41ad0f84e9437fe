// The ledger the cluster cache's extension points share (cache/filter.h, score.h, reserve.h, preempt.h,
// quota.h, warmer.h): the cluster and who holds what in it, the pods' records and reservations, the placement
// policy and what it was built from, and the workload it weighs. The points decide; the ledger keeps.
//
//   LedgerLock lock(&ledger);                    // every point takes the one lock, then reads and writes
//   ledger.MaybeRebuildPolicyLocked();           // the policy as due for the workload seen so far
//   ledger.ObserveLocked();                      // what it weighs from the whole cluster
//   ledger.placer->EvaluateCached(ledger.cluster, node, compiled, ledger.rng, &ledger.evaluations, fit);
//
// Thread-safety: one mutex, `mu`, guards every member below it; the points and ClusterCache take it through
// LedgerLock, which counts the caller among those waiting for it (the warming thread lets them go first). No
// API call is ever made under it.
#ifndef TESSERA_SCHEDULER_CACHE_LEDGER_H_
#define TESSERA_SCHEDULER_CACHE_LEDGER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/cluster.h"
#include "core/placement/evaluation_cache.h"
#include "core/placement/placer.h"
#include "core/random.h"
#include "core/request_parser.h"

namespace tessera::scheduler {

struct CacheOptions {
  std::string policy = "tessera";
  core::PlacementOptions placement;
  core::ParseOptions parse;
  // Pods remembered as the workload whose typical pods the fragmentation-aware policies weigh.
  size_t workload_window = 4096;
  // The policy is rebuilt from the workload after this many new pods (and when GPU models appear).
  size_t rebuild_after = 256;
  uint64_t seed = 0;  // ties between equal nodes: 0 picks a seed from the clock
  // Warming off the request path. A rebuilt policy (every `rebuild_after` pods), or a change in what it
  // weighs from the whole cluster (Policy::state_key), invalidates every node's remembered answer, and the
  // next pod of each shape would evaluate every node it names again (4 ms over 5,000 nodes for tessera,
  // more while the policy's own per-node views are cold). A background thread evaluates every node for the
  // last `warm_shapes` distinct pod shapes seen instead, a few nodes per hold of the lock, so that only the
  // pod that triggered the change pays. The answers are the ones a request would compute (deterministic
  // policies only; it draws from its own Rng). 0: no thread, no warming.
  size_t warm_shapes = 16;
  // Time (reservations' age) through the clock seam; never null (common/clock.h). Must outlive the cache.
  const Clock* clock = &RealClock();
};

// What the cache holds for one pod.
struct PodEntry {
  core::PodRequest request;
  core::Placement placement;
  bool reserved = false;  // decided by this scheduler, bind not yet confirmed by the API
  std::chrono::steady_clock::time_point reserved_at;
  // Its shares changed here (compressed, or given back) and the API has not shown that yet: until an observed
  // assignment says the same, an observed one that differs predates the write (TakeChangedShares) and is not
  // taken over the record.
  bool unwritten = false;
};

// A pod whose assignment tessera-node rewrote to the part another pod held (it corrects an allocation the
// kubelet swapped between pods: X takes Y's part, Y takes X's; docs/node-agent.md, "Swapped allocations").
// The API shows the pods' new assignments one at a time, so the ledger moves them as a whole (MoveLocked).
struct PendingMove {
  core::Placement to;  // as the API shows it
  std::chrono::steady_clock::time_point since;
};

// A part a moved pod left, held until the pod that takes it shows up (or kMoveHold passes); or a part a pod
// took before the API showed its holder leave it.
struct MovedPart {
  core::PodUid hold;  // the hold's own uid in `cluster` (none for a part taken early)
  std::string key;    // what the part is (PartKey)
  std::chrono::steady_clock::time_point since;
};

class CacheLedger {
 public:
  explicit CacheLedger(const CacheOptions& options);

  const CacheOptions& options() const { return options_; }
  std::chrono::steady_clock::time_point SteadyNow() const;

  // The policy, built from the workload seen so far; rebuilt when due (CacheOptions::rebuild_after, or new
  // GPU models). A rebuild clears the remembered answers and counts in `policy_generation`.
  void RebuildPolicyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  void MaybeRebuildPolicyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // What the policy weighs from the cluster as a whole, read before a pod is evaluated (Policy::Observe);
  // nothing when neither the policy nor the cluster changed since the last reading.
  void ObserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Notes a GPU pod's request in the workload window (once per pod).
  void NoteWorkloadLocked(const core::PodRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records a pod's placement as the API states it: GPU indices resolved from the UUIDs, then committed.
  // NotFound when the node or a GPU is not known.
  absl::Status RecordLocked(const core::PodRequest& request, core::Placement placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Records the pods kept aside for `node` (seen before its inventory, or while it was gone or lacked their
  // GPUs) that it can now hold. Only that node's: trying every orphan at every node made a restart that
  // listed pods before nodes quadratic (5,000 nodes x 5,000 pods, each failed try formatting its error).
  void AdoptOrphansLocked(const core::NodeName& node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Frees a pod's share (record or reservation); tenants whose share comes back are marked changed.
  void ReleaseLocked(const core::PodUid& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A tenant whose share the cluster changed (compressed, or given back): its record follows the cluster's,
  // and its assignment is due to be rewritten (ClusterCache::TakeChangedShares).
  void FollowShareLocked(const core::PodUid& tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // A recorded pod the API now shows on another part (`to`), which was not this scheduler's rewrite:
  // tessera-node corrected a swap, and the pod's counterparts show up one by one. Moving the pod at once
  // freed its old part before the counterpart that takes it showed up (a bind could take it: two pods on one
  // GPU), and the counterpart, seen first, found its new part still held and was left uncounted. So every
  // pending move is made together, all or none: each pod leaves its part and takes its new one; a part left
  // that no pod of the batch took stays held (a hold in `cluster`) until a pod takes it or kMoveHold passes;
  // a move that does not fit yet waits, the pod counted where it was, for the next pod event or release.
  void MoveLocked(const core::PodUid& uid, core::Placement to) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Forgets every recorded pod (reservations stay) and what the moves between them held, without giving
  // anyone a share back: the ledger is to be recorded again from the API (ClusterCache::ReplacePods).
  void ForgetRecordedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Tries the pending moves again (after a release made room).
  void ApplyMovesLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Drops the holds, early-taken marks and pending moves older than `age`; ApplyMovesLocked after it tries the
  // remaining moves again.
  int ExpireMovedPartsLocked(std::chrono::steady_clock::duration age) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
  static constexpr std::chrono::seconds kMoveHold{60};

  // The lock: guards every member below. Taken through LedgerLock.
  mutable Mutex mu;
  // Callers waiting for `mu`: the warming thread lets them in first.
  mutable std::atomic<int> waiting{0};

  core::Cluster cluster ABSL_GUARDED_BY(mu);
  std::string policy_name ABSL_GUARDED_BY(mu);
  core::PolicyContext context ABSL_GUARDED_BY(mu);  // what `policy` was built from
  std::unique_ptr<core::Policy> policy ABSL_GUARDED_BY(mu);
  std::unique_ptr<core::Placer> placer ABSL_GUARDED_BY(mu);
  core::EvaluationCache evaluations ABSL_GUARDED_BY(mu);  // valid for `policy`; cleared when it is rebuilt
  core::Rng rng ABSL_GUARDED_BY(mu){1};
  uint64_t policy_generation ABSL_GUARDED_BY(mu) = 0;  // counts rebuilds
  std::unordered_map<core::PodUid, PodEntry> pods ABSL_GUARDED_BY(mu);
  std::map<std::string, PodEntry> orphans ABSL_GUARDED_BY(mu);    // uid -> a pod whose node or GPUs are gone
  std::set<core::PodUid> changed ABSL_GUARDED_BY(mu);             // pods whose shares changed under them
  std::map<core::PodUid, PendingMove> moves ABSL_GUARDED_BY(mu);  // recorded pods the API shows elsewhere
  std::vector<MovedPart> holds ABSL_GUARDED_BY(mu);               // parts left, waiting for their taker
  std::vector<MovedPart> taken ABSL_GUARDED_BY(mu);               // parts taken before their holder left

 private:
  const CacheOptions options_;
  std::deque<core::PodRequest> workload_ ABSL_GUARDED_BY(mu);
  std::unordered_map<core::PodUid, size_t> in_workload_ ABSL_GUARDED_BY(mu);  // pods in workload_, once each
  size_t since_rebuild_ ABSL_GUARDED_BY(mu) = 0;
  int models_at_rebuild_ ABSL_GUARDED_BY(mu) = -1;
  // What the policy last observed (Policy::Observe): the policy, and the cluster by its last node version and
  // node count. Filter and prioritize of one pod come in a row with nothing changed between them, and
  // observing 5,000 nodes each time was 5% of the verbs' time.
  uint64_t observed_generation_ ABSL_GUARDED_BY(mu) = ~uint64_t{0};
  uint64_t observed_version_ ABSL_GUARDED_BY(mu) = 0;
  int observed_nodes_ ABSL_GUARDED_BY(mu) = -1;
  uint64_t next_hold_ ABSL_GUARDED_BY(mu) = 0;
  bool moves_due_ ABSL_GUARDED_BY(mu) = false;  // something changed since the pending moves were last tried
};

// The ledger's lock, taken by every point and by ClusterCache (not by the warming thread's loop): it counts
// the caller among those waiting for the lock while it waits.
class ABSL_SCOPED_LOCKABLE LedgerLock {
 public:
  explicit LedgerLock(const CacheLedger* ledger) ABSL_EXCLUSIVE_LOCK_FUNCTION(ledger->mu) : mu_(&ledger->mu) {
    ledger->waiting.fetch_add(1, std::memory_order_relaxed);
    mu_->Lock();
    ledger->waiting.fetch_sub(1, std::memory_order_relaxed);
  }
  ~LedgerLock() ABSL_UNLOCK_FUNCTION() { mu_->Unlock(); }
  LedgerLock(const LedgerLock&) = delete;
  LedgerLock& operator=(const LedgerLock&) = delete;

 private:
  Mutex* mu_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_LEDGER_H_
