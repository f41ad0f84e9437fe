#include "scheduler/api_sync.h"

#include "common/log.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "formats/pod_object.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

namespace {

using nlohmann::json;

std::string StringAt(const json& object, std::initializer_list<const char*> path) {
  const json* at = &object;
  for (const char* key : path) {
    if (!at->is_object()) return "";
    auto it = at->find(key);
    if (it == at->end()) return "";
    at = &*it;
  }
  return at->is_string() ? at->get<std::string>() : "";
}

const json* Annotations(const json& object) {
  auto metadata = object.find("metadata");
  if (metadata == object.end() || !metadata->is_object()) return nullptr;
  auto annotations = metadata->find("annotations");
  if (annotations == metadata->end() || !annotations->is_object()) return nullptr;
  return &*annotations;
}

std::string Annotation(const json& object, const char* key) {
  const json* a = Annotations(object);
  if (a == nullptr) return "";
  auto it = a->find(key);
  return it != a->end() && it->is_string() ? it->get<std::string>() : "";
}

}  // namespace

ApiSync::ApiSync(ClusterCache& cache, SyncOptions options) : cache_(cache), options_(options) {}

void ApiSync::Report(Problem problem) {
  // Called with mu_ held.
  const std::string key = StrCat(problem.kind, "/", problem.ns, "/", problem.name);
  if (auto it = reported_.find(key); it != reported_.end() && it->second == problem.message) return;
  reported_[key] = problem.message;
  log::Warn("sync problem", {{"object", key}, {"reason", problem.reason}, {"error", problem.message}});
  problems_.push_back(std::move(problem));
}

bool ApiSync::Schedulable(const NodeRecord& r, std::chrono::system_clock::time_point now) const {
  if (r.cordoned) return false;
  if (!r.has_heartbeat) return false;
  return now - r.heartbeat <= options_.heartbeat_timeout;
}

void ApiSync::OnNode(const json& node) {
  const std::string name = StringAt(node, {"metadata", "name"});
  if (name.empty()) return;
  const std::string uid = StringAt(node, {"metadata", "uid"});
  MutexLock lock(&mu_);
  ++counters_.nodes_seen;
  const std::string inventory_text = Annotation(node, formats::kGpuInventoryAnnotation);
  if (inventory_text.empty()) {
    if (nodes_.erase(name) > 0) cache_.RemoveNode(core::NodeName(name));
    return;
  }
  NodeRecord& r = nodes_[name];
  const bool known = !r.inventory.empty();
  bool cordoned = false;
  if (auto spec = node.find("spec"); spec != node.end() && spec->is_object()) {
    auto u = spec->find("unschedulable");
    cordoned = u != spec->end() && u->is_boolean() && u->get<bool>();
  }
  r.cordoned = cordoned;
  const std::string heartbeat = Annotation(node, formats::kHeartbeatAnnotation);
  if (!heartbeat.empty()) {
    absl::StatusOr<std::chrono::system_clock::time_point> t = formats::ParseHeartbeat(heartbeat);
    if (t.ok()) {
      r.has_heartbeat = true;
      r.heartbeat = *t;
    } else {
      Report({"Node", "", name, uid, "TesseraBadHeartbeat",
              StrCat(formats::kHeartbeatAnnotation, ": ", Message(t.status()),
                     "; tessera-node writes it, check that the agent on this node is a matching version")});
    }
  }
  const auto now = options_.clock->Now();
  r.stale = !Schedulable(r, now) && !r.cordoned;
  const bool schedulable = Schedulable(r, now);
  if (inventory_text != r.inventory) {
    absl::StatusOr<formats::GpuInventory> inventory = formats::ParseGpuInventory(inventory_text);
    if (!inventory.ok()) {
      ++counters_.bad_inventories;
      Report({"Node", "", name, uid, "TesseraBadInventory",
              StrCat(Message(inventory.status()),
                     known ? "; the scheduler keeps the node's last good inventory"
                           : "; the node gets no GPU pods until tessera-node publishes a readable one")});
      if (known)
        (void)cache_.SetSchedulable(core::NodeName(name), schedulable);
      else
        nodes_.erase(name);
      return;
    }
    core::NodeInfo info;
    info.name = core::NodeName(name);
    inventory->ApplyTo(&info);
    info.schedulable = schedulable;
    if (absl::Status st = cache_.UpsertNode(std::move(info)); !st.ok()) {
      ++counters_.bad_inventories;
      Report({"Node", "", name, uid, "TesseraBadInventory", Message(st)});
      if (!known) nodes_.erase(name);
      return;
    }
    r.inventory = inventory_text;
    return;
  }
  (void)cache_.SetSchedulable(core::NodeName(name), schedulable);
}

