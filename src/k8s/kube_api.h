// KubeApi: the Kubernetes API as the scheduler extender and the node agent use it. Objects are
// nlohmann::json; errors are absl::Status values (see api_status.h for the mapping of HTTP codes).
//
//   absl::StatusOr<ClientConfig> config = LoadDefaultConfig();
//   absl::StatusOr<std::unique_ptr<KubeApi>> api = NewKubeApi(*config);
//   absl::StatusOr<Json> pod = (*api)->Get(kPods, "default", "web-0");
//   absl::StatusOr<ObjectList> pods = (*api)->ListAll(kPods, "", {.field_selector = "spec.nodeName=gpu-1"});
//   (*api)->Patch(kPods, "default", "web-0", PatchType::kMerge,
//                 {{"metadata", {{"annotations", {{"tessera.dev/phase", "bound"}}}}}});
//   (*api)->Bind("default", "web-0", "gpu-1", {.pod_uid = Uid(*pod)});
//   (*api)->Watch(kPods, "", {.resource_version = pods->resource_version},
//                 [](WatchEvent&& e) { ... });            // blocks until the stream ends or stop is
//                 requested
//
// Namespaces: for a namespaced type, List and Watch take "" for all namespaces; Get, Patch, Delete need one;
// Create and Update take the namespace from the argument, else the object's metadata.namespace, else the
// configuration's default namespace. Cluster-scoped types ignore the namespace.
//
// Thread-safety: a KubeApi is safe to use from any number of threads at once; each call is one request (plus
// retries), and a Watch holds its own connection.
#ifndef TESSERA_K8S_KUBE_API_H_
#define TESSERA_K8S_KUBE_API_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "k8s/config.h"
#include "k8s/objects.h"

namespace tessera::k8s {

struct ListOptions {
  std::string label_selector;  // "app=web,tier!=db"
  std::string field_selector;  // "spec.nodeName=gpu-1"
  int64_t limit = 0;           // page size; 0: everything in one reply
  std::string continue_token;  // from the previous page
  // "": the most recent state (a quorum read); "0": any state the server has cached.
  std::string resource_version;
  // Cancels the request (the call then returns kCancelled).
  std::stop_token stop;
};

struct ObjectList {
  std::vector<Json> items;
  std::string resource_version;  // of the list: watch from here
  std::string continue_token;    // "" on the last page
  std::optional<int64_t> remaining_item_count;
};

enum class PatchType {
  kMerge,           // application/merge-patch+json (RFC 7386)
  kStrategicMerge,  // application/strategic-merge-patch+json (lists merged by key, as kubectl does)
  kJson,            // application/json-patch+json (RFC 6902: an array of operations)
};
std::string_view ContentType(PatchType type);

struct DeleteOptions {
  std::string precondition_uid;               // 409 when the object's uid differs
  std::string precondition_resource_version;  // 409 when the object changed
  std::optional<int64_t> grace_period_seconds;
  std::string propagation_policy;  // "Foreground", "Background", "Orphan"
};

struct WatchOptions {
  // Events after this version. "" or "0": first an ADDED event for every existing object, then changes.
  std::string resource_version;
  std::string label_selector;
  std::string field_selector;
  bool allow_bookmarks = true;
  // Asks the server to end the stream cleanly after this long (0: the server's default).
  int64_t timeout_seconds = 0;
  // Ends the watch promptly (Watch then returns kCancelled), even on an idle stream.
  std::stop_token stop;
};

struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark };
  Type type = Type::kAdded;
  Json object;  // for a bookmark, only kind, apiVersion and metadata.resourceVersion
};
std::string_view TypeName(WatchEvent::Type type);

using WatchHandler = std::function<void(WatchEvent&&)>;

struct BindOptions {
  std::string pod_uid;  // when set, 409 if the pod of that name is another pod
  // Copied onto the pod by the API server in the same write as spec.nodeName.
  std::map<std::string, std::string> annotations;
};

// A core/v1 Event. Empty times mean now.
struct EventSpec {
  ObjectReference involved_object;
  std::string type = "Normal";  // or "Warning"
  std::string reason;           // UpperCamelCase: FailedScheduling, Bound, ...
  std::string message;
  int32_t count = 1;
  std::string component = "tessera";  // source.component and reportingComponent
  std::string host;                   // source.host (the node, for the node agent)
  std::string reporting_instance;
};

class KubeApi {
 public:
  virtual ~KubeApi() = default;

  virtual absl::StatusOr<Json> Get(const ResourceType& type, std::string_view ns, std::string_view name) = 0;
  // One page (or everything when limit is 0).
  virtual absl::StatusOr<ObjectList> List(const ResourceType& type, std::string_view ns,
                                          const ListOptions& options = {}) = 0;
  virtual absl::StatusOr<Json> Create(const ResourceType& type, std::string_view ns, const Json& object) = 0;
  // PUT of the whole object (or of a subresource such as "status"). A metadata.resourceVersion in the object
  // makes it conditional: 409 Conflict (IsConflict) when the object changed since.
  virtual absl::StatusOr<Json> Update(const ResourceType& type, std::string_view ns, const Json& object,
                                      std::string_view subresource = "") = 0;
  virtual absl::StatusOr<Json> Patch(const ResourceType& type, std::string_view ns, std::string_view name,
                                     PatchType patch_type, const Json& patch,
                                     std::string_view subresource = "") = 0;
  virtual absl::Status Delete(const ResourceType& type, std::string_view ns, std::string_view name,
                              const DeleteOptions& options = {}) = 0;
  // POST to a subresource of an object (pods/NAME/binding, pods/NAME/eviction).
  virtual absl::StatusOr<Json> CreateSubresource(const ResourceType& type, std::string_view ns,
                                                 std::string_view name, std::string_view subresource,
                                                 const Json& body) = 0;
  // GET of any path of the server ("/version", "/readyz"): the body, parsed when it is JSON, else a string.
  virtual absl::StatusOr<Json> GetPath(std::string_view path) = 0;

  // Streams events to `handler` (called on the calling thread, in order) until the server ends the stream
  // (OK: watch again from the last resourceVersion seen), stop is requested (kCancelled), the stream breaks
  // (kUnavailable), the server sends an ERROR event or an error status (mapped: IsGone() for 410, list
  // again), or a line is not a watch event (kDataLoss).
  virtual absl::Status Watch(const ResourceType& type, std::string_view ns, const WatchOptions& options,
                             const WatchHandler& handler) = 0;

  virtual const ClientConfig& config() const = 0;

  // Every page, following continue tokens. When a continue token has expired (410), lists again in one piece,
  // as client-go does.
  absl::StatusOr<ObjectList> ListAll(const ResourceType& type, std::string_view ns, ListOptions options = {});

  // POST pods/NAME/binding with a v1 Binding to `node`: sets spec.nodeName (409 when already bound).
  absl::Status Bind(std::string_view ns, std::string_view pod, std::string_view node,
                    const BindOptions& options = {});

  // Creates a core/v1 Event about an object, in the object's namespace ("default" for cluster-scoped ones).
  absl::StatusOr<Json> CreateEvent(const EventSpec& event);
};

// The libcurl implementation of KubeApi. Fails when the configuration cannot work (no server, a TLS file
// libcurl cannot use...).
absl::StatusOr<std::unique_ptr<KubeApi>> NewKubeApi(const ClientConfig& config);

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_KUBE_API_H_
