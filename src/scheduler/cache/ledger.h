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
  std::map<std::string, PodEntry> orphans ABSL_GUARDED_BY(mu);  // uid -> a pod whose node or GPUs are gone
  std::set<core::PodUid> changed ABSL_GUARDED_BY(mu);           // pods whose shares changed under them

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
