// NodeApi over the Kubernetes API server (src/k8s): what tessera-node uses on a real node.
//
//   KubeNodeApi api(kube_api, "gpu-1");
//   NodeAgent agent(config, &api, ...);
//
// ListNodePods lists the API's pods of the node (fieldSelector spec.nodeName=NODE) at each call: the agent
// keeps its own copy and lists again on its reconcile pass and when an Allocate finds no pod, and that second
// look must see a pod bound a moment ago (a watch-fed cache may not have it yet). Patches are JSON merge
// patches of metadata.annotations; events are core/v1 Events on the pod (or the node), from component
// tessera-node.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_NODE_KUBE_NODE_API_H_
#define TESSERA_NODE_KUBE_NODE_API_H_

#include <string>

#include "k8s/kube_api.h"
#include "node/node_api.h"

namespace tessera::node {

class KubeNodeApi : public NodeApi {
 public:
  KubeNodeApi(k8s::KubeApi& api, std::string node_name) : api_(api), node_name_(std::move(node_name)) {}

  absl::StatusOr<std::vector<NodePod>> ListNodePods() override;
  absl::Status PatchPodAnnotations(const std::string& ns, const std::string& name,
                                   const AnnotationPatch& patch) override;
  absl::Status PatchNodeAnnotations(const AnnotationPatch& patch) override;
  absl::Status PostEvent(const NodeEvent& event) override;

 private:
  k8s::KubeApi& api_;
  const std::string node_name_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_KUBE_NODE_API_H_
