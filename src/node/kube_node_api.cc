#include "node/kube_node_api.h"

#include "common/log.h"
#include "core/strings.h"
#include "nlohmann/json.hpp"

namespace tessera::node {

namespace {

using nlohmann::json;

json AnnotationsPatch(const AnnotationPatch& patch) {
  json annotations = json::object();
  for (const auto& [key, value] : patch) annotations[key] = value ? json(*value) : json(nullptr);
  return {{"metadata", {{"annotations", annotations}}}};
}

}  // namespace

absl::StatusOr<std::vector<NodePod>> KubeNodeApi::ListNodePods() {
  k8s::ListOptions options;
  options.field_selector = StrCat("spec.nodeName=", node_name_);
  absl::StatusOr<k8s::ObjectList> list = api_.ListAll(k8s::kPods, "", options);
  if (!list.ok()) return list.status();
  std::vector<NodePod> out;
  out.reserve(list->items.size());
  for (const json& item : list->items) {
    absl::StatusOr<NodePod> pod = NodePodFromJson(item);
    if (!pod.ok()) {
      // One unreadable pod must not hide the others.
      log::Warn("skipping a pod the agent cannot read", {{"error", Message(pod.status())}});
      continue;
    }
    out.push_back(*std::move(pod));
  }
  return out;
}

absl::Status KubeNodeApi::PatchPodAnnotations(const std::string& ns, const std::string& name,
                                              const AnnotationPatch& patch) {
  return api_.Patch(k8s::kPods, ns, name, k8s::PatchType::kMerge, AnnotationsPatch(patch)).status();
}

absl::Status KubeNodeApi::PatchNodeAnnotations(const AnnotationPatch& patch) {
  return api_.Patch(k8s::kNodes, "", node_name_, k8s::PatchType::kMerge, AnnotationsPatch(patch)).status();
}

absl::Status KubeNodeApi::PostEvent(const NodeEvent& event) {
  k8s::EventSpec e;
  if (event.pod_name.empty()) {
    e.involved_object = {"Node", "v1", "", node_name_, "", ""};
  } else {
    e.involved_object = {"Pod", "v1", event.ns, event.pod_name, event.pod_uid, ""};
  }
  e.type = event.type;
  e.reason = event.reason;
  e.message = event.message;
  e.component = "tessera-node";
  e.host = node_name_;
  e.reporting_instance = StrCat("tessera-node-", node_name_);
  return api_.CreateEvent(e).status();
}

}  // namespace tessera::node
