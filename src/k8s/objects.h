// Kubernetes objects as nlohmann::json, the resource types the project uses, and small typed accessors.
//
// Objects stay JSON (the scheduler and the node agent read pods and nodes as JSON); these helpers read the
// few fields every caller needs without repeating the `contains`/`is_string` dance.
//
//   const ResourceType& type = kPods;                 // group "", version v1, resource pods, kind Pod
//   std::string key = ObjectKey(pod);                 // "default/web-0"; "gpu-node-1" for a node
//   std::string rv = ResourceVersion(pod);            // "" when absent
//   std::optional<std::string> a = Annotation(pod, "tessera.dev/assignment");
//   std::string ts = FormatTime(clock.Now(), TimeFormat::kMicro);   // "2024-01-01T00:00:00.000000Z"
//
// Thread-safety: values and pure functions.
#ifndef TESSERA_K8S_OBJECTS_H_
#define TESSERA_K8S_OBJECTS_H_

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::k8s {

using Json = nlohmann::json;

// A kind of object the API serves: /api/v1/... for the core group, /apis/GROUP/VERSION/... otherwise.
struct ResourceType {
  std::string group;     // "" for the core group
  std::string version;   // "v1"
  std::string resource;  // lower-case plural: "pods"
  std::string kind;      // "Pod"
  bool namespaced = true;

  // "v1" or "coordination.k8s.io/v1": the objects' apiVersion.
  std::string ApiVersion() const { return group.empty() ? version : group + "/" + version; }
  // "/api/v1" or "/apis/coordination.k8s.io/v1".
  std::string ApiPrefix() const {
    return group.empty() ? "/api/" + version : "/apis/" + group + "/" + version;
  }
  // "pods" or "leases.coordination.k8s.io", as the API names a resource in messages.
  std::string GroupResource() const { return group.empty() ? resource : resource + "." + group; }
};

inline const ResourceType kPods{"", "v1", "pods", "Pod", true};
inline const ResourceType kNodes{"", "v1", "nodes", "Node", false};
inline const ResourceType kNamespaces{"", "v1", "namespaces", "Namespace", false};
inline const ResourceType kEvents{"", "v1", "events", "Event", true};
inline const ResourceType kConfigMaps{"", "v1", "configmaps", "ConfigMap", true};
inline const ResourceType kLeases{"coordination.k8s.io", "v1", "leases", "Lease", true};
// Dynamic Resource Allocation (GA since Kubernetes 1.34).
inline const ResourceType kResourceClaims{"resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", true};
inline const ResourceType kResourceSlices{"resource.k8s.io", "v1", "resourceslices", "ResourceSlice", false};

// metadata.name, metadata.namespace, ... ("" when absent or not a string).
std::string Name(const Json& object);
std::string Namespace(const Json& object);
std::string Uid(const Json& object);
std::string ResourceVersion(const Json& object);
// "namespace/name", or "name" for an object without a namespace: the key informers use.
std::string ObjectKey(const Json& object);
std::string ObjectKey(std::string_view ns, std::string_view name);

std::optional<std::string> Annotation(const Json& object, std::string_view key);
std::optional<std::string> Label(const Json& object, std::string_view key);
// spec.nodeName of a pod ("" when unbound).
std::string NodeName(const Json& pod);

// A reference to an object, as events and owner references carry it.
struct ObjectReference {
  std::string kind;
  std::string api_version;
  std::string ns;
  std::string name;
  std::string uid;
  std::string resource_version;

  Json ToJson() const;
};
ObjectReference ReferenceTo(const Json& object, const ResourceType& type);

// Kubernetes timestamps: RFC 3339 in UTC, to the second (metav1.Time) or the microsecond (metav1.MicroTime).
enum class TimeFormat { kSeconds, kMicro };
std::string FormatTime(std::chrono::system_clock::time_point t, TimeFormat format = TimeFormat::kSeconds);
// Parses "2024-01-01T00:00:00Z", with optional fractional seconds and a numeric offset.
absl::StatusOr<std::chrono::system_clock::time_point> ParseTime(std::string_view text);

// Percent-encodes a path segment or query value (RFC 3986 unreserved characters stay).
std::string UrlEncode(std::string_view text);

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_OBJECTS_H_
