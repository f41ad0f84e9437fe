// Extended resources turned into ResourceClaims (docs/dra.md, "Extended resources on DRA GPUs"): a pod that
// asks for GPUs with extended resources (tessera.dev/*, or another system's names, already translated by the
// webhook) gets, per GPU-using container, a ResourceClaimTemplate of the same meaning, so that the user
// changes nothing when the cluster's GPUs move to DRA. kube-controller-manager's resourceclaim controller
// then makes each pod's claim from the template, owned by the pod, and deletes it with the pod.
//
//   absl::StatusOr<Conversion> c = ConvertToClaims(request, patched_spec, offer, pod_claim_names);
//   for (const ClaimTemplate& t : c->templates) maker.Ensure(ns, t);   // AlreadyExists with the same spec:
//   fine
//   ... the webhook patches the pod: GPU resources out, resources.claims and spec.resourceClaims in.
//
// One template per shape, shared by every pod of that shape in the namespace, named from the shape
// (tessera-gpu-c30-m4096, tessera-gpu-elastic-c20-m2048, tessera-gpu-x2) and labelled
// app.kubernetes.io/managed-by: tessera-scheduler. A template of that name that lacks the label or whose spec
// differs is never used: the pod is refused with a message that says what to do.
//
// Thread-safety: ConvertToClaims and the parsers are pure; ClaimTemplateMaker is safe from any thread (each
// Ensure is its own API calls).
#ifndef TESSERA_SCHEDULER_DRA_CONVERSION_H_
#define TESSERA_SCHEDULER_DRA_CONVERSION_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/request.h"
#include "core/request_parser.h"
#include "k8s/kube_api.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

// tessera-scheduler --extended-resources-to-dra.
enum class ExtendedToDra {
  kAuto,    // when no node offers tessera.dev/gpu through the device plugin and Tessera's driver publishes
            // slices
  kAlways,  // every pod that asks with extended resources
  kNever,   // none (the device-plugin path only)
};
absl::StatusOr<ExtendedToDra> ParseExtendedToDra(std::string_view text);
const char* ToString(ExtendedToDra mode);

// What the conversion needs to know of the cluster: the DraController's slices and the nodes' allocatable.
struct DraOffer {
  bool device_plugin = false;  // some node offers tessera.dev/gpu (DraOfferTracker says when)
  bool driver = false;         // Tessera's driver publishes at least one device in a ResourceSlice
  // The memory capacities of Tessera's DRA devices, MiB: a share whose memory (or compute) is in proportion
  // to the GPU's is stated in a claim only when they are all one size.
  std::set<int64_t> memory_mib = {};
};
// The offer from the driver's ResourceSlices (spec.driver gpu.tessera.dev; others are ignored).
DraOffer OfferFromSlices(const std::vector<std::shared_ptr<const nlohmann::json>>& slices);
// Whether a Node object's status.allocatable has tessera.dev/gpu above 0 (the device plugin offers GPUs
// there).
bool NodeOffersDevicePlugin(const nlohmann::json& node);
// What a node's own tessera-node says of its device-plugin path: whether its tessera.dev/gpu-inventory names
// a GPU it did not give to DRA (formats::kDraHealthReason), and the tessera.dev/heartbeat it last wrote. The
// kubelet's allocatable falls to 0 for seconds whenever tessera-node or the kubelet restarts (the plugin
// registers again, the kubelet reports its devices again); this says the node serves the device plugin still.
struct DevicePluginIntent {
  bool gpus = false;
  std::optional<std::chrono::system_clock::time_point> heartbeat;
};
DevicePluginIntent NodeDevicePluginIntent(const nlohmann::json& node);
// Whether a pod converted under `mode` with this offer.
bool ShouldConvert(ExtendedToDra mode, const DraOffer& offer);

