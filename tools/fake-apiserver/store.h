// The object store of the fake Kubernetes API server: objects by group/version/resource, one global
// resourceVersion, a bounded history per resource for watches, and the API's write rules (create, update,
// patch, delete, pods/binding, optimistic concurrency, finalizers, status subresources, pod spec
// immutability).
//
//   ObjectStore store;                                   // knows nodes, pods, events, namespaces,
//   configmaps,
//                                                        // leases (BuiltinResources()); Register() adds more
//   Resource* pods = store.Find("", "v1", "pods");
//   Outcome created = store.Create(*pods, "default", pod_json);   // created.code 201, created.object
//   Outcome bound = store.Bind(*pods, "default", "web-0", binding_json);
//   ListResult page = store.List(*pods, "", {.field_selector = "spec.nodeName=gpu-1", .limit = 500});
//   auto watch = store.Watch(*pods, "", {.resource_version = "42", .bookmarks = true});
//   std::string data; watch->Next(std::chrono::milliseconds(100), &data);   // lines of watch events
//
// Objects are immutable once stored (shared_ptr<const Json>): readers never copy under a lock. Each resource
// has its own lock; resourceVersions come from one atomic counter, taken under the resource's lock, so every
// resource's history is in resourceVersion order.
//
// One file per job: store.cc (the resources), store_writes.cc (writes and their rules), store_list_watch.cc
// (lists and watches), store_faults.cc (fault injection); store_internal.h is what they share.
//
// Thread-safety: every method is safe from any thread. A WatchCursor is used by one thread at a time.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_STORE_H_
#define TESSERA_TOOLS_FAKE_APISERVER_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include "patch.h"
#include "selectors.h"

namespace tessera::fake {

using Json = nlohmann::json;
using ObjectPtr = std::shared_ptr<const Json>;

struct ResourceInfo {
  std::string group;  // "" for the core group
  std::string version;
  std::string resource;  // plural
  std::string kind;
  bool namespaced = true;
  // A status subresource: writes to the object keep its status; writes to /status change only the status.
  bool has_status = false;
  // Field selectors supported beyond metadata.name and metadata.namespace.
  std::vector<std::string> field_labels;

  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  std::string GroupResource() const { return group.empty() ? resource : resource + "." + group; }
};

// nodes, pods, events, namespaces, configmaps (core/v1) and leases (coordination.k8s.io/v1).
std::vector<ResourceInfo> BuiltinResources();

// The result of a request: a success code and the object, or a failure as the API reports it.
struct Outcome {
  int code = 200;
  std::string reason;  // for failures: NotFound, AlreadyExists, Conflict, Invalid, BadRequest, Expired...
  std::string message;
  ObjectPtr object;  // for successes (null when the reply is a Status, e.g. after a binding)

  bool ok() const { return code >= 200 && code < 300; }
  static Outcome Fail(int code, std::string reason, std::string message);
};

struct ListQuery {
  std::string label_selector;
  std::string field_selector;
  int64_t limit = 0;
  std::string continue_token;
};

struct ListResult {
  Outcome status;
  std::vector<ObjectPtr> items;
  uint64_t resource_version = 0;
  std::string continue_token;
  std::optional<int64_t> remaining;
};

struct WatchQuery {
  std::string resource_version;  // "" or "0": ADDED for every current object first
  std::string label_selector;
  std::string field_selector;
  bool bookmarks = false;
  std::chrono::seconds timeout{0};  // 0: until the client goes or the server stops
};

struct StoreOptions {
  size_t history_limit = 200000;  // watch events kept per resource
  std::chrono::milliseconds bookmark_interval{1000};
  std::chrono::seconds continue_ttl{300};
  size_t max_snapshots = 128;  // paginated lists in progress
};

class ObjectStore;
struct Resource;

// One open watch: yields the lines to send.
class WatchCursor {
 public:
  enum class Step {
    kMore,   // send what was appended (maybe nothing) and call again
    kEnd,    // send what was appended, then end the stream cleanly
    kAbort,  // send what was appended, then drop the connection without ending the stream
  };
  ~WatchCursor();
  Step Next(std::chrono::milliseconds max_wait, std::string* out);

 private:
  friend class ObjectStore;
  WatchCursor() = default;
  bool Wanted(const Json& object) const;
  void AppendEvent(const struct HistoryEvent& e, std::string* out) const;

