#include "store.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <random>
#include <set>

#include "absl/strings/escaping.h"
#include "core/strings.h"

namespace tessera::fake {

enum class EventType { kAdded, kModified, kDeleted };

struct HistoryEvent {
  uint64_t rv = 0;
  EventType type = EventType::kAdded;
  ObjectPtr object;  // the new state (for DELETED: the last state, at the deletion's resourceVersion)
  ObjectPtr old;     // the state before (MODIFIED only)
  mutable std::once_flag once;
  mutable std::string line;  // the serialized event, made once for all unfiltered watchers
};

struct Resource {
  ResourceInfo info;
  mutable std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, ObjectPtr> objects;                        // by "ns/name" or "name"
  std::unordered_map<std::string, std::set<std::string>> by_node;  // pods by spec.nodeName
  std::deque<std::shared_ptr<const HistoryEvent>> history;
  uint64_t floor = 0;  // events at or below this resourceVersion may be gone
};

namespace {

std::string_view TypeName(EventType t) {
  switch (t) {
    case EventType::kAdded:
      return "ADDED";
    case EventType::kModified:
      return "MODIFIED";
    case EventType::kDeleted:
      return "DELETED";
  }
  return "MODIFIED";
}

std::string Key(std::string_view ns, std::string_view name) {
  return ns.empty() ? std::string(name) : StrCat(ns, "/", name);
}

std::string Str(const Json& j, const char* field) {
  if (!j.is_object()) return "";
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::string Meta(const Json& obj, const char* field) {
  if (!obj.is_object()) return "";
  auto m = obj.find("metadata");
  return m == obj.end() ? std::string() : Str(*m, field);
}

std::string NodeOf(const Json& obj) {
  if (!obj.is_object()) return "";
  auto s = obj.find("spec");
  return s == obj.end() ? std::string() : Str(*s, "nodeName");
}

std::string Now() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

std::string NewUid() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  uint64_t a = rng(), b = rng();
  a = (a & 0xffffffffffff0fffULL) | 0x4000ULL;  // version 4
  b = (b & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%08x-%04x-%04x-%04x-%012llx", static_cast<unsigned>(a >> 32),
                static_cast<unsigned>((a >> 16) & 0xffff), static_cast<unsigned>(a & 0xffff),
                static_cast<unsigned>(b >> 48), static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return buf;
}

std::string RandomSuffix() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  static constexpr char kChars[] = "bcdfghjklmnpqrstvwxz2456789";
  std::string s;
  for (int i = 0; i < 5; ++i) s.push_back(kChars[rng() % (sizeof(kChars) - 1)]);
  return s;
}

// RFC 1123 subdomain: what most resources accept as a name.
bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > 253) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(n.front()) || !alnum(n.back())) return false;
  for (char c : n) {
    if (!alnum(c) && c != '-' && c != '.') return false;
  }
  return true;
}

std::string Quoted(std::string_view s) {
  return StrCat("\"", s, "\"");
}

Outcome NotFound(const ResourceInfo& info, std::string_view name) {
  return Outcome::Fail(404, "NotFound", StrCat(info.GroupResource(), " ", Quoted(name), " not found"));
}

Outcome ConflictModified(const ResourceInfo& info, std::string_view name) {
  return Outcome::Fail(
      409, "Conflict",
      StrCat("Operation cannot be fulfilled on ", info.GroupResource(), " ", Quoted(name),
             ": the object has been modified; please apply your changes to the latest version "
             "and try again"));
}

Outcome Invalid(const ResourceInfo& info, std::string_view name, std::string_view detail) {
  return Outcome::Fail(422, "Invalid", StrCat(info.kind, " ", Quoted(name), " is invalid: ", detail));
}

// For pods: the spec may change only in the fields the API allows to change after creation.
bool PodSpecChangeAllowed(const Json& old_spec, const Json& new_spec) {
  if (!old_spec.is_object() || !new_spec.is_object()) return old_spec == new_spec;
  Json a = old_spec, b = new_spec;
  for (const char* field :
       {"activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates"}) {
    a.erase(field);
    b.erase(field);
  }
  for (const char* list : {"containers", "initContainers"}) {
    for (Json* spec : {&a, &b}) {
      if (spec->contains(list) && (*spec)[list].is_array()) {
        for (Json& c : (*spec)[list]) {
          if (c.is_object()) c.erase("image");
        }
      }
    }
  }
  return a == b;
}

ObjectPtr WithResourceVersion(const ObjectPtr& obj, uint64_t rv) {
  Json copy = *obj;
  copy["metadata"]["resourceVersion"] = std::to_string(rv);
  return std::make_shared<const Json>(std::move(copy));
}

std::string EncodeContinue(uint64_t snapshot, size_t next, uint64_t rv) {
  std::string raw = StrCat("{\"v\":\"tessera.fake/v1\",\"snapshot\":", snapshot,
                           ",\"next\":", static_cast<int64_t>(next), ",\"rv\":", rv, "}");
  std::string out;
  absl::WebSafeBase64Escape(raw, &out);
  return out;
}

