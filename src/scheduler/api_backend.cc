#include "scheduler/api_backend.h"

#include "common/log.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "formats/pod_object.h"
#include "k8s/api_status.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

ApiBackend::ApiBackend(k8s::KubeApi& api, ClusterCache& cache, ApiBackendOptions options)
    : api_(api), cache_(cache), options_(std::move(options)), sync_(cache, options_.sync) {}

ApiBackend::~ApiBackend() {
  Stop();
}

absl::Status ApiBackend::Start() {
  if (started_.exchange(true)) return absl::OkStatus();
  k8s::InformerOptions informer_options;
  informer_options.clock = options_.sync.clock;
  nodes_ = std::make_unique<k8s::Informer>(
      api_, k8s::kNodes, informer_options,
      k8s::InformerHandlers{.on_add = [this](const k8s::Json& n) { OnNode(n); },
                            .on_update = [this](const k8s::Json&, const k8s::Json& n) { OnNode(n); },
                            .on_delete =
                                [this](const k8s::Json& n, bool) {
                                  sync_.OnNodeDeleted(n);
                                  if (dra_ != nullptr) dra_->OnNodeDeleted(n);
                                  if (node_observer_) node_observer_(n, true);
                                },
                            .on_synced = nullptr});
  pods_ = std::make_unique<k8s::Informer>(
      api_, k8s::kPods, informer_options,
      k8s::InformerHandlers{.on_add = [this](const k8s::Json& p) { OnPod(p); },
                            .on_update = [this](const k8s::Json&, const k8s::Json& p) { OnPod(p); },
                            .on_delete =
                                [this](const k8s::Json& p, bool) {
                                  sync_.OnPodDeleted(p);
                                  if (dra_ != nullptr) dra_->OnPodDeleted(p);
                                },
                            .on_synced = nullptr});
  // Nodes first, listed whole before the pods, so that the pods find their nodes. Listed side by side, the
  // pods' list could end first (a failed or slow page of nodes): every bound pod was then reported as
  // assigned to a node the scheduler does not know ("delete the pod to reschedule it", as an Event) and kept
  // aside, though its node came a moment later (pods of unknown nodes still wait for them).
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options_.sync_timeout);
  const auto unsynced = [&](const k8s::Informer& informer, const char* what) {
    const absl::Status why = informer.last_error();
    if (why.ok()) {
      return absl::UnavailableError(StrCat("the list of ", what, " did not end within ",
                                           options_.sync_timeout.count(),
                                           " s, though no request failed: a large cluster or a busy machine "
                                           "needs a longer wait (tessera-scheduler --sync-timeout)"));
    }
    return absl::UnavailableError(StrCat("could not list ", what, " within ", options_.sync_timeout.count(),
                                         " s (", Message(why),
                                         "); check the API server address, credentials and RBAC"));
  };
  nodes_->Start();
  if (!nodes_->WaitForSync(timeout)) return unsynced(*nodes_, "nodes");
  pods_->Start();
  if (!pods_->WaitForSync(timeout)) return unsynced(*pods_, "pods");
  if (!options_.lease_name.empty()) {
    k8s::LeaderElectionConfig c;
    c.lease_namespace = options_.lease_namespace;
    c.lease_name = options_.lease_name;
    c.identity = options_.identity;
    c.clock = options_.sync.clock;
    c.on_started_leading = [this] {
      log::Info("leading", {{"identity", options_.identity}});
      EnsureLedgerCurrent();
    };
    c.on_stopped_leading = [this] { log::Info("no longer leading", {{"identity", options_.identity}}); };
    absl::StatusOr<std::unique_ptr<k8s::LeaderElector>> elector =
        k8s::LeaderElector::Create(api_, std::move(c));
    if (!elector.ok()) return elector.status();
    elector_ = *std::move(elector);
    elector_->Start();
  }
  return absl::OkStatus();
}

void ApiBackend::Stop() {
  if (elector_) elector_->Stop();
  if (pods_) pods_->Stop();
  if (nodes_) nodes_->Stop();
}

void ApiBackend::OnNode(const k8s::Json& node) {
  sync_.OnNode(node);
  if (dra_ != nullptr) dra_->OnNode(node);
  if (node_observer_) node_observer_(node, false);
}

void ApiBackend::OnPod(const k8s::Json& pod) {
  sync_.OnPod(pod);
  if (dra_ != nullptr) dra_->OnPod(pod);
}

