// NodeAgent: the reconcile pass (phases, changed assignments, the kubelet's pod-resources and swapped
// allocations, garbage collection). docs/node-agent.md, "Reconciliation" and "Swapped allocations".
#include <signal.h>

#include <algorithm>
#include <filesystem>

#include "common/files.h"
#include "common/log.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "node/agent.h"
#include "node/agent_internal.h"

namespace tessera::node {

namespace fs = std::filesystem;

namespace {

// A container directory without a record and without a pod is an orphan (a crash cut its allocation short)
// only when it is older than this; a younger one may belong to an Allocate in flight.
constexpr auto kOrphanAge = std::chrono::minutes(2);

// A container's region directory is writable from inside the container (its processes create the region
// there): removed without following links and within a bounded number of entries (common/files.h).
bool RemoveTenantDir(const std::string& dir, bool quiet) {
  absl::Status s = RemoveUntrustedTree(dir);
  if (!s.ok() && !quiet) {
    log::Warn("a gone container's region directory was not wholly removed", {{"error", Message(s)}});
  }
  return s.ok();
}

// Removes `dir` when it is empty (a pod's directory once its containers' are gone); one an Allocate fills
// again meanwhile stays (remove() of a non-empty directory fails), and its Allocate retries a removed one.
void RemoveIfEmpty(const fs::path& dir) {
  std::error_code ec;
  if (fs::is_empty(dir, ec)) fs::remove(dir, ec);
}

}  // namespace

// --- reconcile -------------------------------------------------------------------------------------------

absl::Status NodeAgent::ReconcileOnce() {
  MutexLock pass(&reconcile_mu_);
  uint64_t seen = 0;  // tenants allocated after this are not judged against the pod list below
  {
    MutexLock lock(&mu_);
    ++stats_.reconciles;
    seen = allocations_;
  }
  if (absl::Status s = RefreshPods(); !s.ok()) return s;
  std::shared_ptr<const std::vector<NodePod>> pods = Pods();
  ReconcilePodResources(*pods);
  ReportPhases(*pods);
  ApplyAssignmentChanges(*pods);
  std::set<std::string> kubelet_pods;
  bool pr_ok = pod_resources_ == nullptr;
  if (pod_resources_ != nullptr) {
    absl::StatusOr<std::vector<kubelet::PodResources>> list = pod_resources_->List();
    if (list.ok()) {
      pr_ok = true;
      for (const kubelet::PodResources& p : *list) kubelet_pods.insert(p.ns + "/" + p.name);
    }
  }
  Collect(*pods, pr_ok, kubelet_pods, seen);
  return absl::OkStatus();
}

void NodeAgent::ReportPhases(const std::vector<NodePod>& pods) {
  // Pods with records not yet reported: write the truth (the containers' assignment as applied) and
  // tessera.dev/phase: allocated once every GPU container of the pod is allocated. The truth is written for
  // the records the pod's text does not tell (Tenant::untold); a record allocated from the pod's own text
  // that reads otherwise now was rewritten by the scheduler since (a compression of a pod that had just
  // started), which ApplyAssignmentChanges follows. Written over, the compression was lost and the
  // high-priority pod it made room for refused.
  std::map<std::string, std::vector<ContainerRecord>> by_uid;
  std::set<std::string> untold;  // record keys whose pod's text is another part's
  {
    MutexLock lock(&mu_);
    for (const auto& [key, t] : tenants_) {
      if (t.record.is_claim()) continue;  // a claim has no phase to write
      by_uid[t.record.pod_uid].push_back(t.record);
      if (t.untold) untold.insert(key);
    }
  }
  for (const NodePod& pod : pods) {
    auto it = by_uid.find(pod.uid);
    if (it == by_uid.end()) continue;
    const std::vector<ContainerRecord>& recs = it->second;
    if (std::all_of(recs.begin(), recs.end(), [](const ContainerRecord& r) { return r.reported; })) continue;
    absl::StatusOr<formats::Assignment> a =
        formats::ParseAssignment(Annotation(pod, formats::kAnnotationAssignment));
    if (!a.ok()) continue;
    bool all = true;
    bool changed = false;
    for (core::ContainerAssignment& c : a->containers) {
      auto r = std::find_if(recs.begin(), recs.end(),
                            [&](const ContainerRecord& x) { return x.container == c.name; });
      if (r == recs.end()) {
        all = false;
        continue;
      }
      if (!SameLimits(c.vgpus, r->vgpus) && untold.contains(r->key())) {
        c.vgpus = r->vgpus;
        changed = true;
      }
    }
    AnnotationPatch patch;
    if (changed) {
      core::Placement p = formats::ToPlacement(*a);
      patch[formats::kAnnotationAssignment] = formats::FormatAssignment(p);
    }
    if (all) patch[formats::kAnnotationPhase] = std::string(formats::kPhaseAllocated);
    if (patch.empty()) continue;
    absl::Status s = api_->PatchPodAnnotations(pod.ns, pod.name, patch);
    if (!s.ok()) {
      MutexLock lock(&mu_);
      ++stats_.api_errors;
      log::Warn("cannot write the pod's phase; will retry", {{"pod", pod.key()}, {"error", Message(s)}});
      continue;
    }
    std::vector<FileOp> saves;
    {
      MutexLock lock(&mu_);
      // The text written holds for the pod's containers still to be allocated another part (their exchange,
      // even though it was built on the listed text, which may predate that exchange's own patch).
      if (changed) {
        for (auto& [key, ex] : exchanges_) {
          if (key.starts_with(pod.uid + "/")) ex.accepted.insert(*patch[formats::kAnnotationAssignment]);
        }
      }
      for (const ContainerRecord& r : recs) {
        auto t = tenants_.find(r.key());
        if (t == tenants_.end()) continue;
        if (changed) t->second.superseded = Annotation(pod, formats::kAnnotationAssignment);
        if (t->second.record == r) t->second.untold = false;  // the text written tells it now
        if (!all) continue;
        t->second.record.reported = true;
        saves.push_back({t->second.record, ""});
      }
    }
    RunFileOps(saves);
  }
}

void NodeAgent::ApplyAssignmentChanges(const std::vector<NodePod>& pods) {
  std::map<std::string, const NodePod*> by_uid;
  for (const NodePod& p : pods) by_uid[p.uid] = &p;
  std::vector<ContainerRecord> changed;  // the records as they become
  std::set<std::string> resized;         // of those, the ones whose shares changed (not only their tenants)
  std::vector<std::pair<NodeEvent, std::string>> events;
  // What OvercommitLocked counts (as at Allocate): the pods on the node and their assignments now, parsed
  // before the lock.
  std::set<std::string> live_uids;
  std::map<std::string, AssignedNow> assigned;
  for (const NodePod& p : pods) {
    if (p.terminated()) continue;
    live_uids.insert(p.uid);
    const std::string text = Annotation(p, formats::kAnnotationAssignment);
    if (text.empty()) continue;
    absl::StatusOr<formats::Assignment> a = ParseCached(p.uid, text);
    if (a.ok()) assigned.emplace(p.uid, AssignedNow{text, *std::move(a)});
  }
  {
    // Decide under the lock; write, post and tell after it.
    MutexLock lock(&mu_);
    for (auto& [key, t] : tenants_) {
      if (!t.record.reported) continue;   // our own write has not landed yet
      if (t.record.is_claim()) continue;  // its allocation is the claim's, which DRA does not change
      auto p = by_uid.find(t.record.pod_uid);
      if (p == by_uid.end()) continue;
      const std::string text = Annotation(*p->second, formats::kAnnotationAssignment);
      // The pod as it was before our report rewrote its assignment (the pods are listed before ReportPhases
      // writes): taken for the scheduler's rewrite, it resized the record to the shares of the part the pod
      // had before a swap, which the record then carried to the next pod of a chain of swaps
      // (tests/cluster/test_chaos.py: a GPU's annotations at 102.5%).
      if (!t.superseded.empty()) {
        if (text == t.superseded) continue;
        t.superseded.clear();
      }
      auto parsed = assigned.find(t.record.pod_uid);
      absl::StatusOr<formats::Assignment> a =
          parsed != assigned.end() ? absl::StatusOr<formats::Assignment>(parsed->second.assignment)
                                   : formats::ParseAssignment(text);
      if (!a.ok()) {
        if (reported_problems_.insert(StrCat(t.record.pod_uid, "|", text)).second) {
          events.push_back(
              {NodeEvent{p->second->ns, p->second->name, p->second->uid, "Warning", "MalformedAssignment",
                         StrCat("cannot read the rewritten tessera.dev/assignment: ", Message(a.status()),
                                "; the container keeps its current limits")},
               p->second->key()});
        }
        continue;
      }
      auto c =
          std::find_if(a->containers.begin(), a->containers.end(),
                       [&t = t](const core::ContainerAssignment& x) { return x.name == t.record.container; });
      if (c == a->containers.end() || SameLimits(c->vgpus, t.record.vgpus)) continue;
      if (!SameGpus(c->vgpus, t.record.vgpus)) {
        log::Warn("assignment names other GPUs than the running container has; ignored",
                  {{"pod", p->second->key()}, {"container", t.record.container}});
        continue;
      }
      // A rewrite is held to what the GPUs have, as an Allocate is: no memory, or more than a GPU has left,
      // and the container keeps its current limits.
      std::string refused = ZeroMemory(*c);
      const char* reason = "MalformedAssignment";
      if (refused.empty()) {
        refused = OvercommitLocked(key, c->vgpus, live_uids, assigned);
        reason = "OvercommittedAssignment";
      }
      if (!refused.empty()) {
        if (reported_problems_.insert(StrCat(t.record.pod_uid, "|", text)).second) {
          events.push_back({NodeEvent{p->second->ns, p->second->name, p->second->uid, "Warning", reason,
                                      StrCat(refused, "; the container keeps its current limits")},
                            p->second->key()});
        }
        continue;
      }
      ContainerRecord r = t.record;
      for (size_t i = 0; i < c->vgpus.size(); ++i) {
        r.vgpus[i].cores = c->vgpus[i].cores;
        r.vgpus[i].memory = c->vgpus[i].memory;
        r.vgpus[i].requested = c->vgpus[i].requested;
      }
      r.generation += 1;
      changed.push_back(std::move(r));
    }
    // Tenancy: a container arrived on a GPU or left it. The co-tenants' limits files say how many hold each
    // GPU (tenants=), which tells an elastic tenant alone that the idle compute is its own to take where it
    // cannot see other processes itself (OpenCL; CUDA without NVML). Only settled records (their annotation
    // written, pod-resources agreeing): one in the middle of a swap is told on a later pass.
    for (ContainerRecord& r : changed) {
      resized.insert(r.key());
      r.gpu_tenants = GpuTenantsLocked(r);  // the same GPUs as its record (SameGpus above)
    }
    for (const auto& [key, t] : tenants_) {
      if (resized.contains(key) || !t.record.reported || !t.record.confirmed) continue;
      std::vector<uint32_t> counts = GpuTenantsLocked(t.record);
      if (counts == t.record.gpu_tenants) continue;
      ContainerRecord r = t.record;
      r.gpu_tenants = std::move(counts);
      r.generation += 1;
      changed.push_back(std::move(r));
    }
  }
  for (const auto& [e, pod] : events) {
    if (!api_->PostEvent(e).ok()) {
      MutexLock lock(&mu_);
      ++stats_.api_errors;
    }
    log::Warn(e.message, {{"pod", pod}});
  }
  std::vector<std::pair<std::string, uint64_t>> reloads;
  for (const ContainerRecord& r : changed) {
    const bool shares = resized.contains(r.key());
    if (!shares) {
      // A change of tenants only: written from the record as it stands now, unless it changed since the
      // decision (an Allocate of the same container under way, a swap): the next pass decides again.
      MutexLock lock(&mu_);
      auto t = tenants_.find(r.key());
      if (t == tenants_.end() || claims_.contains(r.key())) continue;
      ContainerRecord now = t->second.record;
      now.gpu_tenants = r.gpu_tenants;
      now.generation = r.generation;
      if (now != r) continue;
    }
    if (absl::Status s = WriteLimits(r); !s.ok()) {
      log::Error("cannot rewrite a limits file", {{"tenant", r.key()}, {"error", Message(s)}});
      continue;
    }
    RunFileOps({{r, ""}});
    MutexLock lock(&mu_);
    auto t = tenants_.find(r.key());
    if (t == tenants_.end()) continue;  // collected meanwhile
    if (shares) {
      t->second.record = r;
    } else {
      t->second.record.gpu_tenants = r.gpu_tenants;
      t->second.record.generation = r.generation;
    }
    ++stats_.limit_updates;
    reloads.emplace_back(r.key(), r.generation);
    log::Info("limits changed", {{"tenant", r.key()}, {"generation", StrCat(r.generation)}});
  }
  // The processes read the new file and put the shares into their region themselves.
  for (const auto& [key, gen] : reloads) registration_->PushReload(key, gen);
}

void NodeAgent::ReconcilePodResources(const std::vector<NodePod>& pods) {
  if (pod_resources_ == nullptr) return;
  absl::StatusOr<std::vector<kubelet::PodResources>> list = pod_resources_->List();
  if (!list.ok()) {
    log::Debug("pod-resources unavailable", {{"error", Message(list.status())}});
    return;
  }
  std::map<std::string, const NodePod*> pod_of;  // ns/name -> pod
  for (const NodePod& p : pods) pod_of[p.key()] = &p;
  std::set<std::string> uids_here;  // the pods on this node now
  for (const NodePod& p : pods) uids_here.insert(p.uid);
  std::vector<NodeEvent> events;
  // The exchanges decided this pass, in order: record key, pod, its new tessera.dev/assignment. Written after
  // the pass, only those whose exchange still stands then (a later swap of the pass may void one).
  struct LedgerPatch {
    std::string key;
    const NodePod* pod;
    std::string text;
  };
  std::vector<LedgerPatch> ledger_patches;
  std::vector<FileOp> ops;  // done after the lock, in order
  MutexLock lock(&mu_);
  std::erase_if(exchanges_,
                [&](const auto& e) { return !uids_here.contains(e.first.substr(0, e.first.find('/'))); });
  held_.clear();
  for (const kubelet::PodResources& p : *list) {
    for (const kubelet::ContainerResources& c : p.containers) {
      if (!c.DeviceIds(config_.resource_name).empty()) held_.insert(StrCat(p.ns, "/", p.name, "/", c.name));
    }
  }
  for (const kubelet::PodResources& p : *list) {
    for (const kubelet::ContainerResources& c : p.containers) {
      std::vector<std::string> ids = c.DeviceIds(config_.resource_name);
      if (ids.empty()) continue;
      std::sort(ids.begin(), ids.end());
      // The record that handed out these devices. The kubelet hands a freed device to the next pod at once,
      // so a record of a pod that has just left may still name the same devices as the new pod's own record:
      // the record of this very container wins, and a record whose pod is no longer on the node is stale,
      // never a swap.
      Tenant* holder = nullptr;
      for (auto& [key, t] : tenants_) {
        std::vector<std::string> mine = t.record.device_ids;
        std::sort(mine.begin(), mine.end());
        if (mine != ids) continue;
        const ContainerRecord& r = t.record;
        if (r.ns == p.ns && r.pod_name == p.name && r.container == c.name) {
          holder = &t;
          break;
        }
        if (holder == nullptr && uids_here.contains(r.pod_uid)) holder = &t;
      }
      if (holder == nullptr) continue;
      ContainerRecord& r = holder->record;
      if (r.ns == p.ns && r.pod_name == p.name && r.container == c.name) {
        if (!r.confirmed) {
          r.confirmed = true;
          ops.push_back({r, ""});
        }
        continue;
      }
      // The kubelet started pod X's container with the allocation the agent had made for pod Y (an Allocate
      // call does not name its pod, and same-shaped pods are interchangeable to it). X and Y exchange their
      // parts of the ledger, so that every GPU keeps exactly the shares the scheduler committed on it: the
      // record moves to X (its mounts name that directory already) and X's annotation will say what X runs
      // with; Y takes what X had: X's own record if X was allocated one (it went to another container or is
      // still to start), else X's assignment, which Y's container is then allocated from.
      auto x_pod = pod_of.find(p.ns + "/" + p.name);
      if (x_pod == pod_of.end()) continue;
      const NodePod& x = *x_pod->second;
      const std::string x_key = x.uid + "/" + c.name;
      // X's container is being allocated this moment (an Allocate claimed X and has not recorded it yet): the
      // record that Allocate writes would replace the one moved to X here, and the container running with
      // that one would have no record (the fault harness, tests/cluster/chaos.py: a running tenant lost, its
      // directories left behind for good). The next pass finds both records and exchanges them.
      if (claims_.contains(x_key)) continue;
      auto other = tenants_.find(x_key);
      Tenant moved = std::move(*holder);
      const std::string old_key = moved.record.key();
      const std::string old_sig =
          Signature(moved.record.vgpus, moved.record.compute_policy, moved.record.priority);
      const ContainerRecord y = moved.record;  // Y's identity
      tenants_.erase(old_key);
      // Both records change names: their old files go first, then each is saved under its new name (removing
      // after saving would delete the record just written when the two swap names outright).
      ops.push_back({{}, records_.PathOf(y)});
      if (other != tenants_.end()) ops.push_back({{}, records_.PathOf(other->second.record)});
      std::string new_sig;
      if (other != tenants_.end()) {
        Tenant second = std::move(other->second);
        tenants_.erase(other);
        new_sig = Signature(second.record.vgpus, second.record.compute_policy, second.record.priority);
        second.record.pod_uid = y.pod_uid;
        second.record.ns = y.ns;
        second.record.pod_name = y.pod_name;
        second.record.container = y.container;
        second.record.reported = false;  // Y's annotation follows on the next report
        second.record.confirmed = false;
        second.untold = true;
        auto y_pod =
            std::find_if(pods.begin(), pods.end(), [&](const NodePod& q) { return q.uid == y.pod_uid; });
        second.superseded = y_pod != pods.end() ? Annotation(*y_pod, formats::kAnnotationAssignment) : "";
        ops.push_back({second.record, ""});
        exchanges_.erase(y.key());  // the record tells Y's annotation now
        tenants_[second.record.key()] = std::move(second);
      } else if (absl::StatusOr<std::pair<const NodePod*, std::string>> after =
                     ExchangeLedger(x, c.name, y, pods);
                 after.ok()) {
        // Y's share was never allocated: Y is allocated X's part when its container comes.
        ledger_patches.push_back({y.key(), after->first, after->second});
        new_sig = Signature(exchanges_[y.key()].vgpus, y.compute_policy, y.priority);
      } else {
        log::Warn("allocation swapped, and the other pod's part of the ledger cannot be read",
                  {{"from", old_key}, {"to", x_key}, {"error", Message(after.status())}});
      }
      if (!new_sig.empty() && new_sig != old_sig) {
        events.push_back({y.ns, y.pod_name, y.pod_uid, "Warning", "AllocationSwapped",
                          "the kubelet gave this pod's GPUs to a pod of a different shape and this pod takes "
                          "that pod's instead; delete the pod so that it is placed again"});
      }
      // X runs with Y's part now; what X was to take went to Y above. An exchange this pass gave X (X lost
      // its own record earlier in the list) is void with it, and its patch is not written: the record X runs
      // with tells X's annotation (ReportPhases). Written anyway, it named other GPUs than X runs on, for
      // good.
      exchanges_.erase(x_key);
      moved.record.pod_uid = x.uid;
      moved.record.ns = p.ns;
      moved.record.pod_name = p.name;
      moved.record.container = c.name;
      moved.record.reported = false;
      moved.record.confirmed = true;
      moved.untold = true;
      moved.superseded = Annotation(x, formats::kAnnotationAssignment);  // X's own part, not what it runs
      ops.push_back({moved.record, ""});
      log::Warn("allocation swapped between pods; records corrected",
                {{"from", old_key}, {"to", moved.record.key()}});
      tenants_[moved.record.key()] = std::move(moved);
      ++stats_.swaps;
    }
  }
  std::vector<LedgerPatch>
      standing;  // (a loop, not erase_if: the analysis does not see mu_ held in a lambda)
  for (LedgerPatch& patch : ledger_patches) {
    if (exchanges_.contains(patch.key)) standing.push_back(std::move(patch));
  }
  ledger_patches = std::move(standing);
  lock.Release();
  RunFileOps(ops);
  for (const NodeEvent& e : events) {
    if (!api_->PostEvent(e).ok()) {
      MutexLock relock(&mu_);
      ++stats_.api_errors;
    }
  }
  for (const LedgerPatch& patch : ledger_patches) {
    if (absl::Status st = api_->PatchPodAnnotations(patch.pod->ns, patch.pod->name,
                                                    {{formats::kAnnotationAssignment, patch.text}});
        !st.ok()) {
      {
        MutexLock relock(&mu_);
        ++stats_.api_errors;
      }
      log::Warn("cannot write an exchanged assignment; the next Allocate uses it anyway",
                {{"pod", patch.pod->key()}, {"error", Message(st)}});
    }
  }
}

absl::StatusOr<formats::Assignment> NodeAgent::LedgerOf(const NodePod& pod) const {
  const std::string text = Annotation(pod, formats::kAnnotationAssignment);
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(text);
  if (!a.ok()) return a.status();
  for (core::ContainerAssignment& c : a->containers) {
    auto ex = exchanges_.find(pod.uid + "/" + c.name);
    if (ex != exchanges_.end() && ex->second.accepted.contains(text)) c.vgpus = ex->second.vgpus;
  }
  return a;
}

absl::StatusOr<std::pair<const NodePod*, std::string>> NodeAgent::ExchangeLedger(
    const NodePod& x, const std::string& container, const ContainerRecord& y,
    const std::vector<NodePod>& pods) {
  absl::StatusOr<formats::Assignment> xa = LedgerOf(x);
  if (!xa.ok()) return xa.status();
  auto xc = std::find_if(xa->containers.begin(), xa->containers.end(),
                         [&](const core::ContainerAssignment& a) { return a.name == container; });
  if (xc == xa->containers.end())
    return absl::NotFoundError(StrCat("no container ", container, " in ", x.key()));
  auto y_pod = std::find_if(pods.begin(), pods.end(), [&](const NodePod& q) { return q.uid == y.pod_uid; });
  if (y_pod == pods.end()) return absl::NotFoundError(StrCat("pod ", y.ns, "/", y.pod_name, " is gone"));
  absl::StatusOr<formats::Assignment> ya = LedgerOf(*y_pod);
  if (!ya.ok()) return ya.status();
  auto yc = std::find_if(ya->containers.begin(), ya->containers.end(),
                         [&](const core::ContainerAssignment& a) { return a.name == y.container; });
  if (yc == ya->containers.end())
    return absl::NotFoundError(StrCat("no container ", y.container, " in ", y.ns, "/", y.pod_name));
  yc->vgpus = xc->vgpus;
  const std::string after = formats::FormatAssignment(formats::ToPlacement(*ya));
  // Y's annotation may read as it does now, as any exchange of Y's written before, or as this one: each of
  // them still holds (`after` is built on them).
  std::set<std::string> accepted = {Annotation(*y_pod, formats::kAnnotationAssignment), after};
  for (auto& [key, ex] : exchanges_) {
    if (!key.starts_with(y.pod_uid + "/")) continue;
    accepted.insert(ex.accepted.begin(), ex.accepted.end());
    ex.accepted.insert(after);
  }
  exchanges_[y.key()] = Exchange{std::move(accepted), xc->vgpus};
  return std::pair<const NodePod*, std::string>{&*y_pod, after};
}

bool NodeAgent::RemoveTenantFiles(const ContainerRecord& r, bool quiet) {
  std::error_code ec;
  fs::remove_all(r.dir, ec);  // the agent's own: read-only in the container
  bool removed = !ec;
  if (ec && !quiet) {
    log::Warn("cannot remove a gone container's directory; trying again at the next pass",
              {{"tenant", r.key()}, {"error", ec.message()}});
  }
  removed &= RemoveTenantDir(r.region_dir, quiet);
  if (absl::Status s = records_.Remove(records_.PathOf(r)); !s.ok()) {
    removed = false;
    if (!quiet) {
      log::Error("cannot remove a record; trying again at the next pass",
                 {{"tenant", r.key()}, {"error", Message(s)}});
      MutexLock lock(&mu_);
      ++stats_.record_errors;
    }
  }
  // The pod directories that held them, once empty: those of the record's directories, which are named after
  // another pod when the record came to this one in a swap (docs/node-agent.md, "Swapped allocations");
  // naming them after the record's own pod left the other's empty directories behind for good (the fault
  // harness, tests/cluster/chaos.py, found them after a run).
  for (const std::string& d : {r.dir, r.region_dir}) {
    const fs::path pod_dir = fs::path(d).parent_path();
    const fs::path top = pod_dir.parent_path();
    if (top == fs::path(config_.state_dir) / "containers" || top == fs::path(config_.state_dir) / "regions")
      RemoveIfEmpty(pod_dir);
  }
  for (const char* top : {"containers", "regions"})
    RemoveIfEmpty(fs::path(config_.state_dir) / top / r.pod_uid);
  return removed;
}

bool NodeAgent::RemoveOrKeep(const ContainerRecord& r) {
  if (RemoveTenantFiles(r)) return true;
  MutexLock lock(&mu_);
  unremoved_.push_back(r);
  return false;
}

void NodeAgent::Collect(const std::vector<NodePod>& pods, bool pod_resources_ok,
                        const std::set<std::string>& kubelet_pods, uint64_t seen) {
  std::map<std::string, const NodePod*> by_uid;
  for (const NodePod& p : pods) by_uid[p.uid] = &p;
  const std::map<int, std::string> live = registration_->All();
  std::vector<ContainerRecord> gone;
  std::set<std::string> known_dirs;
  // What earlier passes could not remove first: once it is, it is gone for good.
  std::vector<ContainerRecord> retry;
  std::set<std::string> refused;
  {
    MutexLock lock(&mu_);
    retry.swap(unremoved_);
    refused = refused_pods_;
  }
  for (const ContainerRecord& r : retry) {
    if (RemoveTenantFiles(r, /*quiet=*/true)) {
      log::Info("a gone container's files were removed at last", {{"tenant", r.key()}});
    } else {
      MutexLock lock(&mu_);
      unremoved_.push_back(r);
      known_dirs.insert(r.dir);
    }
  }
  {
    MutexLock lock(&mu_);
    for (auto it = tenants_.begin(); it != tenants_.end();) {
      const ContainerRecord& r = it->second.record;
      if (it->second.allocation > seen || r.is_claim()) {
        // A claim's tenant goes when the kubelet unprepares the claim (UnprepareClaim), not with a pod.
        // Allocated after this pass listed the pods: its pod may be missing from that list only because the
        // list is older. It used to be collected right after its Allocate (records, limits file and region
        // removed under a starting container).
        known_dirs.insert(r.dir);
        ++it;
        continue;
      }
      auto p = by_uid.find(r.pod_uid);
      const bool pod_running = p != by_uid.end() && !p->second->terminated();
      const bool pod_finished = p != by_uid.end() && p->second->terminated();
      // The kubelet's view wins over the API's when it has one: a pod force-deleted from the API may still
      // run.
      const bool kubelet_has = pod_resources_ok && pod_resources_ != nullptr &&
                               kubelet_pods.count(r.ns + "/" + r.pod_name) > 0 && !pod_finished;
      bool process_alive = false;
      for (const auto& [pid, tenant] : live) process_alive |= tenant == it->first && kill(pid, 0) == 0;
      if (pod_running || kubelet_has || process_alive) {
        known_dirs.insert(r.dir);
        ++it;
        continue;
      }
      gone.push_back(r);
      it = tenants_.erase(it);
      ++stats_.collected;
    }
    // Directories of claims in flight are not orphans.
    for (const std::string& key : claims_)
      known_dirs.insert((fs::path(config_.state_dir) / "containers" / key).string());
  }
  for (const ContainerRecord& r : gone) {
    if (RemoveOrKeep(r))
      log::Info("container gone; its directory and region were removed", {{"tenant", r.key()}});
  }
  // Orphan directories (a crash between creating a directory and writing its record). Only old ones: an
  // Allocate may have created a directory after this pass listed the pods and the claims (it used to be
  // removed under the allocation in flight, leaving the container without its limits file).
  // A pod whose Allocate failed after making its directories (an Allocate of it now is in claims_, whose
  // directories are known) leaves none behind for the orphans' age: the fault harness's read-only state
  // directory left one for two minutes, past the leak bound.
  std::error_code ec;
  const auto old_enough = [](const fs::path& p) {
    std::error_code e;
    const auto t = fs::last_write_time(p, e);
    return !e && fs::file_time_type::clock::now() - t > kOrphanAge;
  };
  for (const auto& pod_dir : fs::directory_iterator(fs::path(config_.state_dir) / "containers", ec)) {
    const bool failed = refused.contains(pod_dir.path().filename().string());
    const auto removable = [&](const fs::path& p) { return failed || old_enough(p); };
    std::error_code ec2;
    for (const auto& ctr : fs::directory_iterator(pod_dir.path(), ec2)) {
      if (known_dirs.count(ctr.path().string()) > 0) continue;
      if (fs::exists(records_.PathOf(pod_dir.path().filename().string(), ctr.path().filename().string()),
                     ec2))
        continue;
      if (by_uid.count(pod_dir.path().filename().string()) > 0) continue;  // its pod lives: leave it
      if (!removable(ctr.path())) continue;
      fs::remove_all(ctr.path(), ec2);
      const fs::path region_pod = fs::path(config_.state_dir) / "regions" / pod_dir.path().filename();
      RemoveTenantDir((region_pod / ctr.path().filename()).string(), /*quiet=*/false);
      RemoveIfEmpty(region_pod);
    }
    if (fs::is_empty(pod_dir.path(), ec2) && removable(pod_dir.path())) fs::remove(pod_dir.path(), ec2);
  }
  // A refused pod is forgotten once it and both its directories are gone.
  const fs::path state(config_.state_dir);
  MutexLock lock(&mu_);
  for (const std::string& uid : refused) {
    std::error_code e;
    if (!by_uid.contains(uid) && !fs::exists(state / "containers" / uid, e) &&
        !fs::exists(state / "regions" / uid, e))
      refused_pods_.erase(uid);
  }
}

}  // namespace tessera::node
