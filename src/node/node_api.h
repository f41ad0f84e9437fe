// The node agent's narrow view of the Kubernetes API: the pods bound to its node with their annotations,
// patches of pod and node annotations, and events. tessera-node talks to the API server only through this
// interface, so that the agent's logic is tested against InMemoryNodeApi and runs standalone against
// FileNodeApi (--fake-api).
//
//   InMemoryNodeApi api("gpu-1");
//   api.UpsertPod(pod);                                        // tests: what the scheduler would have
//   written NodeAgent agent(config, &api, ...); absl::StatusOr<std::vector<NodePod>> pods =
//   api.ListNodePods(); api.PatchPodAnnotations("default", "a", {{"tessera.dev/phase", "allocated"}});
//
// A patch value of std::nullopt removes the annotation (JSON merge patch semantics).
//
// Thread-safety: implementations must be thread-safe; the agent calls them from the Allocate threads, the
// reconcile loop and the heartbeat at once.
#ifndef TESSERA_NODE_NODE_API_H_
#define TESSERA_NODE_NODE_API_H_

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "nlohmann/json_fwd.hpp"

namespace tessera::node {

// A pod bound to this node, as the agent needs it.
struct NodePod {
  std::string ns = "default";
  std::string name;
  std::string uid;
  std::map<std::string, std::string> annotations;
  std::string creation_timestamp;  // RFC 3339, as the API writes it
  std::string phase;               // status.phase
  bool deleting = false;           // metadata.deletionTimestamp set
  // Container name -> runtime container ID (status.containerStatuses[].containerID without "containerd://").
  std::map<std::string, std::string> container_ids;

  bool terminated() const { return phase == "Succeeded" || phase == "Failed"; }
  std::string key() const { return ns + "/" + name; }
  bool operator==(const NodePod&) const = default;
};

// A Kubernetes event about a pod (or the node, when pod_name is empty).
struct NodeEvent {
  std::string ns;
  std::string pod_name;
  std::string pod_uid;
  std::string type = "Normal";  // Normal or Warning
  std::string reason;           // CamelCase, e.g. "MalformedAssignment"
  std::string message;

  bool operator==(const NodeEvent&) const = default;
};

using AnnotationPatch = std::map<std::string, std::optional<std::string>>;

class NodeApi {
 public:
  virtual ~NodeApi() = default;
  // Every pod whose spec.nodeName is this node (any phase).
  virtual absl::StatusOr<std::vector<NodePod>> ListNodePods() = 0;
  // NotFound when the pod is gone.
  virtual absl::Status PatchPodAnnotations(const std::string& ns, const std::string& name,
                                           const AnnotationPatch& patch) = 0;
  virtual absl::Status PatchNodeAnnotations(const AnnotationPatch& patch) = 0;
  virtual absl::Status PostEvent(const NodeEvent& event) = 0;
};

// A v1.Pod JSON object -> NodePod. Errors name the field.
absl::StatusOr<NodePod> NodePodFromJson(const nlohmann::json& pod);

// In memory: tests, benchmarks. Failure injection: FailPatches(n) makes the next n pod patches fail. Slowness
// injection: SetCallDelay(d) makes every patch and event take `d` (an API server far away); HoldEvents(true)
// makes PostEvent wait until HoldEvents(false) (an API server that hangs); LagList(true) makes ListNodePods
// answer the pods as they were then until LagList(false) (a list that predates the agent's own patches, as a
// pass's own list does once the pass has written, for longer).
class InMemoryNodeApi : public NodeApi {
 public:
  explicit InMemoryNodeApi(std::string node_name) : node_name_(std::move(node_name)) {}

  absl::StatusOr<std::vector<NodePod>> ListNodePods() override;
  absl::Status PatchPodAnnotations(const std::string& ns, const std::string& name,
                                   const AnnotationPatch& patch) override;
  absl::Status PatchNodeAnnotations(const AnnotationPatch& patch) override;
  absl::Status PostEvent(const NodeEvent& event) override;

  void UpsertPod(NodePod pod);
  void DeletePod(const std::string& ns, const std::string& name);
  std::optional<NodePod> GetPod(const std::string& ns, const std::string& name) const;
  std::map<std::string, std::string> node_annotations() const;
  std::vector<NodeEvent> events() const;
  void FailPatches(int n);
  int list_calls() const;
  void SetCallDelay(std::chrono::milliseconds delay);
  void HoldEvents(bool hold);
  int events_waiting() const;  // PostEvent calls held right now
  void LagList(bool lag);

 private:
  const std::string node_name_;
  mutable Mutex mu_;
  std::map<std::string, NodePod> pods_ ABSL_GUARDED_BY(mu_);  // by ns/name
  std::optional<std::vector<NodePod>> listed_
      ABSL_GUARDED_BY(mu_);  // what ListNodePods answers while lagging
  std::map<std::string, std::string> node_annotations_ ABSL_GUARDED_BY(mu_);
  std::vector<NodeEvent> events_ ABSL_GUARDED_BY(mu_);
  int fail_patches_ ABSL_GUARDED_BY(mu_) = 0;
  int list_calls_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::milliseconds delay_ ABSL_GUARDED_BY(mu_){0};
  bool hold_events_ ABSL_GUARDED_BY(mu_) = false;
  int events_waiting_ ABSL_GUARDED_BY(mu_) = 0;
  CondVar held_cv_;  // signalled when hold_events_ changes
  void Delay() const;
};

// A JSON file standing in for the API server (standalone nodes, demos): {"pods": [v1.Pod...], "node":
// {"annotations": {...}}, "events": [...]}. Pods whose spec.nodeName is not this node are ignored. Every call
// reads the file; patches and events are written back atomically (temporary file + rename) under an flock on
// "<file>.lock", so another process (a test, `tessera` standalone scheduler tooling) may edit it between
// calls.
class FileNodeApi : public NodeApi {
 public:
  FileNodeApi(std::string path, std::string node_name);

  absl::StatusOr<std::vector<NodePod>> ListNodePods() override;
  absl::Status PatchPodAnnotations(const std::string& ns, const std::string& name,
                                   const AnnotationPatch& patch) override;
  absl::Status PatchNodeAnnotations(const AnnotationPatch& patch) override;
  absl::Status PostEvent(const NodeEvent& event) override;

 private:
  // Runs `edit` on the file's JSON under the lock; writes it back when `edit` returns true.
  absl::Status Update(const std::function<absl::StatusOr<bool>(nlohmann::json*)>& edit);

  const std::string path_;
  const std::string node_name_;
  Mutex mu_;  // one call at a time in this process (the flock orders processes)
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_NODE_API_H_
