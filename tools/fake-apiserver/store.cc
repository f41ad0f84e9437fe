#include "store.h"

#include <algorithm>
#include <mutex>

#include "core/strings.h"
#include "store_internal.h"

namespace tessera::fake {

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

void ObjectStore::Shutdown() {
  stopping_ = true;
  NotifyAll();
}

}  // namespace tessera::fake
