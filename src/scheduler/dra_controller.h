// tessera-scheduler's side of DRA placement (docs/dra.md, "Placement by Tessera"): it follows the DRA objects
// (ResourceSlices, DeviceClasses, ResourceClaims, ResourceClaimTemplates), decides the claims of the pods the
// webhook gated with the DraAllocator, and writes each decision as kube-scheduler would have: the claim's
// status.allocation and status.reservedFor in one conditional write, then the pod's gate lifted.
//
//   DraController dra(api, {.allocator = {.seed = 42}}, [&] { return backend.IsLeader(); });
//   dra.Start();
//   node and pod informers: dra.OnNode(n) / dra.OnNodeDeleted(n) / dra.OnPod(p) / dra.OnPodDeleted(p)
//   webhook: dra.ShouldGate(pod)      // the pod's claims all use Tessera's classes
//
// Only the leader decides (the loop idles elsewhere). A write that conflicts (409) is decided again from
// fresh state at the next round; a claim the controller allocated is counted from its write until the
// informer shows it, so that two rounds never hand out one share twice. A pod waits gated, with an Event and
// the tessera.dev/dra-waiting annotation that say why, while nothing fits; a pod Tessera cannot decide (a
// selector outside dra_selector.h's subset, a feature it does not model) is handed to kube-scheduler at once,
// with an Event. When every tessera-scheduler is down, tessera-node lifts the gate after a while
// (docs/dra.md).
//
// A pod whose claims Tessera placed but that kube-scheduler does not bind (the allocation's node is gone,
// full, or refuses it for a reason Tessera does not model) has its claims deallocated, with an Event, and
// placed again at once, away from that node (dra_rebind.h; docs/dra.md, "When the pod cannot bind").
//
// Thread-safety: thread-safe; the informers' handlers and the webhook call in from their threads.
#ifndef TESSERA_SCHEDULER_DRA_CONTROLLER_H_
#define TESSERA_SCHEDULER_DRA_CONTROLLER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/cluster_types.h"
#include "k8s/informer.h"
#include "k8s/kube_api.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/dra_allocator.h"

namespace tessera::scheduler {

// The namespaces' GPU quotas, which both paths count (docs/dra.md, "Quotas on both paths"): the cluster
// cache's (ClusterCache) in tessera-scheduler. Thread-safe.
class QuotaExchange {
 public:
  virtual ~QuotaExchange() = default;
  // Every quota, with what the device-plugin path's pods hold (held_here) and the DRA path last said it
  // holds.
  virtual std::vector<core::QuotaStanding> Standings() const = 0;
  // What the claims on Tessera's devices hold (held_here of each entry), for the device-plugin path to count.
  virtual void SetHeldByDra(std::vector<core::QuotaStanding> held) = 0;
};

// The cluster cache's quotas, exchanged with the DRA controller.
class CacheQuotaExchange final : public QuotaExchange {
 public:
  explicit CacheQuotaExchange(ClusterCache& cache) : cache_(cache) {}
  std::vector<core::QuotaStanding> Standings() const override { return cache_.QuotaStandings(); }
  // What the claims hold is, for the extender's cluster, held elsewhere.
  void SetHeldByDra(std::vector<core::QuotaStanding> held) override {
    for (core::QuotaStanding& q : held) q.held_elsewhere = q.held_here;
    cache_.SetQuotaHeldByDra(held);
  }

 private:
  ClusterCache& cache_;
};

struct DraControllerOptions {
  dra::AllocatorOptions allocator;
  std::chrono::milliseconds period{200};  // between rounds while pods wait
  std::string component = "tessera-scheduler";
  std::string identity;
  // How long kube-scheduler may refuse to bind a pod whose claims Tessera placed (PodScheduled False,
  // Unschedulable) before they are deallocated and placed again; 0: never. A node gone or full: at once.
  std::chrono::seconds rebind_after{30};
  // Time (allocationTimestamp, how long a claim written is counted before the informer shows it, how long a
  // pod has been refused, the informers' backoff); never null (common/clock.h). Must outlive the controller.
  const Clock* clock = &RealClock();
  // Quotas shared with the device-plugin path (nullptr: none on the DRA path, as without --quota-file). Must
  // outlive the controller.
  QuotaExchange* quotas = nullptr;
  // Where replicas elect a leader: the Lease term this replica leads in now, nullopt once it leads no more
  // (k8s::LeaderElector::LeadingTerm). Every claim status write is then preceded by the claim naming this
  // replica (`identity`) and that term (tessera.dev/leader, tessera.dev/leader-term), which the API server's
  // claim fence checks against the Lease at the status write (deploy/scheduler/70-leader-fence.yaml). Unset:
  // one replica, nothing to fence.
  std::function<std::optional<int64_t>()> leading_term;
};

struct DraCounters {
  int64_t placed = 0, handed_over = 0, waiting = 0, conflicts = 0, write_errors = 0, rounds = 0;
  int64_t released = 0;  // claims deallocated because their pod could not bind
  int64_t replaced = 0;  // pods whose released claims were placed again
};

class DraController {
 public:
  DraController(k8s::KubeApi& api, DraControllerOptions options, std::function<bool()> is_leader);
  ~DraController();