// The offer as tessera-scheduler follows it: the nodes that offer tessera.dev/gpu (its node informer calls
// OnNode/OnNodeDeleted) and the driver's slices (the DraController's informer, read through `slices`). The
// slices' part is computed again at most once a second (a pod admitted meanwhile sees the last one).
//
// A node offers the device plugin while its allocatable has tessera.dev/gpu, and also while its tessera-node
// says it serves device-plugin GPUs (DevicePluginIntent) with a heartbeat younger than `heartbeat_timeout`
// (the extender's own bound for a live agent, tessera-scheduler --heartbeat-timeout): a restart of
// tessera-node or the kubelet empties the allocatable for a few seconds, and `auto` must not turn every GPU
// pod admitted then into claims for the cluster's few DRA GPUs (the fault harness: a 2-GPU pod made a claim
// beside one DRA GPU, gated for good).
class DraOfferTracker {
 public:
  using Slices = std::function<std::vector<std::shared_ptr<const nlohmann::json>>()>;
  explicit DraOfferTracker(Slices slices, std::chrono::seconds heartbeat_timeout = std::chrono::seconds(60),
                           const Clock& clock = RealClock())
      : slices_(std::move(slices)), heartbeat_timeout_(heartbeat_timeout), clock_(clock) {}
  void OnNode(const nlohmann::json& node);
  void OnNodeDeleted(const nlohmann::json& node);
  DraOffer Offer() const;

 private:
  // A node whose tessera-node serves device-plugin GPUs: the inventory text it was read from (by its hash: a
  // heartbeat alone does not parse the inventory again) and the last heartbeat.
  struct Intent {
    size_t inventory_hash = 0;
    bool gpus = false;
    std::optional<std::chrono::system_clock::time_point> heartbeat;
  };
  const Slices slices_;
  const std::chrono::seconds heartbeat_timeout_;
  const Clock& clock_;
  mutable Mutex mu_;
  std::set<std::string> device_plugin_nodes_ ABSL_GUARDED_BY(mu_);  // allocatable above 0
  std::map<std::string, Intent> intents_ ABSL_GUARDED_BY(mu_);      // every node with an inventory
  mutable std::optional<std::pair<std::chrono::steady_clock::time_point, DraOffer>> from_slices_
      ABSL_GUARDED_BY(mu_);
};

inline constexpr char kTemplateManagedByLabel[] = "app.kubernetes.io/managed-by";
inline constexpr char kTemplateManagedBy[] = "tessera-scheduler";

struct ClaimTemplate {
  std::string name;
  nlohmann::json spec;  // the template's spec.spec (a ResourceClaimSpec)
};
// The whole object, in namespace `ns`, with the label.
nlohmann::json TemplateObject(const ClaimTemplate& t, std::string_view ns);

struct ContainerClaim {
  bool init = false;  // a sidecar under spec.initContainers
  size_t index = 0;   // in its list
  std::string container;
  std::string claim;  // the name in spec.resourceClaims and resources.claims
  std::string template_name;
};

struct Conversion {
  std::vector<ClaimTemplate> templates;  // distinct names
  std::vector<ContainerClaim> claims;    // one per GPU-using container
  std::vector<std::string> warnings;     // what the claim carries differently (for kubectl)
};

// The claims that state `request` (ParsePodRequest of `spec`, the pod as the webhook's translation leaves
// it). `offer.memory_mib` resolves shares whose memory or compute is in proportion; `pod_claims` are the
// names already in the pod's spec.resourceClaims. An error says what the user can change.
absl::StatusOr<Conversion> ConvertToClaims(const core::PodRequest& request, const core::PodSpec& spec,
                                           const DraOffer& offer, const std::set<std::string>& pod_claims);

// Makes a ClaimTemplate exist in a namespace through the API server: created, or found already there with the
// label and the same spec. Anything else is an error whose message says what to do.
class ClaimTemplateMaker {
 public:
  // `api` should have short timeouts (the webhook waits on it): tessera-scheduler gives it its own client.
  explicit ClaimTemplateMaker(k8s::KubeApi& api) : api_(api) {}
  absl::Status Ensure(std::string_view ns, const ClaimTemplate& t);

 private:
  k8s::KubeApi& api_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_DRA_CONVERSION_H_
