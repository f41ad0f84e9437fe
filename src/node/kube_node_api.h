// NodeApi over the Kubernetes API server (src/k8s): what tessera-node uses on a real node.
//
//   absl::StatusOr<std::unique_ptr<KubeNodeApi>> api = KubeNodeApi::Start(kube_api, "gpu-1");
//   NodeAgent agent(config, api->get(), ...);
//
// The pods of the node come from an informer (list, then watch, fieldSelector spec.nodeName=NODE), so
// ListNodePods, called on every Allocate and reconcile pass, costs no request; until the informer has
// listed once it lists directly. Patches are JSON merge patches of metadata.annotations; events are core/v1
// Events on the pod (or the node), from component tessera-node.
//
// Thread-safety: thread-safe.
#ifndef TESSERA_NODE_KUBE_NODE_API_H_
#define TESSERA_NODE_KUBE_NODE_API_H_

#include <memory>
#include <string>

#include "k8s/informer.h"
#include "k8s/kube_api.h"
#include "node/node_api.h"

namespace tessera::node {

class KubeNodeApi : public NodeApi {
 public:
  // Starts the pod informer and waits up to `sync_timeout` for its first list (it keeps trying after that).
  static absl::StatusOr<std::unique_ptr<KubeNodeApi>> Start(k8s::KubeApi& api, std::string node_name,
                                                            std::chrono::milliseconds sync_timeout);
  ~KubeNodeApi() override;

  absl::StatusOr<std::vector<NodePod>> ListNodePods() override;
  absl::Status PatchPodAnnotations(const std::string& ns, const std::string& name,
                                   const AnnotationPatch& patch) override;
  absl::Status PatchNodeAnnotations(const AnnotationPatch& patch) override;
  absl::Status PostEvent(const NodeEvent& event) override;

 private:
  KubeNodeApi(k8s::KubeApi& api, std::string node_name);

  k8s::KubeApi& api_;
  const std::string node_name_;
  std::unique_ptr<k8s::Informer> pods_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_KUBE_NODE_API_H_
