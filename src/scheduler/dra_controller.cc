#include "scheduler/dra_controller.h"

#include <algorithm>

#include "common/log.h"
#include "common/quote.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/dra_placement.h"
#include "k8s/api_status.h"
#include "scheduler/dra_rebind.h"

namespace tessera::scheduler {

namespace {

using k8s::Json;

const k8s::ResourceType kDeviceClasses{"resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false};
const k8s::ResourceType kClaimTemplates{"resource.k8s.io", "v1", "resourceclaimtemplates",
                                        "ResourceClaimTemplate", true};
// What a round writes at most: a flood of gated pods is worked through over several rounds.
constexpr size_t kMaxPodsPerRound = 200;
// A claim written but not yet seen allocated by the informer is counted this long at most (a claim deleted
// meanwhile is never seen).
constexpr std::chrono::seconds kWrittenTtl{60};
// Pods whose claims a round deallocates at most (each with a write per claim and an event).
constexpr size_t kMaxReleasesPerRound = 50;

using dra::Field;
using dra::Path;
using dra::Str;

// Is ours the pod's last gate? Claims are placed only then, as kube-scheduler places only ungated pods (a
// queue such as Kueue gates a pod until it is admitted).
bool OnlyOurGate(const Json& pod) {
  const Json& gates = Field(Field(pod, "spec"), "schedulingGates");
  return gates.is_array() && gates.size() == 1 && Str(gates[0], "name") == formats::kDraPlacementGate;
}

bool HasGate(const Json& pod) {
  const Json& gates = Field(Field(pod, "spec"), "schedulingGates");
  if (!gates.is_array()) return false;
  return std::any_of(gates.begin(), gates.end(),
                     [](const Json& g) { return Str(g, "name") == formats::kDraPlacementGate; });
}

bool Finished(const Json& pod) {
  const std::string phase = Str(Field(pod, "status"), "phase");
  return phase == "Succeeded" || phase == "Failed";
}

bool Placed(const Json& pod) {
  return !HasGate(pod) && !Finished(pod) && Str(Field(pod, "spec"), "nodeName").empty() &&
         Field(Field(pod, "metadata"), "deletionTimestamp").is_null() &&
         Str(Field(Field(pod, "metadata"), "labels"), formats::kDraPlacementLabel) == formats::kDraPlaced;
}

// kube-scheduler's finalizer on the claims it allocates (resourceapi.Finalizer): kube-controller-manager's
// resourceclaim controller deallocates a claim that carries it once no pod holds it any more, then removes
// it. Without it, a claim made by hand keeps its allocation (and its GPU share) after its pods are gone.
constexpr char kClaimFinalizer[] = "resource.kubernetes.io/delete-protection";

bool HasFinalizer(const Json& claim) {
  const Json& f = Field(Field(claim, "metadata"), "finalizers");
  return f.is_array() && std::find(f.begin(), f.end(), Json(kClaimFinalizer)) != f.end();
}

bool ReservedFor(const Json& claim, const std::string& pod_uid) {
  const Json& reserved = Field(Field(claim, "status"), "reservedFor");
  if (!reserved.is_array()) return false;
  return std::any_of(reserved.begin(), reserved.end(),
                     [&](const Json& r) { return Str(r, "uid") == pod_uid; });
}

}  // namespace

DraController::DraController(k8s::KubeApi& api, DraControllerOptions options, std::function<bool()> is_leader)
    : api_(api),
      options_(std::move(options)),
      is_leader_(std::move(is_leader)),
      allocator_(options_.allocator) {}

DraController::~DraController() {
  Stop();
}

void DraController::Start() {
  // Any change of slices or classes may make room; of claims, a deletion or an allocation that went away.
  auto wake = k8s::InformerHandlers{.on_add = [this](const Json&) { Wake(true); },
                                    .on_update = [this](const Json&, const Json&) { Wake(true); },
                                    .on_delete = [this](const Json&, bool) { Wake(true); },
                                    .on_synced = nullptr};
  auto claim_wake = k8s::InformerHandlers{
      .on_add = [this](const Json&) { Wake(false); },
      .on_update =
          [this](const Json& old_claim, const Json& claim) {
            const bool freed = Field(Field(old_claim, "status"), "allocation").is_object() &&
                               !Field(Field(claim, "status"), "allocation").is_object();
            Wake(freed);
          },
      .on_delete = [this](const Json&, bool) { Wake(true); },
      .on_synced = nullptr};
  k8s::InformerOptions every;
  every.clock = options_.clock;
  k8s::InformerOptions tessera_slices = every;
  tessera_slices.field_selector = StrCat("spec.driver=", formats::kDraDriver);
  slices_ = std::make_unique<k8s::Informer>(api_, k8s::kResourceSlices, tessera_slices, wake);
  classes_ = std::make_unique<k8s::Informer>(api_, kDeviceClasses, every, wake);
  claims_ = std::make_unique<k8s::Informer>(api_, k8s::kResourceClaims, every, claim_wake);
  templates_ = std::make_unique<k8s::Informer>(api_, kClaimTemplates, every, k8s::InformerHandlers{});
  for (k8s::Informer* i : {slices_.get(), classes_.get(), claims_.get(), templates_.get()}) i->Start();
  thread_ = std::jthread([this](std::stop_token stop) { Run(stop); });
}

void DraController::Stop() {
  if (thread_.joinable()) {
    thread_.request_stop();
    Wake(false);
    thread_.join();
  }
  for (auto* i : {&slices_, &classes_, &claims_, &templates_}) {
    if (*i) (*i)->Stop();
  }
}

void DraController::Wake(bool freed) {
  MutexLock lock(&mu_);
  dirty_ = true;
  if (freed) ++freed_;
  wake_.Signal();
}

void DraController::OnNode(const Json& node) {
  dra::NodeView view = dra::ParseNode(node);
  MutexLock lock(&mu_);
  nodes_[view.name] = std::move(view);
  dirty_ = true;
  ++freed_;
}

void DraController::OnNodeDeleted(const Json& node) {
  MutexLock lock(&mu_);
  nodes_.erase(Str(Field(node, "metadata"), "name"));
  dirty_ = true;
}

void DraController::OnPod(const Json& pod) {
  const std::string key =
      StrCat(Str(Field(pod, "metadata"), "namespace"), "/", Str(Field(pod, "metadata"), "name"));
  const bool gated = HasGate(pod);
  const bool placed = Placed(pod);
  MutexLock lock(&mu_);
  if (placed) {
    placed_[key] = pod;
  } else {
    placed_.erase(key);
  }
  if (Finished(pod)) {
    if (pods_.erase(key) > 0) ++freed_;  // its CPU and memory
    gated_.erase(key);
  } else {
    Tracked& t = pods_[key];
    t.uid = Str(Field(pod, "metadata"), "uid");
    t.node = Str(Field(pod, "spec"), "nodeName");
    t.host = dra::PodHostRequest(pod);
    if (gated) {
      gated_[key] = pod;
    } else {
      gated_.erase(key);
    }
  }
  dirty_ = true;
  if (gated) wake_.Signal();
}

void DraController::OnPodDeleted(const Json& pod) {
  const std::string key =
      StrCat(Str(Field(pod, "metadata"), "namespace"), "/", Str(Field(pod, "metadata"), "name"));
  MutexLock lock(&mu_);
  pods_.erase(key);
  gated_.erase(key);
  placed_.erase(key);
  dirty_ = true;
  ++freed_;
}

DraCounters DraController::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

std::vector<std::shared_ptr<const Json>> DraController::TesseraSlices() const {
  return slices_ ? slices_->Items() : std::vector<std::shared_ptr<const Json>>{};
}

std::optional<Json> DraController::ClaimSpecOf(const std::string& ns, const Json& entry) const {
  if (std::string name = Str(entry, "resourceClaimName"); !name.empty()) {
    std::shared_ptr<const Json> claim = claims_ ? claims_->Get(StrCat(ns, "/", name)) : nullptr;
    if (claim) return Field(*claim, "spec");
    absl::StatusOr<Json> got = api_.Get(k8s::kResourceClaims, ns, name);
    if (got.ok()) return Field(*got, "spec");
    return std::nullopt;
  }
  if (std::string name = Str(entry, "resourceClaimTemplateName"); !name.empty()) {
    std::shared_ptr<const Json> t = templates_ ? templates_->Get(StrCat(ns, "/", name)) : nullptr;
    if (t) return Field(Field(*t, "spec"), "spec");
    absl::StatusOr<Json> got = api_.Get(kClaimTemplates, ns, name);
    if (got.ok()) return Field(Field(*got, "spec"), "spec");
  }
  return std::nullopt;
}

bool DraController::ShouldGate(const Json& pod) const {
  const Json& spec = Field(pod, "spec");
  const Json& claims = Field(spec, "resourceClaims");
  if (!claims.is_array() || claims.empty() || HasGate(pod)) return false;
  // What the allocator does not model stays kube-scheduler's whole decision.
  const Json& affinity = Field(spec, "affinity");
  if (!Field(affinity, "podAffinity").is_null() || !Field(affinity, "podAntiAffinity").is_null() ||
      !Field(spec, "topologySpreadConstraints").is_null() || !Str(spec, "nodeName").empty()) {
    return false;
  }
  std::string ns = Str(Field(pod, "metadata"), "namespace");
  if (ns.empty()) ns = "default";
  for (const Json& entry : claims) {
    std::optional<Json> claim_spec = ClaimSpecOf(ns, entry);
    if (!claim_spec || !dra::DraAllocator::UsesOnly(*claim_spec, options_.allocator.classes)) return false;
  }
  return true;
}

void DraController::Run(std::stop_token stop) {
  while (!stop.stop_requested()) {
    {
      MutexLock lock(&mu_);
      // A round after a change, and every few periods anyway while pods wait (a write that failed).
      if (!dirty_) wake_.WaitFor(&mu_, options_.period * 10);
      dirty_ = false;
    }
    if (stop.stop_requested()) break;
    Round();
    // Changes that arrive during a round are taken together in the next one.
    MutexLock lock(&mu_);
    wake_.WaitFor(&mu_, options_.period);
  }
}

void DraController::Event(const Json& pod, const std::string& type, const std::string& reason,
                          const std::string& message) {
  k8s::EventSpec e;
  e.involved_object.kind = "Pod";
  e.involved_object.api_version = "v1";
  e.involved_object.ns = Str(Field(pod, "metadata"), "namespace");
  e.involved_object.name = Str(Field(pod, "metadata"), "name");
  e.involved_object.uid = Str(Field(pod, "metadata"), "uid");
  e.type = type;
  e.reason = reason;
  e.message = message;
  e.component = options_.component;
  e.reporting_instance = options_.identity;
  if (absl::StatusOr<Json> st = api_.CreateEvent(e); !st.ok()) {
    log::Warn("could not post an event", {{"pod", e.involved_object.name}, {"error", Message(st.status())}});
  }
}

// Lifts the gate (one conditional write of the pod), with the label saying who decides the claims.
void DraController::Lift(const Json& pod, const char* label, const std::string& reason) {
  Json updated = pod;
  Json gates = Json::array();
  for (const Json& g : updated["spec"]["schedulingGates"]) {
    if (Str(g, "name") != formats::kDraPlacementGate) gates.push_back(g);
  }
  updated["spec"]["schedulingGates"] = gates;
  updated["metadata"]["labels"][formats::kDraPlacementLabel] = label;
  if (Json& a = updated["metadata"]["annotations"]; a.is_object()) a.erase(formats::kDraWaitingAnnotation);
  absl::StatusOr<Json> st = api_.Update(k8s::kPods, Str(Field(pod, "metadata"), "namespace"), updated);
  if (!st.ok()) {
    MutexLock lock(&mu_);
    ++(k8s::IsConflict(st.status()) ? counters_.conflicts : counters_.write_errors);
    if (!k8s::IsConflict(st.status()) && !absl::IsNotFound(st.status())) {
      log::Warn("could not lift the DRA placement gate",
                {{"pod", Str(Field(pod, "metadata"), "name")}, {"error", Message(st.status())}});
    }
    return;
  }
  if (std::string(label) == formats::kDraFallback) {
    Event(pod, "Warning", "TesseraPlacementHandedOver",
          StrCat("kube-scheduler's allocator places this pod's claims: ", reason));
  }
}

absl::StatusOr<Json> DraController::ReadyToWrite(const Json& claim, bool finalizer) {
  Json with = claim;
  bool changed = false;
  if (finalizer && !HasFinalizer(claim)) {
    // As kube-scheduler does before it allocates (a PUT of the claim: a status write ignores metadata).
    Json& finalizers = with["metadata"]["finalizers"];
    if (!finalizers.is_array()) finalizers = Json::array();
    finalizers.push_back(kClaimFinalizer);
    changed = true;
  }
  if (options_.leading_term) {
    const std::optional<int64_t> term = options_.leading_term();
    if (!term) return absl::UnavailableError("this tessera-scheduler replica leads no more");
    Json& annotations = with["metadata"]["annotations"];
    if (!annotations.is_object()) annotations = Json::object();
    if (Str(annotations, formats::kAnnotationLeader) != options_.identity ||
        Str(annotations, formats::kAnnotationLeaderTerm) != StrCat(*term)) {
      annotations[formats::kAnnotationLeader] = options_.identity;
      annotations[formats::kAnnotationLeaderTerm] = StrCat(*term);
      changed = true;
    }
  }
  if (!changed) return claim;
  return api_.Update(k8s::kResourceClaims, Str(Field(claim, "metadata"), "namespace"), with);
}

bool DraController::Release(const Json& pod, const std::vector<Json>& claims,
                            const std::vector<size_t>& which, const std::string& node,
                            const std::string& reason, std::map<std::string, Json>& fresh) {
  // The pod as the API server has it now, not as the informer last showed it: kube-scheduler may have bound
  // it a moment ago (its claims are then in use, and must stay).
  {
    absl::StatusOr<Json> now =
        api_.Get(k8s::kPods, Str(Field(pod, "metadata"), "namespace"), Str(Field(pod, "metadata"), "name"));
    if (!now.ok() || Str(Field(*now, "metadata"), "uid") != Str(Field(pod, "metadata"), "uid") ||
        !Str(Field(*now, "spec"), "nodeName").empty() || !dra::ReadRefusal(*now).refused) {
      return false;
    }
  }
  std::vector<std::string> names;
  for (size_t k : which) {
    const Json& claim = claims[k];
    // As kube-scheduler deallocates (its PostFilter): reservation, allocation and device status cleared in
    // one write, conditional on the resourceVersion read. The API allows clearing a set allocation (only
    // changing it is refused), and reservedFor must be empty without one.
    absl::StatusOr<Json> st = ReadyToWrite(claim, /*finalizer=*/false);
    if (st.ok()) {
      Json updated = *std::move(st);
      if (Json& status = updated["status"]; status.is_object()) {
        status.erase("allocation");
        status.erase("reservedFor");
        status.erase("devices");
      }
      st = api_.Update(k8s::kResourceClaims, Str(Field(claim, "metadata"), "namespace"), updated, "status");
    }
    if (!st.ok()) {
      MutexLock lock(&mu_);
      ++(k8s::IsConflict(st.status()) ? counters_.conflicts : counters_.write_errors);
      if (!k8s::IsConflict(st.status()) && !absl::IsNotFound(st.status())) {
        log::Warn("could not deallocate a claim",
                  {{"claim", Str(Field(claim, "metadata"), "name")}, {"error", Message(st.status())}});
      }
      return false;  // decided again from fresh state next round
    }
    const std::string uid = Str(Field(claim, "metadata"), "uid");
    written_.erase(uid);
    fresh[uid] = *std::move(st);
    names.push_back(Str(Field(claim, "metadata"), "name"));
  }
  {
    MutexLock lock(&mu_);
    counters_.released += static_cast<int64_t>(which.size());
  }
  log::Info("deallocated the DRA claims of a pod that cannot bind",
            {{"pod", Str(Field(pod, "metadata"), "name")}, {"node", node}, {"reason", reason}});
  Event(pod, "Warning", "TesseraPlacementReleased",
        StrCat("this pod cannot bind where Tessera placed its claims: ", reason, ". Claim(s) ",
               StrJoin(names, ", "), " deallocated; Tessera places them again, not on node ", node,
               " (docs/dra.md)"));
  return true;
}

void DraController::ExchangeQuotas(const std::vector<dra::Pool>& pools, const std::vector<Json>& allocated) {
  if (!options_.quotas) return;
  // The quotas in force; the device-plugin path's holdings are what this path counts as held elsewhere.
  std::vector<core::QuotaStanding> quotas;
  for (core::QuotaStanding& q : options_.quotas->Standings()) {
    if (!q.limit) continue;
    q.held_elsewhere = q.held_here;
    q.held_here = 0;
    quotas.push_back(std::move(q));
  }
  // A quota raised, or room freed by the other path: the pods that waited are tried again.
  std::string signature;
  for (const core::QuotaStanding& q : quotas) {
    StrAppend(&signature, q.ns.value(), "/", q.model, "=", q.limit ? q.limit->value() : -1, ":",
              q.held_elsewhere, ";");
  }
  if (signature != quota_signature_) {
    quota_signature_ = std::move(signature);
    MutexLock lock(&mu_);
    ++freed_;
  }
  allocator_.SetQuotas(std::move(quotas));
  allocator_.SetPools(pools);
  allocator_.SetAllocatedClaims(allocated);
  options_.quotas->SetHeldByDra(allocator_.QuotaHeld());
}

void DraController::Round() {
  if (!is_leader_() || !slices_ || !slices_->HasSynced() || !classes_->HasSynced() || !claims_->HasSynced())
    return;
  bool idle = false;
  {
    MutexLock lock(&mu_);
    idle = gated_.empty() && placed_.empty();
  }
  // Idle, a round only tells the device-plugin path what the claims hold of the quotas.
  if (idle && !options_.quotas) return;
  std::vector<dra::Pool> pools;
  for (const auto& s : slices_->Items()) {
    if (absl::StatusOr<dra::Pool> p = dra::ParseSlice(*s); p.ok()) pools.push_back(*std::move(p));
  }
  std::map<std::string, dra::DeviceClass> classes;
  for (const auto& c : classes_->Items())
    classes[Str(Field(*c, "metadata"), "name")] = dra::ParseDeviceClass(*c);
  // The claims allocated, with this controller's own writes until the informer shows them.
  const auto now = options_.clock->Steady();
  std::vector<Json> allocated;
  std::set<std::string> seen;
  for (const auto& c : claims_->Items()) {
    const std::string uid = Str(Field(*c, "metadata"), "uid");
    auto w = written_.find(uid);
    if (Field(Field(*c, "status"), "allocation").is_object()) {
      allocated.push_back(*c);
      if (w != written_.end()) written_.erase(w);
    } else if (w != written_.end()) {
      allocated.push_back(w->second.first);
    }
    seen.insert(uid);
  }
  for (auto it = written_.begin(); it != written_.end();) {
    it = (!seen.contains(it->first) && now - it->second.second > kWrittenTtl) ? written_.erase(it)
                                                                              : std::next(it);
  }
  ExchangeQuotas(pools, allocated);
  if (idle) return;
  // The state, copied out of the lock.
  std::vector<Json> gated, placed;
  std::vector<dra::NodeView> nodes;
  std::vector<Tracked> pods;
  uint64_t freed = 0;
  {
    MutexLock lock(&mu_);
    freed = freed_;
    ++counters_.rounds;
    for (const auto& [name, view] : nodes_) nodes.push_back(view);
    for (const auto& [key, t] : pods_) pods.push_back(t);
    for (const auto& [key, pod] : gated_) gated.push_back(pod);
    for (const auto& [key, pod] : placed_) placed.push_back(pod);
  }
  std::set<std::string> gated_uids;  // counted by the allocator when it places them
  for (const Json& pod : gated) gated_uids.insert(Str(Field(pod, "metadata"), "uid"));
  // Oldest first (then by name): the order the pods arrived in, repeatable for one seed.
  std::sort(gated.begin(), gated.end(), [](const Json& a, const Json& b) {
    const std::string ta = Str(Field(a, "metadata"), "creationTimestamp"),
                      tb = Str(Field(b, "metadata"), "creationTimestamp");
    if (ta != tb) return ta < tb;
    return std::pair(Str(Field(a, "metadata"), "namespace"), Str(Field(a, "metadata"), "name")) <
           std::pair(Str(Field(b, "metadata"), "namespace"), Str(Field(b, "metadata"), "name"));
  });
  if (gated.size() > kMaxPodsPerRound) gated.resize(kMaxPodsPerRound);
  std::set<std::string> placed_live;
  for (const Json& pod : placed) placed_live.insert(Str(Field(pod, "metadata"), "uid"));
  if (placed.size() > kMaxPodsPerRound) placed.resize(kMaxPodsPerRound);

  // The CPU and memory taken on each node: by the pods bound there, and by those not bound yet whose claims
  // are allocated there (placed in an earlier round, by this controller or kube-scheduler: they will bind
  // there).
  std::vector<dra::PodOnNode> on_nodes;
  for (const Tracked& t : pods) {
    if (!gated_uids.contains(t.uid)) on_nodes.push_back({t.uid, t.node, t.host});
  }
  auto account = [&] {
    std::map<std::string, dra::HostRequest> requested = dra::RequestedByNode(on_nodes, allocated);
    for (dra::NodeView& v : nodes) {
      v.cpu_requested = requested[v.name].cpu_milli;
      v.memory_requested = requested[v.name].memory_bytes;
    }
  };
  account();
  // Claims written this round (deallocated), by UID: what the informer does not show yet.
  std::map<std::string, Json> fresh;
  // A pod's claims, in spec.resourceClaims order, as this controller last wrote them; nullopt while one is
  // not created (a template's claim is made by kube-controller-manager: wait for it).
  auto claims_of = [&](const Json& pod) -> std::optional<std::vector<Json>> {
    const std::string ns = Str(Field(pod, "metadata"), "namespace");
    const Json& statuses = Field(Field(pod, "status"), "resourceClaimStatuses");
    std::vector<Json> out;
    for (const Json& entry : Field(Field(pod, "spec"), "resourceClaims")) {
      std::string name = Str(entry, "resourceClaimName");
      if (name.empty() && statuses.is_array()) {
        for (const Json& s : statuses) {
          if (Str(s, "name") == Str(entry, "name")) name = Str(s, "resourceClaimName");
        }
      }
      std::shared_ptr<const Json> claim = name.empty() ? nullptr : claims_->Get(StrCat(ns, "/", name));
      if (!claim) return std::nullopt;
      Json c = *claim;
      const std::string uid = Str(Field(c, "metadata"), "uid");
      if (auto f = fresh.find(uid); f != fresh.end()) {
        c = f->second;
      } else if (auto w = written_.find(uid); w != written_.end()) {
        c = w->second.first;
      }
      out.push_back(std::move(c));
    }
    return out;
  };

  // Pods whose claims Tessera placed and that kube-scheduler has not bound: those it refuses are released
  // (dra_rebind.h) and, like those whose claims kube-scheduler's own PostFilter deallocated, placed again at
  // once, before kube-scheduler's next try when Tessera is first.
  std::vector<dra::PodInput> inputs;
  std::vector<bool> again;  // per input: placed before (no gate to lift)
  std::map<std::string, const dra::NodeView*> node_by_name;
  for (const dra::NodeView& n : nodes) node_by_name[n.name] = &n;
  size_t releases = 0;
  for (const Json& pod : placed) {
    const std::string uid = Str(Field(pod, "metadata"), "uid");
    std::optional<std::vector<Json>> claims = claims_of(pod);
    if (!claims) continue;
    dra::Releasable r = dra::FindReleasable(pod, *claims);
    bool place_again = false;
    if (r.ours) {
      dra::Refusal refusal = dra::ReadRefusal(pod);
      if (!refusal.refused) {
        refused_.erase(uid);
        continue;
      }
      auto& [signature, since] = refused_[uid];
      if (signature != r.signature) {
        signature = r.signature;
        since = now;
      }
      dra::RebindNode node;
      if (auto n = node_by_name.find(r.node); n == node_by_name.end()) {
        node.exists = false;
      } else {
        // The pod is counted on its allocation's node already (account()).
        const dra::NodeView& v = *n->second;
        node.fits = (v.cpu_milli <= 0 || v.cpu_requested <= v.cpu_milli) &&
                    (v.memory_bytes <= 0 || v.memory_requested <= v.memory_bytes);
      }
      dra::RebindDecision d = dra::DecideRebind(r, refusal, node, now - since, options_.rebind_after);
      if (d.kind != dra::RebindDecision::Kind::kRelease || releases >= kMaxReleasesPerRound) continue;
      ++releases;
      std::string reason = d.reason;
      if (!refusal.message.empty()) StrAppend(&reason, " (kube-scheduler: '", Quote(refusal.message), "')");
      if (!Release(pod, *claims, r.claims, r.node, reason, fresh)) continue;
      refused_.erase(uid);
      avoid_[uid].insert(r.node);
      waited_at_.erase(uid);
      claims = claims_of(pod);
      place_again = claims.has_value();
    } else {
      refused_.erase(uid);
      // Claims left deallocated (by kube-scheduler's PostFilter, or here when nothing else had room): placed
      // again once something was freed since the last try. A claim shared with another pod stays as it is.
      place_again = options_.rebind_after.count() > 0 &&
                    std::any_of(claims->begin(), claims->end(),
                                [](const Json& c) {
                                  return !Path(c, {"status", "allocation"}).is_object();
                                }) &&
                    std::none_of(claims->begin(), claims->end(), [](const Json& c) {
                      return !Path(c, {"metadata", "deletionTimestamp"}).is_null();
                    });
      if (auto w = waited_at_.find(uid); place_again && w != waited_at_.end() && w->second == freed)
        place_again = false;
    }
    if (!place_again) continue;
    dra::PodInput in;
    in.pod = pod;
    in.claims = *std::move(claims);
    if (auto a = avoid_.find(uid); a != avoid_.end()) in.avoid_nodes = a->second;
    inputs.push_back(std::move(in));
    again.push_back(true);
  }
  // The claims released this round hold nothing any more, nor do their pods on the nodes they left.
  if (!fresh.empty()) {
    std::erase_if(allocated, [&](const Json& c) { return fresh.contains(Str(Field(c, "metadata"), "uid")); });
    account();
  }

  for (const Json& pod : gated) {
    if (!OnlyOurGate(pod)) continue;
    // A pod that found no place is tried again once something was freed since.
    if (auto w = waited_at_.find(Str(Field(pod, "metadata"), "uid"));
        w != waited_at_.end() && w->second == freed)
      continue;
    std::optional<std::vector<Json>> claims = claims_of(pod);
    if (!claims) continue;
    inputs.push_back({.pod = pod, .claims = *std::move(claims), .avoid_nodes = {}});
    again.push_back(false);
  }
  if (inputs.empty()) return;
  allocator_.SetPools(std::move(pools));
  allocator_.SetClasses(std::move(classes));
  allocator_.SetNodes(std::move(nodes));
  allocator_.SetAllocatedClaims(allocated);
  std::vector<dra::PodDecision> decisions = allocator_.Place(inputs);
  // The device-plugin path counts this round's placements at once (a write refused is counted until the next
  // round: the safe side).
  if (options_.quotas) options_.quotas->SetHeldByDra(allocator_.QuotaHeld());

  for (size_t i = 0; i < inputs.size(); ++i) {
    const Json& pod = inputs[i].pod;
    const dra::PodDecision& d = decisions[i];
    const std::string pod_uid = Str(Field(pod, "metadata"), "uid");
    const std::string pod_name = Str(Field(pod, "metadata"), "name");
    if (d.kind == dra::PodDecision::Kind::kHandOver) {
      if (again[i]) continue;  // ungated already: kube-scheduler's allocator decides
      {
        MutexLock lock(&mu_);
        ++counters_.handed_over;
      }
      Lift(pod, formats::kDraFallback, d.reason);
      continue;
    }
    if (d.kind == dra::PodDecision::Kind::kWait) {
      {
        MutexLock lock(&mu_);
        ++counters_.waiting;
      }
      waited_at_[pod_uid] = freed;
      std::string& told = told_[pod_uid];
      if (told != d.reason) {
        told = d.reason;
        if (again[i]) {
          // Not gated: kube-scheduler tries it too, and its allocator places the claims wherever the pod
          // fits.
          Event(pod, "Normal", "TesseraPlacementWaiting",
                StrCat("no Tessera GPU for this pod's claims yet: ", d.reason,
                       "; kube-scheduler's allocator places them when a node can take the pod"));
          continue;
        }
        Event(pod, "Normal", "TesseraPlacementWaiting",
              StrCat("no Tessera GPU for this pod's claims yet: ", d.reason));
        Json patch = {{"metadata", {{"annotations", {{formats::kDraWaitingAnnotation, d.reason}}}}}};
        (void)api_.Patch(k8s::kPods, Str(Field(pod, "metadata"), "namespace"), pod_name,
                         k8s::PatchType::kMerge, patch);
      }
      continue;
    }
    // Placed: each claim allocated and reserved for the pod in one write, then the gate lifted.
    bool ok = true;
    for (size_t k = 0; k < inputs[i].claims.size() && ok; ++k) {
      const Json& claim = inputs[i].claims[k];
      if (!d.allocations[k] && ReservedFor(claim, pod_uid)) continue;
      const std::string ns = Str(Field(claim, "metadata"), "namespace");
      // First the finalizer (for an allocation) and the leader's term, then the status.
      absl::StatusOr<Json> st = ReadyToWrite(claim, /*finalizer=*/d.allocations[k].has_value());
      Json updated = st.ok() ? *st : claim;
      if (st.ok() && d.allocations[k]) {
        updated["status"]["allocation"] = *d.allocations[k];
        // As kube-scheduler stamps its allocations. Without it, kube-scheduler's PreBind of a pod not yet in
        // reservedFor adds the stamp to the stored allocation, which the API refuses ("field cannot be
        // modified once set"), on every retry (docs/dra.md).
        updated["status"]["allocation"]["allocationTimestamp"] = k8s::FormatTime(options_.clock->Now());
      }
      Json& reserved = updated["status"]["reservedFor"];
      if (!reserved.is_array()) reserved = Json::array();
      reserved.push_back({{"resource", "pods"}, {"name", pod_name}, {"uid", pod_uid}});
      if (st.ok()) st = api_.Update(k8s::kResourceClaims, ns, updated, "status");
      if (!st.ok()) {
        ok = false;
        MutexLock lock(&mu_);
        ++(k8s::IsConflict(st.status()) ? counters_.conflicts : counters_.write_errors);
        // Said once per distinct error (a missing grant would fail every round).
        if (!k8s::IsConflict(st.status()) && Message(st.status()) != last_write_error_) {
          last_write_error_ = Message(st.status());
          log::Warn("could not allocate a claim",
                    {{"claim", Str(Field(claim, "metadata"), "name")}, {"error", last_write_error_}});
        }
        break;
      }
      written_[Str(Field(claim, "metadata"), "uid")] = {*st, options_.clock->Steady()};
    }
    if (!ok) continue;  // decided again from fresh state; what was written is counted meanwhile
    told_.erase(pod_uid);
    waited_at_.erase(pod_uid);
    if (again[i]) {
      log::Info("placed DRA claims again", {{"pod", pod_name}, {"node", d.node}});
      MutexLock lock(&mu_);
      ++counters_.replaced;
      continue;
    }
    log::Info("placed DRA claims", {{"pod", pod_name}, {"node", d.node}});
    {
      MutexLock lock(&mu_);
      ++counters_.placed;
    }
    Lift(pod, formats::kDraPlaced, "");
  }
  if (told_.size() > 4 * kMaxPodsPerRound || waited_at_.size() > 4 * kMaxPodsPerRound ||
      refused_.size() > 4 * kMaxPodsPerRound || avoid_.size() > 4 * kMaxPodsPerRound) {
    // Forget the pods no longer gated or waiting to bind (bounded memory).
    std::set<std::string> live = placed_live;
    for (const Json& pod : gated) live.insert(Str(Field(pod, "metadata"), "uid"));
    std::erase_if(told_, [&](const auto& e) { return !live.contains(e.first); });
    std::erase_if(waited_at_, [&](const auto& e) { return !live.contains(e.first); });
    std::erase_if(refused_, [&](const auto& e) { return !live.contains(e.first); });
    std::erase_if(avoid_, [&](const auto& e) { return !live.contains(e.first); });
  }
}

}  // namespace tessera::scheduler
