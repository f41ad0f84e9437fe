// The object store's writes: create, get, update, patch, delete and pods/binding, with the API's rules
// (optimistic concurrency, finalizers, status subresources, pod spec immutability).
#include <ctime>
#include <mutex>
#include <random>

#include "core/strings.h"
#include "store.h"
#include "store_internal.h"

namespace tessera::fake {

namespace {

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

}  // namespace tessera::fake