  void Start();
  void Stop();

  void OnNode(const k8s::Json& node);
  void OnNodeDeleted(const k8s::Json& node);
  void OnPod(const k8s::Json& pod);
  void OnPodDeleted(const k8s::Json& pod);

  // Should the webhook gate this pod: it names ResourceClaims (or templates) whose requests all use Tessera's
  // device classes, and nothing the allocator does not model (pod affinity, topology spread)? Reads the
  // informers, else the API server.
  bool ShouldGate(const k8s::Json& pod) const;

  DraCounters counters() const;
  // The ResourceSlices of Tessera's driver as the informer holds them (empty before Start): the webhook's
  // conversion of extended resources reads them (dra_conversion.h).
  std::vector<std::shared_ptr<const k8s::Json>> TesseraSlices() const;

 private:
  struct Tracked {
    std::string uid;
    std::string node;  // "" while not bound
    dra::HostRequest host;
  };
  void Run(std::stop_token stop);
  void Round();
  // Reads the quotas and what the device-plugin path holds of them into the allocator, and tells that path
  // what the allocated claims hold. Round thread only.
  void ExchangeQuotas(const std::vector<dra::Pool>& pools, const std::vector<k8s::Json>& allocated);
  // Deallocates the claims of a pod kube-scheduler does not bind (dra_rebind.h); the claims as written, by
  // UID, into `fresh`. False when a write failed.
  bool Release(const k8s::Json& pod, const std::vector<k8s::Json>& claims, const std::vector<size_t>& which,
               const std::string& node, const std::string& reason, std::map<std::string, k8s::Json>& fresh);
  // The claim as its status may be written now: with the finalizer when `finalizer`, and naming this replica
  // and its term where leaders are elected (DraControllerOptions::leading_term); a PUT conditional on the
  // claim's resourceVersion where either was missing. Unavailable when this replica leads no more.
  absl::StatusOr<k8s::Json> ReadyToWrite(const k8s::Json& claim, bool finalizer);
  std::optional<k8s::Json> ClaimSpecOf(const std::string& ns, const k8s::Json& entry) const;
  void Lift(const k8s::Json& pod, const char* label, const std::string& reason);
  void Event(const k8s::Json& pod, const std::string& type, const std::string& reason,
             const std::string& message);
  // A change: `freed` when it may have made room (pods that found none are tried again).
  void Wake(bool freed);

  k8s::KubeApi& api_;
  const DraControllerOptions options_;
  const std::function<bool()> is_leader_;
  dra::DraAllocator allocator_;  // the round thread's
  std::unique_ptr<k8s::Informer> slices_, classes_, claims_, templates_;

  mutable Mutex mu_;
  CondVar wake_;
  bool dirty_ ABSL_GUARDED_BY(mu_) = true;
  uint64_t freed_ ABSL_GUARDED_BY(mu_) = 0;  // changes that may have made room
  // Parsed when the informer delivers them (labels, taints, allocatable, the agent's link matrix), not each round.
  std::map<std::string, dra::NodeView> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Tracked> pods_ ABSL_GUARDED_BY(mu_);     // every pod, by "ns/name"
  std::map<std::string, k8s::Json> gated_ ABSL_GUARDED_BY(mu_);  // gated pods, by "ns/name"
  // Pods labelled placed that are not bound yet, by "ns/name" (usually for a moment).
  std::map<std::string, k8s::Json> placed_ ABSL_GUARDED_BY(mu_);
  DraCounters counters_ ABSL_GUARDED_BY(mu_);
  // Round thread only: claims this controller allocated, by UID, until the informer shows them allocated.
  std::map<std::string, std::pair<k8s::Json, std::chrono::steady_clock::time_point>> written_;
  std::map<std::string, std::string> told_;            // pod UID -> the last reason posted (no repeats)
  std::map<std::string, uint64_t> waited_at_;          // pod UID -> freed_ when it last found no place
  // Round thread only: placed pods kube-scheduler refuses, by UID: the allocation refused (its signature)
  // and since when; and the nodes it refused them on, which placing them again avoids.
  std::map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>> refused_;
  std::map<std::string, std::set<std::string>> avoid_;
  std::string quota_signature_;                        // Round thread only: the quotas and holdings last read
  std::string last_write_error_ ABSL_GUARDED_BY(mu_);  // pod UID -> the last reason posted (no repeats)
  std::jthread thread_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_DRA_CONTROLLER_H_