void ApiSync::OnNodeDeleted(const json& node) {
  const std::string name = StringAt(node, {"metadata", "name"});
  MutexLock lock(&mu_);
  if (nodes_.erase(name) > 0) cache_.RemoveNode(core::NodeName(name));
}

void ApiSync::CheckHeartbeats(std::chrono::system_clock::time_point now) {
  MutexLock lock(&mu_);
  int64_t stale = 0;
  for (auto& [name, r] : nodes_) {
    const bool schedulable = Schedulable(r, now);
    const bool is_stale = !schedulable && !r.cordoned;
    if (is_stale) ++stale;
    if (is_stale != r.stale) {
      r.stale = is_stale;
      if (is_stale) {
        log::Warn("node heartbeat is stale; no new GPU pods go there", {{"node", name}});
      } else {
        log::Info("node heartbeat is fresh again", {{"node", name}});
      }
    }
    (void)cache_.SetSchedulable(core::NodeName(name), schedulable);
  }
  counters_.stale_nodes = stale;
}

void ApiSync::OnPod(const json& pod) {
  absl::StatusOr<formats::PodObject> parsed = formats::ParsePodObject(pod);
  MutexLock lock(&mu_);
  ++counters_.pods_seen;
  if (!parsed.ok()) {
    // Not a pod we can read at all: if it held GPUs, it holds them no longer in our books.
    const std::string uid = StringAt(pod, {"metadata", "uid"});
    if (!uid.empty()) cache_.ForgetPod(core::PodUid(uid));
    return;
  }
  const bool ours = parsed->spec.annotations.contains(formats::kAnnotationAssignment);
  absl::Status st = cache_.ObservePod(*parsed);
  if (ours && log::Enabled(log::Level::kDebug)) {  // per pod event: the fields only when they are written
    log::Debug("pod observed", {{"pod", StrCat(parsed->spec.ns, "/", parsed->spec.name)},
                                {"uid", parsed->spec.uid},
                                {"node", parsed->node_name},
                                {"assignment", parsed->spec.annotations.at(formats::kAnnotationAssignment)},
                                {"result", st.ok() ? "ok" : Message(st)}});
  }
  if (!st.ok()) ReportBadAssignment(*parsed, st);
}

void ApiSync::ReportBadAssignment(const formats::PodObject& pod, const absl::Status& why) {
  if (!pod.spec.annotations.contains(formats::kAnnotationAssignment) || pod.node_name.empty()) return;
  ++counters_.bad_assignments;
  Report({"Pod", pod.spec.ns, pod.spec.name, pod.spec.uid, "TesseraBadAssignment",
          StrCat(Message(why), "; its GPUs are not counted by the scheduler: delete the pod to reschedule it")});
}

void ApiSync::ResyncPods(const std::function<std::vector<std::shared_ptr<const json>>()>& list) {
  MutexLock lock(&mu_);
  std::vector<formats::PodObject> parsed;
  for (const auto& pod : list()) {
    absl::StatusOr<formats::PodObject> p = formats::ParsePodObject(*pod);
    if (p.ok()) parsed.push_back(*std::move(p));  // one that cannot be read holds nothing (OnPod)
  }
  for (const auto& [i, st] : cache_.ReplacePods(parsed)) ReportBadAssignment(parsed[i], st);
}

void ApiSync::OnPodDeleted(const json& pod) {
  const std::string uid = StringAt(pod, {"metadata", "uid"});
  if (uid.empty()) return;
  MutexLock lock(&mu_);
  log::Debug(
      "pod deleted",
      {{"pod", StrCat(StringAt(pod, {"metadata", "namespace"}), "/", StringAt(pod, {"metadata", "name"}))},
       {"uid", uid}});
  cache_.ForgetPod(core::PodUid(uid));
  reported_.erase(
      StrCat("Pod/", StringAt(pod, {"metadata", "namespace"}), "/", StringAt(pod, {"metadata", "name"})));
}

std::vector<Problem> ApiSync::TakeProblems() {
  MutexLock lock(&mu_);
  std::vector<Problem> out;
  out.swap(problems_);
  return out;
}

SyncCounters ApiSync::counters() const {
  MutexLock lock(&mu_);
  return counters_;
}

}  // namespace tessera::scheduler