bool DecodeContinue(const std::string& token, uint64_t* snapshot, size_t* next) {
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return false;
  Json j = Json::parse(raw, nullptr, false);
  if (!j.is_object() || !j.contains("snapshot") || !j.contains("next")) return false;
  if (!j["snapshot"].is_number_unsigned() || !j["next"].is_number_unsigned()) return false;
  *snapshot = j["snapshot"].get<uint64_t>();
  *next = j["next"].get<size_t>();
  return true;
}

void Index(Resource& r, const std::string& key, const ObjectPtr& old, const ObjectPtr& cur) {
  if (r.info.resource != "pods" || !r.info.group.empty()) return;
  if (old) {
    auto it = r.by_node.find(NodeOf(*old));
    if (it != r.by_node.end()) {
      it->second.erase(key);
      if (it->second.empty()) r.by_node.erase(it);
    }
  }
  if (cur) r.by_node[NodeOf(*cur)].insert(key);
}

}  // namespace

std::vector<ResourceInfo> BuiltinResources() {
  return {
      {"", "v1", "nodes", "Node", false, true, {"spec.unschedulable"}},
      {"",
       "v1",
       "pods",
       "Pod",
       true,
       true,
       {"spec.nodeName", "status.phase", "spec.schedulerName", "spec.serviceAccountName", "status.podIP",
        "status.nominatedNodeName", "spec.restartPolicy"}},
      {"",
       "v1",
       "events",
       "Event",
       true,
       false,
       {"involvedObject.kind", "involvedObject.namespace", "involvedObject.name", "involvedObject.uid",
        "involvedObject.apiVersion", "involvedObject.resourceVersion", "involvedObject.fieldPath", "reason",
        "reportingComponent", "source", "type"}},
      {"", "v1", "namespaces", "Namespace", false, true, {"status.phase"}},
      {"", "v1", "configmaps", "ConfigMap", true, false, {}},
      {"coordination.k8s.io", "v1", "leases", "Lease", true, false, {}},
      // Dynamic Resource Allocation (resource.k8s.io/v1; field selectors as kube-apiserver v1.37 registers them).
      {"resource.k8s.io", "v1", "resourceslices", "ResourceSlice", false, false, {"spec.nodeName", "spec.driver"}},
      {"resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", true, true, {}},
  };
}

Outcome Outcome::Fail(int code, std::string reason, std::string message) {
  Outcome o;
  o.code = code;
  o.reason = std::move(reason);
  o.message = std::move(message);
  return o;
}

ObjectStore::ObjectStore(StoreOptions options) : options_(options) {
  for (const ResourceInfo& info : BuiltinResources()) Register(info);
}

ObjectStore::~ObjectStore() = default;

void ObjectStore::Register(const ResourceInfo& info) {
  std::lock_guard<std::mutex> lock(registry_mu_);
  std::string key = StrCat(info.group, "/", info.version, "/", info.resource);
  if (resources_.count(key) != 0) return;
  auto r = std::make_unique<Resource>();
  r->info = info;
  resources_.emplace(key, std::move(r));
}

Resource* ObjectStore::Find(std::string_view group, std::string_view version,
                            std::string_view resource) const {
  std::lock_guard<std::mutex> lock(registry_mu_);
  auto it = resources_.find(StrCat(group, "/", version, "/", resource));
  return it == resources_.end() ? nullptr : it->second.get();
}

std::vector<ResourceInfo> ObjectStore::Resources() const {
  std::lock_guard<std::mutex> lock(registry_mu_);
  std::vector<ResourceInfo> out;
  for (const auto& [k, r] : resources_) out.push_back(r->info);
  std::sort(out.begin(), out.end(), [](const ResourceInfo& a, const ResourceInfo& b) {
    return std::tie(a.group, a.version, a.resource) < std::tie(b.group, b.version, b.resource);
  });
  return out;
}

const ResourceInfo& ObjectStore::Info(const Resource& r) {
  return r.info;
}

size_t ObjectStore::size(const Resource& r) const {
  std::lock_guard<std::mutex> lock(r.mu);
  return r.objects.size();
}

