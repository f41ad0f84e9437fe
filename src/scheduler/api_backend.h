// tessera-scheduler against a real API server: informers on nodes and pods feed the cluster cache (ApiSync),
// binds are written through the API, pods the extender has not seen are fetched, problems become Events, and
// with several replicas a Lease elects the one that binds.
//
//   ApiBackend backend(api, cache, options);
//   backend.Start();                       // informers; returns when both have listed once (or the timeout)
//   Extender extender(cache, backend, &backend);
//   every few seconds: backend.Housekeeping();
//   GET /readyz -> backend.Ready()         // synced, and the leader when leader election is on
//
// Bind is one write: the v1 Binding carries the assignment annotations, and the API server sets them on the
// pod together with spec.nodeName (docs/protocols.md's "annotations, then the binding", made atomic). A
// replica that is not the leader refuses binds, so that two replicas never decide on the same GPUs; with a
// Service whose readiness follows Ready(), kube-scheduler only reaches the leader anyway.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_SCHEDULER_API_BACKEND_H_
#define TESSERA_SCHEDULER_API_BACKEND_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "common/mutex.h"
#include "k8s/informer.h"
#include "k8s/kube_api.h"
#include "k8s/leader_election.h"
#include "scheduler/api_sync.h"
#include "scheduler/dra_controller.h"
#include "scheduler/extender.h"

namespace tessera::scheduler {

struct ApiBackendOptions {
  // sync.clock is the backend's clock: the informers' backoff, the leader election, heartbeats' age and the
  // time written on a bind read it.
  SyncOptions sync;
  std::chrono::seconds sync_timeout{60};
  // Leader election: off when lease_name is empty.
  std::string lease_namespace = "tessera-system";
  std::string lease_name;
  std::string identity;  // this replica (the pod name)
  std::string component = "tessera-scheduler";
};

class ApiBackend : public Binder, public PodSource {
 public:
  ApiBackend(k8s::KubeApi& api, ClusterCache& cache, ApiBackendOptions options);
  ~ApiBackend() override;

  // Starts the informers (and the election) and waits until nodes and pods have been listed once.
  absl::Status Start();
  void Stop();

  // Stale heartbeats, the problems found since the last call posted as Events, and ReconcileLedger when due.
  void Housekeeping();
  // The ledger against the API, every kReconcilePeriod (the clock's): a pod the ledger holds (ClusterCache::
  // RecordedPods) that the pod informer has not had for a whole period is looked up in the API itself, and
  // released when the API has it no more, has another pod under its name, or has it finished: a deletion
  // missed, whatever the cause (docs/faults.md, guarantee 4). The informer alone is not enough to release on:
  // a pod confirmed by this replica's own bind may not be in its store yet. Returns how many were released;
  // a lookup that fails leaves the pod for the next period.
  int ReconcileLedger();
  static constexpr std::chrono::seconds kReconcilePeriod{30};
  static constexpr int kReconcileLookups = 64;  // pods looked up in the API a period, at most
  // Listed, leading, and the ledger rebuilt for the term it leads in (EnsureLedgerCurrent).
  bool Ready() const;
  bool IsLeader() const;
  // A replica that takes the lead records its ledger's pods again from the pod informer at once, before it
  // binds or writes a share (ClusterCache::ReplacePods), as a restarted one starts: as a standby it followed
  // the leader's writes one event at a time, beside its own changes of shares, which it did not write. Run
  // when it starts leading and at each housekeeping round; nothing without leader election.
  void EnsureLedgerCurrent();
  // With leader election, the Lease term this replica leads in now (nullopt once it leads no more); without,
  // nullopt. Read under the elector's lock with the leadership (k8s::LeaderElector::LeadingTerm).
  std::optional<int64_t> LeadingTerm() const;
  ApiSync& sync() { return sync_; }
  // Feeds the DRA controller from the node and pod informers too (call before Start; it must outlive them).
  void SetDra(DraController* dra) { dra_ = dra; }
  // Told every node the informer delivers (deleted: true when it is gone). Set before Start.
  void SetNodeObserver(std::function<void(const k8s::Json& node, bool deleted)> observer) {
    node_observer_ = std::move(observer);
  }

  absl::Status Bind(const BindTarget& pod, const core::Placement& placement) override;
  absl::Status UpdateAssignment(const BindTarget& pod, const core::Placement& placement) override;
  absl::StatusOr<formats::PodObject> GetPod(const std::string& ns, const std::string& name) override;

 private:
  void OnNode(const k8s::Json& node);
  void OnPod(const k8s::Json& pod);
  // With leader election: the term this replica leads in when its ledger was rebuilt for it (it may bind and
  // write in it), else nullopt.
  std::optional<int64_t> ActingTerm() const;

  k8s::KubeApi& api_;
  ClusterCache& cache_;
  const ApiBackendOptions options_;
  ApiSync sync_;
  std::unique_ptr<k8s::Informer> nodes_;
  std::unique_ptr<k8s::Informer> pods_;
  std::unique_ptr<k8s::LeaderElector> elector_;
  std::atomic<bool> started_{false};
  // The Lease term the ledger was last rebuilt for (EnsureLedgerCurrent); -1: none yet.
  Mutex rebuild_mu_;
  std::atomic<int64_t> ledger_term_{-1};
  // ReconcileLedger's, on the housekeeping thread only: when it last ran, and the pods the informer lacked.
  std::optional<std::chrono::steady_clock::time_point> last_reconcile_;
  std::set<core::PodUid> missing_;
  DraController* dra_ = nullptr;
  std::function<void(const k8s::Json& node, bool deleted)> node_observer_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_API_BACKEND_H_