  ObjectStore* store_ = nullptr;
  Resource* res_ = nullptr;
  std::string ns_;
  LabelSelector label_;
  FieldSelector field_;
  bool filtered_ = false;
  uint64_t cursor_ = 0;
  bool bookmarks_ = false;
  std::chrono::steady_clock::time_point deadline_ = std::chrono::steady_clock::time_point::max();
  std::chrono::steady_clock::time_point next_bookmark_;
  uint64_t drop_epoch_ = 0;
  uint64_t expire_epoch_ = 0;
  uint64_t inject_seq_ = 0;
  std::vector<ObjectPtr> initial_;
  size_t initial_pos_ = 0;
};

class ObjectStore {
 public:
  explicit ObjectStore(StoreOptions options = {});
  ~ObjectStore();

  ObjectStore(const ObjectStore&) = delete;
  ObjectStore& operator=(const ObjectStore&) = delete;

  // Adds a resource type (before requests for it arrive).
  void Register(const ResourceInfo& info);
  Resource* Find(std::string_view group, std::string_view version, std::string_view resource) const;
  std::vector<ResourceInfo> Resources() const;
  static const ResourceInfo& Info(const Resource& r);

  Outcome Create(Resource& r, std::string_view ns, Json object);
  Outcome Get(Resource& r, std::string_view ns, std::string_view name) const;
  Outcome Update(Resource& r, std::string_view ns, std::string_view name, Json object,
                 std::string_view subresource = "");
  Outcome Patch(Resource& r, std::string_view ns, std::string_view name, PatchKind kind, const Json& patch,
                std::string_view subresource = "");
  // `options`: a DeleteOptions object (preconditions.uid, preconditions.resourceVersion) or null.
  Outcome Delete(Resource& r, std::string_view ns, std::string_view name, const Json& options);
  // POST pods/NAME/binding: sets spec.nodeName, copies the Binding's annotations, marks PodScheduled.
  Outcome Bind(Resource& pods, std::string_view ns, std::string_view name, const Json& binding);
  ListResult List(Resource& r, std::string_view ns, const ListQuery& query);
  std::variant<Outcome, std::unique_ptr<WatchCursor>> Watch(Resource& r, std::string_view ns,
                                                            const WatchQuery& query);

  uint64_t resource_version() const { return rv_.load(); }
  int open_watches() const { return open_watches_.load(); }
  size_t size(const Resource& r) const;

  // Fault injection.
  // Closes every open watch abruptly (no end of stream), as a crashed server or a broken network would.
  void DropWatches();
  // Ends every open watch with an ERROR event carrying a 410 Expired Status.
  void ExpireWatches();
  // Forgets all history (and paginated lists in progress): a watch that has not seen every event so far (open
  // or opened later from an older resourceVersion) gets 410 Expired; continue tokens expire.
  void CompactHistory();
  // Writes `data` as it is into every open watch; then drops them when `then_drop`.
  void InjectWatchData(std::string data, bool then_drop);
  // Ends every watch (the server is stopping).
  void Shutdown();

 private:
  friend class WatchCursor;
  struct Snapshot {
    std::vector<ObjectPtr> items;
    uint64_t rv = 0;
    std::chrono::steady_clock::time_point created;
  };

  void NotifyAll();
  void Publish(Resource& r, std::shared_ptr<struct HistoryEvent> ev);
  Outcome CommitUpdate(Resource& r, const std::string& key, const ObjectPtr& old, Json updated,
                       std::string_view subresource);
  absl::Status CheckFields(const Resource& r, const FieldSelector& f) const;

  const StoreOptions options_;
  mutable std::mutex registry_mu_;
  std::unordered_map<std::string, std::unique_ptr<Resource>> resources_;  // guarded by registry_mu_

  std::atomic<uint64_t> rv_{100};
  std::atomic<int> open_watches_{0};
  std::atomic<uint64_t> drop_epoch_{0};
  std::atomic<uint64_t> expire_epoch_{0};
  std::atomic<bool> stopping_{false};

  std::mutex inject_mu_;
  uint64_t inject_seq_ = 0;   // guarded by inject_mu_
  std::string inject_data_;   // guarded by inject_mu_
  bool inject_drop_ = false;  // guarded by inject_mu_
  std::atomic<uint64_t> inject_seq_published_{0};
  uint64_t inject_seq_atomic() const { return inject_seq_published_.load(); }

  std::mutex snap_mu_;
  uint64_t next_snapshot_ = 1;                                               // guarded by snap_mu_
  std::unordered_map<uint64_t, std::shared_ptr<const Snapshot>> snapshots_;  // guarded by snap_mu_
};

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_STORE_H_