absl::Status ObjectStore::CheckFields(const Resource& r, const FieldSelector& f) const {
  for (const std::string& field : f.Fields()) {
    bool ok = field == "metadata.name" || (field == "metadata.namespace" && r.info.namespaced);
    for (const std::string& l : r.info.field_labels) ok = ok || l == field;
    if (!ok) {
      return absl::InvalidArgumentError(
          StrCat("field label not supported: ", field, " (", r.info.GroupResource(), " support metadata.name",
                 r.info.namespaced ? ", metadata.namespace" : "", r.info.field_labels.empty() ? "" : ", ",
                 StrJoin(r.info.field_labels, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

// Appends a change to the resource's watch history (dropping the oldest past history_limit, which is what
// makes an old resourceVersion "gone") and wakes its watches. Called with r.mu held.
void ObjectStore::Publish(Resource& r, std::shared_ptr<HistoryEvent> ev) {
  r.history.push_back(std::move(ev));
  while (r.history.size() > options_.history_limit) {
    r.floor = r.history.front()->rv;
    r.history.pop_front();
  }
  r.cv.notify_all();
}

void ObjectStore::NotifyAll() {
  std::lock_guard<std::mutex> lock(registry_mu_);
  for (auto& [k, r] : resources_) {
    std::lock_guard<std::mutex> rl(r->mu);
    r->cv.notify_all();
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Writes

Outcome ObjectStore::Create(Resource& r, std::string_view ns, Json object) {
  const ResourceInfo& info = r.info;
  if (!object.is_object()) return Outcome::Fail(400, "BadRequest", "the body is not a JSON object");
  std::string api_version = Str(object, "apiVersion");
  std::string kind = Str(object, "kind");
  if (!api_version.empty() && api_version != info.ApiVersion()) {
    return Outcome::Fail(400, "BadRequest",
                         StrCat("the API version in the data (", api_version,
                                ") does not match the expected API version (", info.ApiVersion(), ")"));
  }
  if (!kind.empty() && kind != info.kind) {
    return Outcome::Fail(
        400, "BadRequest",
        StrCat("the kind in the data (", kind, ") does not match the expected kind (", info.kind, ")"));
  }
  object["apiVersion"] = info.ApiVersion();
  object["kind"] = info.kind;
  if (!object.contains("metadata") || !object["metadata"].is_object()) object["metadata"] = Json::object();
  Json& meta = object["metadata"];
  std::string body_ns = Str(meta, "namespace");
  if (info.namespaced) {
    if (ns.empty()) ns = body_ns;
    if (ns.empty()) {
      return Outcome::Fail(400, "BadRequest",
                           StrCat(info.GroupResource(), " are namespaced: POST to a namespace"));
    }
    if (!body_ns.empty() && body_ns != ns) {
      return Outcome::Fail(
          400, "BadRequest",
          "the namespace of the provided object does not match the namespace sent on the request");
    }
    meta["namespace"] = std::string(ns);
  } else {
    meta.erase("namespace");
    ns = "";
  }
  std::string name = Str(meta, "name");
  if (name.empty()) {
    std::string generate = Str(meta, "generateName");
    if (generate.empty()) {
      return Invalid(info, "", "metadata.name: Required value: name or generateName is required");
    }
    name = generate + RandomSuffix();
    meta["name"] = name;
  }
  if (!ValidName(name)) {
    return Invalid(
        info, name,
        StrCat("metadata.name: Invalid value: ", Quoted(name),
               ": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' "
               "or '.', and must start and end with an alphanumeric character"));
  }
  meta["uid"] = NewUid();
  meta["creationTimestamp"] = Now();
  meta.erase("deletionTimestamp");
  meta.erase("deletionGracePeriodSeconds");
  meta.erase("managedFields");
  if (object.contains("spec")) meta["generation"] = 1;
  if (info.resource == "pods" && info.group.empty()) {
    // The API server resets a new pod's status.
    object["status"] = Json{{"phase", "Pending"}};
  }
  std::string key = Key(ns, name);
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.objects.count(key) != 0) {
    return Outcome::Fail(409, "AlreadyExists",
                         StrCat(info.GroupResource(), " ", Quoted(name), " already exists"));
  }
  uint64_t rv = ++rv_;
  meta["resourceVersion"] = std::to_string(rv);
  auto obj = std::make_shared<const Json>(std::move(object));
  r.objects.emplace(key, obj);
  Index(r, key, nullptr, obj);
  auto ev = std::make_shared<HistoryEvent>();
  ev->rv = rv;
  ev->type = EventType::kAdded;
  ev->object = obj;
  Publish(r, std::move(ev));
  Outcome o;
  o.code = 201;
  o.object = obj;
  return o;
}

Outcome ObjectStore::Get(Resource& r, std::string_view ns, std::string_view name) const {
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.objects.find(Key(r.info.namespaced ? ns : "", name));
  if (it == r.objects.end()) return NotFound(r.info, name);
  Outcome o;
  o.object = it->second;
  return o;
}

// Under r.mu. `updated` is the full new object as the client wants it (before the API's rules).
Outcome ObjectStore::CommitUpdate(Resource& r, const std::string& key, const ObjectPtr& old, Json updated,
                                  std::string_view subresource) {
  const ResourceInfo& info = r.info;
  const Json& prev = *old;
  std::string name = Meta(prev, "name");
  if (!updated.is_object()) return Outcome::Fail(400, "BadRequest", "the object is not a JSON object");
  if (!updated.contains("metadata") || !updated["metadata"].is_object()) updated["metadata"] = Json::object();
  Json& meta = updated["metadata"];
  // Optimistic concurrency: a resourceVersion in the new object must be the current one.
  std::string want_rv = Str(meta, "resourceVersion");
  if (!want_rv.empty() && want_rv != Meta(prev, "resourceVersion")) return ConflictModified(info, name);
  std::string want_uid = Str(meta, "uid");
  if (!want_uid.empty() && want_uid != Meta(prev, "uid")) {
    return Outcome::Fail(409, "Conflict",
                         StrCat("Precondition failed: UID in precondition: ", want_uid,
                                ", UID in object meta: ", Meta(prev, "uid")));
  }
  std::string new_name = Str(meta, "name");
  if (!new_name.empty() && new_name != name) {
    return Outcome::Fail(
        400, "BadRequest",
        StrCat("the name of the object (", new_name, ") does not match the name on the URL (", name, ")"));
  }
  std::string new_ns = Str(meta, "namespace");
  if (info.namespaced && !new_ns.empty() && new_ns != Meta(prev, "namespace")) {
    return Outcome::Fail(
        400, "BadRequest",
        "the namespace of the provided object does not match the namespace sent on the request");
  }
  updated["apiVersion"] = info.ApiVersion();
  updated["kind"] = info.kind;
  if (subresource == "status") {
    // Only the status changes.
    Json next = prev;
    if (updated.contains("status")) {
      next["status"] = updated["status"];
    } else {
      next.erase("status");
    }
    updated = std::move(next);
  } else {
    if (info.has_status) {
      if (prev.contains("status")) {
        updated["status"] = prev["status"];
      } else {
        updated.erase("status");
      }
    }
    if (info.resource == "pods" && info.group.empty() &&
        !PodSpecChangeAllowed(prev.value("spec", Json()), updated.value("spec", Json()))) {
      return Invalid(
          info, name,
          "spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`, "
          "`spec.initContainers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only "
          "additions to existing tolerations), `spec.terminationGracePeriodSeconds` (allow it to be set "
          "to 1 if it was previously negative); bind a pod with pods/binding, not by setting "
          "spec.nodeName");
    }
  }
  Json& m = updated["metadata"];
  const Json& pm = prev["metadata"];
  for (const char* kept : {"name", "namespace", "uid", "creationTimestamp", "deletionTimestamp",
                           "deletionGracePeriodSeconds", "generation"}) {
    if (pm.contains(kept)) {
      m[kept] = pm[kept];
    } else {
      m.erase(kept);
    }
  }
  if (subresource != "status" && prev.contains("spec") && updated.value("spec", Json()) != prev["spec"]) {
    m["generation"] = pm.value("generation", int64_t{0}) + 1;
  }
  uint64_t rv = ++rv_;
  m["resourceVersion"] = std::to_string(rv);
  // A deleted object waiting for its finalizers goes when the last one is removed.
  bool finalized = m.contains("deletionTimestamp") &&
                   (!m.contains("finalizers") || !m["finalizers"].is_array() || m["finalizers"].empty());
  auto obj = std::make_shared<const Json>(std::move(updated));
  auto ev = std::make_shared<HistoryEvent>();
  ev->rv = rv;
  ev->object = obj;
  if (finalized) {
    r.objects.erase(key);
    Index(r, key, old, nullptr);
    ev->type = EventType::kDeleted;
  } else {
    r.objects[key] = obj;
    Index(r, key, old, obj);
    ev->type = EventType::kModified;
    ev->old = old;
  }
  Publish(r, std::move(ev));
  Outcome o;
  o.object = obj;
  return o;
}

Outcome ObjectStore::Update(Resource& r, std::string_view ns, std::string_view name, Json object,
                            std::string_view subresource) {
  if (!subresource.empty() && subresource != "status") {
    return Outcome::Fail(404, "NotFound",
                         StrCat("the server could not find the requested resource (", subresource, ")"));
  }
  if (subresource == "status" && !r.info.has_status) {
    return Outcome::Fail(404, "NotFound", StrCat(r.info.GroupResource(), " have no status subresource"));
  }
  std::string key = Key(r.info.namespaced ? ns : "", name);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.objects.find(key);
  if (it == r.objects.end()) return NotFound(r.info, name);
  ObjectPtr old = it->second;
  return CommitUpdate(r, key, old, std::move(object), subresource);
}

Outcome ObjectStore::Patch(Resource& r, std::string_view ns, std::string_view name, PatchKind kind,
                           const Json& patch, std::string_view subresource) {
  if (!subresource.empty() && subresource != "status") {
    return Outcome::Fail(404, "NotFound",
                         StrCat("the server could not find the requested resource (", subresource, ")"));
  }
  if (subresource == "status" && !r.info.has_status) {
    return Outcome::Fail(404, "NotFound", StrCat(r.info.GroupResource(), " have no status subresource"));
  }
  std::string key = Key(r.info.namespaced ? ns : "", name);
  // The patch is applied outside the lock; the commit checks that the object did not change meanwhile.
  for (int attempt = 0;; ++attempt) {
    ObjectPtr cur;
    {
      std::lock_guard<std::mutex> lock(r.mu);
      auto it = r.objects.find(key);
      if (it == r.objects.end()) return NotFound(r.info, name);
      cur = it->second;
    }
    absl::StatusOr<Json> patched = ApplyPatch(*cur, kind, patch);
    if (!patched.ok()) {
      if (patched.status().code() == absl::StatusCode::kInvalidArgument) {
        return Outcome::Fail(400, "BadRequest", std::string(patched.status().message()));
      }
      return Invalid(r.info, name, std::string(patched.status().message()));
    }
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.objects.find(key);
    if (it == r.objects.end()) return NotFound(r.info, name);
    if (it->second != cur) continue;  // changed while patching: patch the new state
    return CommitUpdate(r, key, cur, std::move(*patched), subresource);
  }
}

Outcome ObjectStore::Delete(Resource& r, std::string_view ns, std::string_view name, const Json& options) {
  std::string key = Key(r.info.namespaced ? ns : "", name);
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.objects.find(key);
  if (it == r.objects.end()) return NotFound(r.info, name);
  ObjectPtr old = it->second;
  if (options.is_object() && options.contains("preconditions") && options["preconditions"].is_object()) {
    const Json& pre = options["preconditions"];
    std::string uid = Str(pre, "uid");
    std::string rv = Str(pre, "resourceVersion");
    if (!uid.empty() && uid != Meta(*old, "uid")) {
      return Outcome::Fail(409, "Conflict",
                           StrCat("Precondition failed: UID in precondition: ", uid,
                                  ", UID in object meta: ", Meta(*old, "uid")));
    }
    if (!rv.empty() && rv != Meta(*old, "resourceVersion")) {
      return Outcome::Fail(409, "Conflict",
                           StrCat("Precondition failed: ResourceVersion in precondition: ", rv,
                                  ", ResourceVersion in object meta: ", Meta(*old, "resourceVersion")));
    }
  }
  const Json& meta = (*old)["metadata"];
  if (meta.contains("finalizers") && meta["finalizers"].is_array() && !meta["finalizers"].empty()) {
    if (meta.contains("deletionTimestamp")) {
      Outcome o;
      o.object = old;
      return o;  // already being deleted
    }
    Json next = *old;
    next["metadata"]["deletionTimestamp"] = Now();
    next["metadata"]["deletionGracePeriodSeconds"] = 0;
    uint64_t rv = ++rv_;
    next["metadata"]["resourceVersion"] = std::to_string(rv);
    auto obj = std::make_shared<const Json>(std::move(next));
    it->second = obj;
    Index(r, key, old, obj);
    auto ev = std::make_shared<HistoryEvent>();
    ev->rv = rv;
    ev->type = EventType::kModified;
    ev->object = obj;
    ev->old = old;
    Publish(r, std::move(ev));
    Outcome o;
    o.object = obj;
    return o;
  }
  uint64_t rv = ++rv_;
  r.objects.erase(it);
  Index(r, key, old, nullptr);
  auto ev = std::make_shared<HistoryEvent>();
  ev->rv = rv;
  ev->type = EventType::kDeleted;
  ev->object = WithResourceVersion(old, rv);
  Publish(r, ev);
  Outcome o;
  o.object = ev->object;
  o.reason = "deleted";
  return o;
}

Outcome ObjectStore::Bind(Resource& pods, std::string_view ns, std::string_view name, const Json& binding) {
  if (!binding.is_object()) return Outcome::Fail(400, "BadRequest", "the Binding is not a JSON object");
  std::string kind = Str(binding, "kind");
  if (!kind.empty() && kind != "Binding") {
    return Outcome::Fail(400, "BadRequest", StrCat("expected a Binding, got kind ", kind));
  }
  const Json target = binding.value("target", Json());
  std::string node = Str(target, "name");
  if (node.empty()) {
    return Invalid(pods.info, name, "target.name: Required value: the Binding's target must name a node");
  }
  std::string target_kind = Str(target, "kind");
  if (!target_kind.empty() && target_kind != "Node") {
    return Invalid(pods.info, name,
                   StrCat("target.kind: Invalid value: ", Quoted(target_kind), ": must be Node"));
  }
  const Json meta = binding.value("metadata", Json::object());
  std::string bname = Str(meta, "name");
  if (!bname.empty() && bname != name) {
    return Outcome::Fail(
        400, "BadRequest",
        StrCat("the name of the Binding (", bname, ") does not match the pod's (", name, ")"));
  }
  std::string key = Key(ns, name);
  std::lock_guard<std::mutex> lock(pods.mu);
  auto it = pods.objects.find(key);
  if (it == pods.objects.end()) return NotFound(pods.info, name);
  ObjectPtr old = it->second;
  std::string uid = Str(meta, "uid");
  if (!uid.empty() && uid != Meta(*old, "uid")) {
    return Outcome::Fail(409, "Conflict",
                         StrCat("Operation cannot be fulfilled on pods/binding ", Quoted(name),
                                ": Precondition failed: UID in precondition: ", uid,
                                ", UID in object meta: ", Meta(*old, "uid")));
  }
  if (!Meta(*old, "deletionTimestamp").empty()) {
    return Outcome::Fail(409, "Conflict",
                         StrCat("Operation cannot be fulfilled on pods/binding ", Quoted(name), ": pod ",
                                name, " is being deleted, cannot be assigned to a host"));
  }
  std::string current = NodeOf(*old);
  if (!current.empty()) {
    return Outcome::Fail(409, "Conflict",
                         StrCat("Operation cannot be fulfilled on pods/binding ", Quoted(name), ": pod ",
                                name, " is already assigned to node ", Quoted(current)));
  }
  Json next = *old;
  next["spec"]["nodeName"] = node;
  if (meta.contains("annotations") && meta["annotations"].is_object()) {
    for (auto a = meta["annotations"].begin(); a != meta["annotations"].end(); ++a) {
      next["metadata"]["annotations"][a.key()] = a.value();
    }
  }
  Json& conditions = next["status"]["conditions"];
  if (!conditions.is_array()) conditions = Json::array();
  bool found = false;
  for (Json& c : conditions) {
    if (Str(c, "type") == "PodScheduled") {
      c["status"] = "True";
      found = true;
    }
  }
  if (!found)
    conditions.push_back(Json{{"type", "PodScheduled"}, {"status", "True"}, {"lastTransitionTime", Now()}});
  uint64_t rv = ++rv_;
  next["metadata"]["resourceVersion"] = std::to_string(rv);
  auto obj = std::make_shared<const Json>(std::move(next));
  it->second = obj;
  Index(pods, key, old, obj);
  auto ev = std::make_shared<HistoryEvent>();
  ev->rv = rv;
  ev->type = EventType::kModified;
  ev->object = obj;
  ev->old = old;
  Publish(pods, std::move(ev));
  Outcome o;
  o.code = 201;
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// Reads

ListResult ObjectStore::List(Resource& r, std::string_view ns, const ListQuery& query) {
  ListResult result;
  if (query.limit < 0) {
    result.status = Outcome::Fail(400, "BadRequest", "limit must not be negative");
    return result;
  }
  if (!query.continue_token.empty()) {
    uint64_t id = 0;
    size_t next = 0;
    if (!DecodeContinue(query.continue_token, &id, &next)) {
      result.status =
          Outcome::Fail(400, "BadRequest", "continue key is not valid: not a token this server issued");
      return result;
    }
    std::shared_ptr<const Snapshot> snap;
    {
      std::lock_guard<std::mutex> lock(snap_mu_);
      auto it = snapshots_.find(id);
      if (it != snapshots_.end() &&
          std::chrono::steady_clock::now() - it->second->created < options_.continue_ttl) {
        snap = it->second;
      }
    }
    if (!snap) {
      result.status = Outcome::Fail(410, "Expired",
                                    "The provided continue parameter is too old to display a consistent list "
                                    "result. You can start a new list "
                                    "without the continue parameter.");
      return result;
    }
    size_t limit = query.limit > 0 ? static_cast<size_t>(query.limit) : snap->items.size();
    size_t end = std::min(snap->items.size(), next + limit);
    for (size_t i = std::min(next, end); i < end; ++i) result.items.push_back(snap->items[i]);
    result.resource_version = snap->rv;
    if (end < snap->items.size()) {
      result.continue_token = EncodeContinue(id, end, snap->rv);
      result.remaining = static_cast<int64_t>(snap->items.size() - end);
    }
    return result;
  }
  absl::StatusOr<LabelSelector> label = LabelSelector::Parse(query.label_selector);
  if (!label.ok()) {
    result.status = Outcome::Fail(400, "BadRequest", std::string(label.status().message()));
    return result;
  }
  absl::StatusOr<FieldSelector> field = FieldSelector::Parse(query.field_selector);
  if (field.ok()) {
    if (absl::Status s = CheckFields(r, *field); !s.ok()) field = s;
  }
  if (!field.ok()) {
    result.status = Outcome::Fail(400, "BadRequest", std::string(field.status().message()));
    return result;
  }
  std::string scope = r.info.namespaced && !ns.empty() ? StrCat(ns, "/") : "";
  auto wanted = [&](const std::string& key, const Json& obj) {
    if (!scope.empty() && !key.starts_with(scope)) return false;
    if (!label->empty()) {
      const Json* labels = nullptr;
      if (auto m = obj.find("metadata"); m != obj.end()) {
        if (auto l = m->find("labels"); l != m->end()) labels = &*l;
      }
      if (!label->Matches(labels ? *labels : Json())) return false;
    }
    return field->empty() || field->Matches(obj);
  };
  std::vector<ObjectPtr> items;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    result.resource_version = rv_.load();
    std::optional<std::string> node = field->EqualityValue("spec.nodeName");
    if (node && r.info.resource == "pods" && r.info.group.empty()) {
      auto it = r.by_node.find(*node);
      if (it != r.by_node.end()) {
        for (const std::string& key : it->second) {
          const ObjectPtr& obj = r.objects.at(key);
          if (wanted(key, *obj)) items.push_back(obj);
        }
      }
    } else {
      auto it = scope.empty() ? r.objects.begin() : r.objects.lower_bound(scope);
      for (; it != r.objects.end(); ++it) {
        if (!scope.empty() && !it->first.starts_with(scope)) break;
        if (wanted(it->first, *it->second)) items.push_back(it->second);
      }
    }
  }
  size_t limit = static_cast<size_t>(query.limit);
  if (limit == 0 || items.size() <= limit) {
    result.items = std::move(items);
    return result;
  }
  result.items.assign(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(limit));
  result.remaining = static_cast<int64_t>(items.size() - limit);
  auto snap = std::make_shared<Snapshot>();
  snap->items = std::move(items);
  snap->rv = result.resource_version;
  snap->created = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(snap_mu_);
  uint64_t id = next_snapshot_++;
  snapshots_.emplace(id, std::move(snap));
  // Keep the newest max_snapshots.
  while (snapshots_.size() > options_.max_snapshots) {
    uint64_t oldest = UINT64_MAX;
    for (const auto& [k, v] : snapshots_) oldest = std::min(oldest, k);
    snapshots_.erase(oldest);
  }
  result.continue_token = EncodeContinue(id, limit, result.resource_version);
  return result;
}

std::variant<Outcome, std::unique_ptr<WatchCursor>> ObjectStore::Watch(Resource& r, std::string_view ns,
                                                                       const WatchQuery& query) {
  std::unique_ptr<WatchCursor> w(new WatchCursor());
  absl::StatusOr<LabelSelector> label = LabelSelector::Parse(query.label_selector);
  if (!label.ok()) return Outcome::Fail(400, "BadRequest", std::string(label.status().message()));
  absl::StatusOr<FieldSelector> field = FieldSelector::Parse(query.field_selector);
  if (field.ok()) {
    if (absl::Status s = CheckFields(r, *field); !s.ok()) field = s;
  }
  if (!field.ok()) return Outcome::Fail(400, "BadRequest", std::string(field.status().message()));
  uint64_t from = 0;
  bool initial = query.resource_version.empty() || query.resource_version == "0";
  if (!initial) {
    int64_t v = 0;
    if (!ParseInt(query.resource_version, &v) || v < 0) {
      return Outcome::Fail(400, "BadRequest", StrCat("invalid resource version: ", query.resource_version));
    }
    from = static_cast<uint64_t>(v);
  }
  w->store_ = this;
  w->res_ = &r;
  w->ns_ = r.info.namespaced ? std::string(ns) : "";
  w->label_ = std::move(*label);
  w->field_ = std::move(*field);
  w->filtered_ = !w->ns_.empty() || !w->label_.empty() || !w->field_.empty();
  w->bookmarks_ = query.bookmarks;
  auto now = std::chrono::steady_clock::now();
  if (query.timeout.count() > 0) w->deadline_ = now + query.timeout;
  w->next_bookmark_ = now + options_.bookmark_interval;
  w->drop_epoch_ = drop_epoch_.load();
  w->expire_epoch_ = expire_epoch_.load();
  {
    std::lock_guard<std::mutex> lock(inject_mu_);
    w->inject_seq_ = inject_seq_;
  }
  std::lock_guard<std::mutex> lock(r.mu);
  if (initial) {
    w->cursor_ = rv_.load();
    for (const auto& [key, obj] : r.objects) {
      if (w->Wanted(*obj)) w->initial_.push_back(obj);
    }
  } else {
    if (from < r.floor) {
      return Outcome::Fail(410, "Expired",
                           StrCat("too old resource version: ", from, " (", r.floor + 1, ")"));
    }
    w->cursor_ = from;
  }
  ++open_watches_;
  return w;
}

// ---------------------------------------------------------------------------------------------------------------
// Watches

WatchCursor::~WatchCursor() {
  if (store_ != nullptr) --store_->open_watches_;
}

bool WatchCursor::Wanted(const Json& object) const {
  if (!filtered_) return true;
  if (!ns_.empty() && Meta(object, "namespace") != ns_) return false;
  if (!label_.empty()) {
    const Json* labels = nullptr;
    if (auto m = object.find("metadata"); m != object.end()) {
      if (auto l = m->find("labels"); l != m->end()) labels = &*l;
    }
    if (!label_.Matches(labels ? *labels : Json())) return false;
  }
  return field_.empty() || field_.Matches(object);
}

namespace {

void AppendLine(std::string_view type, const Json& object, std::string* out) {
  StrAppend(out, "{\"type\":\"", type, "\",\"object\":", object.dump(), "}\n");
}

std::string StatusJson(int code, std::string_view reason, std::string_view message) {
  Json s = {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", Json::object()},
            {"status", "Failure"}, {"message", message}, {"reason", reason},
            {"code", code}};
  return s.dump();
}

}  // namespace

void WatchCursor::AppendEvent(const HistoryEvent& e, std::string* out) const {
  if (!filtered_) {
    std::call_once(e.once, [&e] { AppendLine(TypeName(e.type), *e.object, &e.line); });
    out->append(e.line);
    return;
  }
  bool now_wanted = Wanted(*e.object);
  switch (e.type) {
    case EventType::kAdded:
      if (now_wanted) AppendLine("ADDED", *e.object, out);
      return;
    case EventType::kDeleted:
      if (now_wanted) AppendLine("DELETED", *e.object, out);
      return;
    case EventType::kModified: {
      bool was_wanted = e.old && Wanted(*e.old);
      if (now_wanted && was_wanted) {
        AppendLine("MODIFIED", *e.object, out);
      } else if (now_wanted) {
        AppendLine("ADDED", *e.object, out);
      } else if (was_wanted) {
        // Left the selection: the watcher sees it deleted, in its old state at the new resourceVersion.
        Json gone = *e.old;
        gone["metadata"]["resourceVersion"] = std::to_string(e.rv);
        AppendLine("DELETED", gone, out);
      }
      return;
    }
  }
}

WatchCursor::Step WatchCursor::Next(std::chrono::milliseconds max_wait, std::string* out) {
  using std::chrono::steady_clock;
  ObjectStore& store = *store_;
  Resource& r = *res_;
  if (initial_pos_ < initial_.size()) {
    size_t end = std::min(initial_.size(), initial_pos_ + 256);
    for (; initial_pos_ < end; ++initial_pos_) AppendLine("ADDED", *initial_[initial_pos_], out);
    if (initial_pos_ == initial_.size()) initial_.clear();
    return Step::kMore;
  }
  std::vector<std::shared_ptr<const HistoryEvent>> batch;
  uint64_t bookmark_rv = 0;
  {
    std::unique_lock<std::mutex> lock(r.mu);
    auto pending = [&] {
      return (!r.history.empty() && r.history.back()->rv > cursor_) || store.stopping_.load() ||
             store.drop_epoch_.load() != drop_epoch_ || store.expire_epoch_.load() != expire_epoch_ ||
             store.inject_seq_atomic() != inject_seq_ || cursor_ < r.floor;
    };
    auto now = steady_clock::now();
    auto until = std::min(deadline_, now + max_wait);
    if (bookmarks_) until = std::min(until, next_bookmark_);
    r.cv.wait_until(lock, until, pending);
    if (store.stopping_.load()) return Step::kEnd;
    if (store.drop_epoch_.load() != drop_epoch_) return Step::kAbort;
    if (store.expire_epoch_.load() != expire_epoch_) {
      StrAppend(out, "{\"type\":\"ERROR\",\"object\":",
                StatusJson(410, "Expired", "too old resource version: the watch was expired by the test"),
                "}\n");
      return Step::kEnd;
    }
    if (store.inject_seq_atomic() != inject_seq_) {
      lock.unlock();
      std::lock_guard<std::mutex> il(store.inject_mu_);
      inject_seq_ = store.inject_seq_;
      out->append(store.inject_data_);
      return store.inject_drop_ ? Step::kAbort : Step::kMore;
    }
    if (cursor_ < r.floor) {
      // This watcher fell behind the history that is kept.
      StrAppend(
          out, "{\"type\":\"ERROR\",\"object\":",
          StatusJson(410, "Expired", StrCat("too old resource version: ", cursor_, " (", r.floor + 1, ")")),
          "}\n");
      return Step::kEnd;
    }
    auto first = std::upper_bound(
        r.history.begin(), r.history.end(), cursor_,
        [](uint64_t rv, const std::shared_ptr<const HistoryEvent>& e) { return rv < e->rv; });
    for (auto it = first; it != r.history.end() && batch.size() < 512; ++it) batch.push_back(*it);
    if (!batch.empty()) {
      cursor_ = batch.back()->rv;
    } else if (bookmarks_ && steady_clock::now() >= next_bookmark_) {
      // Every event of this resource up to the current resourceVersion has been sent.
      bookmark_rv = store.rv_.load();
      cursor_ = std::max(cursor_, bookmark_rv);
      next_bookmark_ = steady_clock::now() + store.options_.bookmark_interval;
    }
  }
  for (const auto& e : batch) AppendEvent(*e, out);
  if (bookmark_rv != 0) {
    StrAppend(out, "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"", r.info.kind, "\",\"apiVersion\":\"",
              r.info.ApiVersion(), "\",\"metadata\":{\"resourceVersion\":\"", bookmark_rv, "\"}}}\n");
  }
  if (batch.empty() && bookmark_rv == 0 && steady_clock::now() >= deadline_) return Step::kEnd;
  return Step::kMore;
}

// ---------------------------------------------------------------------------------------------------------------
// Faults

void ObjectStore::DropWatches() {
  ++drop_epoch_;
  NotifyAll();
}

void ObjectStore::ExpireWatches() {
  ++expire_epoch_;
  NotifyAll();
}

void ObjectStore::CompactHistory() {
  {
    std::lock_guard<std::mutex> lock(registry_mu_);
    for (auto& [k, r] : resources_) {
      std::lock_guard<std::mutex> rl(r->mu);
      // Watchers that had not seen every event will get 410; those that had go on.
      if (!r->history.empty()) r->floor = std::max(r->floor, r->history.back()->rv);
      r->history.clear();
    }
  }
  {
    std::lock_guard<std::mutex> lock(snap_mu_);
    snapshots_.clear();
  }
  NotifyAll();
}

void ObjectStore::InjectWatchData(std::string data, bool then_drop) {
  {
    std::lock_guard<std::mutex> lock(inject_mu_);
    ++inject_seq_;
    inject_data_ = std::move(data);
    inject_drop_ = then_drop;
    inject_seq_published_.store(inject_seq_);
  }
  NotifyAll();
}

void ObjectStore::Shutdown() {
  stopping_ = true;
  NotifyAll();
}

}  // namespace tessera::fake