bool ApiBackend::IsLeader() const {
  return elector_ == nullptr || elector_->IsLeader();
}

std::optional<int64_t> ApiBackend::LeadingTerm() const {
  return elector_ == nullptr ? std::nullopt : elector_->LeadingTerm();
}

bool ApiBackend::Ready() const {
  if (!nodes_ || !pods_ || !nodes_->HasSynced() || !pods_->HasSynced()) return false;
  return elector_ == nullptr || ActingTerm().has_value();
}

std::optional<int64_t> ApiBackend::ActingTerm() const {
  std::optional<int64_t> term = elector_->LeadingTerm();
  if (!term || *term != ledger_term_.load()) return std::nullopt;
  return term;
}

void ApiBackend::EnsureLedgerCurrent() {
  if (elector_ == nullptr || pods_ == nullptr) return;
  MutexLock lock(&rebuild_mu_);
  std::optional<int64_t> term = elector_->LeadingTerm();
  if (!term || *term == ledger_term_.load()) return;
  size_t listed = 0;
  sync_.ResyncPods([&] {
    std::vector<std::shared_ptr<const k8s::Json>> items = pods_->Items();
    listed = items.size();
    return items;
  });
  ledger_term_ = *term;
  log::Info("took the lead: the ledger recorded again from the API's pods",
            {{"term", StrCat(*term)}, {"pods", StrCat(listed)}});
}

void ApiBackend::Housekeeping() {
  EnsureLedgerCurrent();
  sync_.CheckHeartbeats(options_.sync.clock->Now());
  ReconcileLedger();
  for (const Problem& p : sync_.TakeProblems()) {
    k8s::EventSpec e;
    e.involved_object.kind = p.kind;
    e.involved_object.api_version = "v1";
    e.involved_object.ns = p.ns;
    e.involved_object.name = p.name;
    e.involved_object.uid = p.uid;
    e.type = "Warning";
    e.reason = p.reason;
    e.message = p.message;
    e.component = options_.component;
    e.reporting_instance = options_.identity;
    if (absl::StatusOr<k8s::Json> st = api_.CreateEvent(e); !st.ok()) {
      log::Warn("could not post an event", {{"object", p.name}, {"error", Message(st.status())}});
    }
  }
}

int ApiBackend::ReconcileLedger() {
  if (pods_ == nullptr || !pods_->HasSynced()) return 0;
  const auto now = options_.sync.clock->Steady();
  if (last_reconcile_ && now - *last_reconcile_ < kReconcilePeriod) return 0;
  last_reconcile_ = now;
  std::set<core::PodUid> missing;
  int released = 0;
  int lookups = 0;
  for (const auto& [uid, name] : cache_.RecordedPods()) {
    // The informer has it: its deletion, when it comes, releases it.
    std::shared_ptr<const k8s::Json> seen = pods_->Get(name);
    if (seen != nullptr && k8s::Uid(*seen) == uid.value()) continue;
    // Lacking for less than a period: the informer may just be behind our own bind.
    // And at most kReconcileLookups looked up a period, the rest the next: an informer blind to a busy API
    // must not make the scheduler send it a GET per pod all at once.
    if (!missing_.contains(uid) || ++lookups > kReconcileLookups) {
      missing.insert(uid);
      continue;
    }
    const size_t slash = name.find('/');
    absl::StatusOr<k8s::Json> pod = api_.Get(k8s::kPods, name.substr(0, slash), name.substr(slash + 1));
    std::string why;
    if (!pod.ok() && absl::IsNotFound(pod.status())) {
      why = "the API has no such pod";
    } else if (!pod.ok()) {
      missing.insert(uid);  // cannot tell now: ask again next period
      continue;
    } else if (k8s::Uid(*pod) != uid.value()) {
      why = "another pod has its name";
    } else if (absl::StatusOr<formats::PodObject> parsed = formats::ParsePodObject(*pod);
               parsed.ok() && parsed->terminated()) {
      why = "it has finished";
    } else {
      continue;  // the API has it: the informer is behind, and will show it
    }
    cache_.ForgetPod(uid);
    ++released;
    log::Warn("released a pod's GPUs whose deletion was not seen",
              {{"pod", name}, {"uid", uid.value()}, {"why", why}});
  }
  missing_ = std::move(missing);
  return released;
}

