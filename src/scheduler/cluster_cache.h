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
// Thread-safety: thread-safe. One mutex guards the state; filter and prioritize over 5,000 nodes hold it for
// about a millisecond, a reservation for microseconds; no API call is ever made under it. A background thread
// (CacheOptions::warm_shapes) takes it for a few node evaluations at a time, after the verbs waiting for it.
#ifndef TESSERA_SCHEDULER_CLUSTER_CACHE_H_
#define TESSERA_SCHEDULER_CLUSTER_CACHE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/cluster.h"
#include "core/placement/evaluation_cache.h"
#include "core/placement/fragmentation.h"
#include "core/placement/placer.h"
#include "core/random.h"
#include "core/request_parser.h"
#include "formats/pod_object.h"

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

struct FilterOutcome {
  std::vector<std::string> fits;
  std::map<std::string, std::string> failed;        // node -> why, where preemption might help
  std::map<std::string, std::string> unresolvable;  // node -> why, where nothing could help
};

// kube-scheduler's extender priority: 0 (worst) to 10 (best).
struct HostScore {
  std::string host;
  int64_t score = 0;
};
inline constexpr int64_t kMaxExtenderPriority = 10;

// The same answers by position in the list of names asked about, for the extender: it writes them from the
// request's own text, so that no node name is copied per node (5,000 per request on a large cluster).
struct FilterVerdicts {
  std::vector<uint32_t> fits;                                  // positions, in the order asked
  std::vector<std::pair<uint32_t, std::string>> failed;        // position, why: preemption might help
  std::vector<std::pair<uint32_t, std::string>> unresolvable;  // position, why: nothing could help
};
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

struct PositionScore {
  uint32_t position;
  int64_t score;
};

// A decision held while its bind is written to the API.
struct Reservation {
  core::Placement placement;
  // Low-priority tenants whose share this pod's placement cut (SharedGPU compression): their new shares must
  // reach their pods' assignments and their nodes' limits files.
  std::vector<core::Compression> compressions;
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

  // Pods from the API. A pod bound to a node with a valid assignment is recorded (or its record refreshed);
  // a pod that has finished, or has no assignment, is released. Returns an error (and records nothing) for an
  // assignment that does not fit the node as known: the caller reports it on the pod.
  absl::Status ObservePod(const formats::PodObject& pod);
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
  struct State;
  void WarmLoop();
  // Notes the pod's shape among those to warm, and wakes the warming thread when the answers it keeps were
  // invalidated (a rebuilt policy, another state_key) since it last warmed.
  void NoteShapeLocked(const core::PodRequest& request, uint64_t fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::chrono::steady_clock::time_point SteadyNow() const;
  void RebuildPolicyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MaybeRebuildPolicyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void NoteWorkloadLocked(const core::PodRequest& request) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ObserveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status RecordLocked(const core::PodRequest& request, core::Placement placement)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(const core::PodUid& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CacheOptions options_;
  mutable Mutex mu_;
  std::unique_ptr<State> state_ ABSL_PT_GUARDED_BY(mu_);
  mutable CondVar warm_cv_;              // wakes the warming thread (work due, or stop)
  mutable CondVar warm_idle_cv_;         // the warming thread finished what was due
  mutable std::atomic<int> waiting_{0};  // callers waiting for mu_: the warming thread lets them in first
  std::thread warm_thread_;
};

// Scores policies' node scores into kube-scheduler's 0-10 range: the best node 10, the worst 0, linear
// between (tiers first: a node of a better SharedGPU tier always scores above one of a worse tier).
std::vector<HostScore> ScaleScores(std::span<const std::pair<std::string, core::NodeFit>> fits);
// The same over (tier, score) pairs: the 0-10 score of each, in order.
struct TierScore {
  int tier = 0;
  double score = 0;
};
std::vector<int64_t> ScaleTierScores(std::span<const TierScore> fits);

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CLUSTER_CACHE_H_