absl::Status ApiBackend::Bind(const BindTarget& pod, const core::Placement& placement) {
  // The term is read with the leadership, under one lock: a replica paused after this point binds with the
  // term it led in, which the API server refuses once the Lease has moved on (70-leader-fence.yaml).
  std::optional<int64_t> term;
  if (elector_ != nullptr) {
    term = elector_->LeadingTerm();
    if (!term) {
      return absl::UnavailableError(
          "this tessera-scheduler replica is not the leader; retry (the leader binds)");
    }
    if (*term != ledger_term_.load()) {
      return absl::UnavailableError(
          "this tessera-scheduler replica has just taken the lead and is reading the pods; retry");
    }
  }
  k8s::BindOptions options;
  options.pod_uid = pod.uid;
  if (!placement.containers.empty()) {
    options.annotations = {
        {formats::kAnnotationAssignment, formats::FormatAssignment(placement)},
        {formats::kAnnotationAssignedAt, formats::FormatHeartbeat(options_.sync.clock->Now())},
        {formats::kAnnotationPhase, formats::kPhaseBound}};
  }
  if (term) {
    options.annotations[formats::kAnnotationLeader] = options_.identity;
    options.annotations[formats::kAnnotationLeaderTerm] = StrCat(*term);
  }
  absl::Status st = api_.Bind(pod.ns, pod.name, pod.node, options);
  const bool conflict = absl::IsAlreadyExists(st) || absl::IsFailedPrecondition(st) || k8s::IsConflict(st);
  if (st.ok() || !conflict) return st;
  // 409: bound already. A retried bind (kube-scheduler timed out waiting for the first) is fine when the pod
  // is on this node with this decision.
  absl::StatusOr<k8s::Json> now = api_.Get(k8s::kPods, pod.ns, pod.name);
  if (!now.ok()) return st;
  if (k8s::Uid(*now) != pod.uid) return absl::NotFoundError("the pod was replaced (its UID changed)");
  if (k8s::NodeName(*now) != pod.node) {
    return absl::AlreadyExistsError(StrCat("the pod is bound to node ", k8s::NodeName(*now), " already"));
  }
  return absl::OkStatus();
}

absl::Status ApiBackend::UpdateAssignment(const BindTarget& pod, const core::Placement& placement) {
  // Only the leader rewrites shares. A standby's ledger changes shares too, but on its own view: it takes the
  // leader's compressions one pod at a time, each as a move (the pod released, then recorded at its new share),
  // and the release gives the co-tenants compressed a moment ago their share back. Written, those give-backs
  // landed over the leader's compressions, and the GPU held more than its capacity in the pods' annotations (the
  // fault harness: the standby wrote them 0.25 s after the leader's compressions).
  k8s::Json annotations = {{formats::kAnnotationAssignment, formats::FormatAssignment(placement)}};
  if (elector_ != nullptr) {
    std::optional<int64_t> term = ActingTerm();
    if (!term) {
      return absl::FailedPreconditionError(
          "this tessera-scheduler replica is not the leader (or has just taken the lead and is reading the "
          "pods); the leader writes the pods' shares");
    }
    // Named as a bind is: the API server refuses the rewrite once the Lease has moved past the term
    // (tessera-share-fence, 70-leader-fence.yaml), as from a leader paused between this check and the write.
    annotations[formats::kAnnotationLeader] = options_.identity;
    annotations[formats::kAnnotationLeaderTerm] = StrCat(*term);
  }
  k8s::Json patch = {{"metadata", {{"annotations", std::move(annotations)}}}};
  absl::StatusOr<k8s::Json> st = api_.Patch(k8s::kPods, pod.ns, pod.name, k8s::PatchType::kMerge, patch);
  if (!st.ok() && absl::IsNotFound(st.status())) return absl::OkStatus();  // gone: nothing to tell it
  return st.status();
}

absl::StatusOr<formats::PodObject> ApiBackend::GetPod(const std::string& ns, const std::string& name) {
  if (pods_) {
    if (std::shared_ptr<const k8s::Json> cached = pods_->Get(StrCat(ns, "/", name))) {
      return formats::ParsePodObject(*cached);
    }
  }
  absl::StatusOr<k8s::Json> pod = api_.Get(k8s::kPods, ns, name);
  if (!pod.ok()) return pod.status();
  return formats::ParsePodObject(*pod);
}

}  // namespace tessera::scheduler
