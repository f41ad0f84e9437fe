#include "scheduler/admission.h"

#include <map>
#include <optional>
#include <set>

#include "core/strings.h"
#include "formats/bounded_json.h"
#include "formats/dra_placement.h"
#include "formats/inventory.h"
#include "formats/pod_object.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

namespace {

using nlohmann::json;

std::string Base64(std::string_view in) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16 |
                       static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8 |
                       static_cast<unsigned char>(in[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[(v >> (6 * k)) & 63];
  }
  if (i < in.size()) {
    uint32_t v = static_cast<uint32_t>(static_cast<unsigned char>(in[i])) << 16;
    if (i + 1 < in.size()) v |= static_cast<uint32_t>(static_cast<unsigned char>(in[i + 1])) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < in.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

struct Review {
  std::string uid;
  std::string api_version = "admission.k8s.io/v1";
  const json* object = nullptr;  // the pod, when the review is about one
  std::string operation;
  std::string ns;        // request.namespace
  bool dry_run = false;  // request.dryRun: nothing may be created
  json doc;
};

absl::StatusOr<Review> ParseReview(std::string_view body) {
  Review r;
  // The tree in proportion to the body (formats::DomBudgetFor): a review of 30 MB of `{}` took 1 GB.
  absl::StatusOr<json> doc = formats::ParseBoundedJson(body, "the AdmissionReview", formats::kMaxJsonDepth,
                                                       formats::DomBudgetFor(body.size()));
  if (!doc.ok()) return doc.status();
  r.doc = *std::move(doc);
  if (!r.doc.is_object()) return absl::InvalidArgumentError("the body is not an AdmissionReview JSON object");
  if (auto v = r.doc.find("apiVersion"); v != r.doc.end() && v->is_string())
    r.api_version = v->get<std::string>();
  auto request = r.doc.find("request");
  if (request == r.doc.end() || !request->is_object()) {
    return absl::InvalidArgumentError("the AdmissionReview has no request");
  }
  auto uid = request->find("uid");
  if (uid == request->end() || !uid->is_string()) return absl::InvalidArgumentError("the request has no uid");
  r.uid = uid->get<std::string>();
  if (auto op = request->find("operation"); op != request->end() && op->is_string()) {
    r.operation = op->get<std::string>();
  }
  if (auto ns = request->find("namespace"); ns != request->end() && ns->is_string())
    r.ns = ns->get<std::string>();
  if (auto dry = request->find("dryRun"); dry != request->end() && dry->is_boolean())
    r.dry_run = dry->get<bool>();
  auto kind = request->find("kind");
  const bool pod = kind != request->end() && kind->is_object() && kind->value("kind", "") == "Pod" &&
                   kind->value("group", "") == "";
  if (auto object = request->find("object"); pod && object != request->end() && object->is_object()) {
    r.object = &*object;
  }
  return r;
}

Response Reply(const Review& review, json response) {
  response["uid"] = review.uid;
  json out = {
      {"apiVersion", review.api_version}, {"kind", "AdmissionReview"}, {"response", std::move(response)}};
  return {200, formats::DumpJson(out)};
}

Response Refuse(const Review& review, std::string message) {
  return Reply(review, {{"allowed", false},
                        {"status", {{"code", 422}, {"reason", "Invalid"}, {"message", std::move(message)}}}});
}

// A pod that does not parse (both webhooks' answer).
Response RefuseUnreadable(const Review& review, const absl::Status& status) {
  return Reply(review, {{"allowed", false},
                        {"status", {{"code", 400}, {"reason", "BadRequest"}, {"message", Message(status)}}}});
}

// A pod whose GPU request is impossible (both webhooks' answer): the parser's message says what to change.
Response RefuseInvalid(const Review& review, const formats::PodObject& pod, const absl::Status& status) {
  return Reply(review, {{"allowed", false},
                        {"status",
                         {{"code", 422},
                          {"reason", "Invalid"},
                          {"message", StrCat("tessera: pod ", pod.key(), ": ", Message(status))}}}});
}

// A key as one token of a JSON pointer (RFC 6901): "~" is "~0", "/" is "~1".
std::string JsonPointerToken(std::string_view key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out += c;
    }
  }
  return out;
}

// The pod of a review, its annotations and labels within Kubernetes' own size limit (checked before they are
// copied or their keys compared: CheckPodMetadataSize).
absl::StatusOr<formats::PodObject> ParsePod(const json& object) {
  if (absl::Status st = CheckPodMetadataSize(object); !st.ok()) return st;
  return formats::ParsePodObject(object);
}

// The DRA placement gate and its label (formats/dra_placement.h) added to `pod` by `patch`; the gated-at
// annotation is the caller's (it may be adding annotations of its own).
void AppendGate(const json& pod, json* patch) {
  const json gate = {{"name", formats::kDraPlacementGate}};
  const json& spec = pod.contains("spec") ? pod["spec"] : json();
  if (spec.is_object() && spec.contains("schedulingGates") && spec["schedulingGates"].is_array()) {
    patch->push_back({{"op", "add"}, {"path", "/spec/schedulingGates/-"}, {"value", gate}});
  } else {
    patch->push_back({{"op", "add"}, {"path", "/spec/schedulingGates"}, {"value", json::array({gate})}});
  }
  const json& metadata = pod.contains("metadata") ? pod["metadata"] : json();
  if (metadata.is_object() && metadata.contains("labels") && metadata["labels"].is_object()) {
    patch->push_back({{"op", "add"},
                      {"path", StrCat("/metadata/labels/", JsonPointerToken(formats::kDraPlacementLabel))},
                      {"value", formats::kDraGated}});
  } else {
    patch->push_back({{"op", "add"},
                      {"path", "/metadata/labels"},
                      {"value", {{formats::kDraPlacementLabel, formats::kDraGated}}}});
  }
}

Response Malformed(std::string_view what) {
  return {400, formats::DumpJson(json{{"error", StrCat("admission: ", what)}})};
}

}  // namespace

Response Admission::Mutate(std::string_view body) const {
  Decision decision = Decision::kAllowed;
  Response r = DoMutate(body, &decision);
  counts_[static_cast<size_t>(Verb::kMutate)][static_cast<size_t>(decision)].fetch_add(
      1, std::memory_order_relaxed);
  return r;
}

Response Admission::Validate(std::string_view body) const {
  Decision decision = Decision::kAllowed;
  Response r = DoValidate(body, &decision);
  counts_[static_cast<size_t>(Verb::kValidate)][static_cast<size_t>(decision)].fetch_add(
      1, std::memory_order_relaxed);
  return r;
}

Response Admission::DoMutate(std::string_view body, Decision* decision) const {
  absl::StatusOr<Review> review = ParseReview(body);
  if (!review.ok()) {
    *decision = Decision::kError;
    return Malformed(Message(review.status()));
  }
  if (review->object == nullptr) return Reply(*review, {{"allowed", true}});
  // What the validating webhook refused, the mutating one refuses, with the same answer: it is the only one
  // registered (one HTTPS call per pod instead of two, deploy/scheduler/50-webhooks.yaml).
  const bool judged = review->operation == "CREATE" || review->operation.empty();
  absl::StatusOr<formats::PodObject> pod = ParsePod(*review->object);
  if (!pod.ok()) {
    if (!judged) return Reply(*review, {{"allowed", true}});
    *decision = Decision::kDenied;
    return RefuseUnreadable(*review, pod.status());
  }
  // A pod for another scheduler (Volcano, HAMi's, ...) is left exactly as written: its own scheduler reads
  // its own resource names.
  if (!ForUs(*pod)) return Reply(*review, {{"allowed", true}});
  // The pod as the patch leaves it, which the validating webhook used to see: judged below.
  core::PodSpec patched = pod->spec;

  auto deny = [&](std::string message) {
    *decision = Decision::kDenied;
    return Refuse(*review, std::move(message));
  };
  json patch = json::array();
  bool gpu = false;
  // The containers' resources as the patch writes them (limits k = 0, requests k = 1), emitted at the end: a
  // pod whose GPUs come from DRA gets them without the GPU resources.
  struct ResourceOp {
    const char* list;
    size_t index;
    size_t k;
    core::ResourceList map;
    bool changed;  // by the translation or the added tessera.dev/gpu (else written only when converted)
  };
  std::vector<ResourceOp> resource_ops;
  std::vector<std::string> gpu_added;
  std::vector<std::string> warnings = core::MigrationWarnings(pod->spec);
  std::optional<core::Priority> priority;     // HAMi's task priority resource
  std::string priority_from;                  // the container it came from, for messages
  bool elastic = false;                       // a translated request without a core limit (Translation)
  absl::StatusOr<std::optional<int64_t>> gpushare_count = core::GpushareCountLabel(pod->spec);
  if (!gpushare_count.ok()) return deny(Message(gpushare_count.status()));
  // Found, not copied: the spec is the sender's, and a copy walks it recursively.
  static const json kNoSpec = json::object();
  auto spec_it = review->object->find("spec");
  const json& spec = spec_it != review->object->end() && spec_it->is_object() ? *spec_it : kNoSpec;
  for (const char* list : {"initContainers", "containers"}) {
    const bool containers_list = list[0] == 'c';
    auto containers = spec.find(list);
    if (containers == spec.end() || !containers->is_array()) continue;
    const std::vector<core::ContainerSpec>& parsed =
        containers_list ? pod->spec.containers : pod->spec.init_containers;
    for (size_t i = 0; i < parsed.size(); ++i) {
      // Containers that hold GPUs for the pod's life: app containers and sidecars.
      const bool app = containers_list || parsed[i].sidecar;
      // What the container asks for in Tessera's names, limits and requests.
      std::array<core::ResourceList, 2> lists = {parsed[i].limits, parsed[i].requests};
      std::array<bool, 2> changed = {false, false};
      for (size_t k = 0; k < lists.size(); ++k) {
        absl::StatusOr<std::optional<core::Translation>> translated =
            core::TranslateToTessera(lists[k], options_.parse, *gpushare_count);
        if (!translated.ok()) return deny(StrCat("container ", parsed[i].name, ": ", Message(translated.status())));
        if (translated->has_value()) {
          core::Translation& t = **translated;
          // As ParsePodRequest decides it: gpu-manager's share is elastic only without the pod's core limit.
          elastic = elastic || (t.elastic && app &&
                                !(t.family == core::ResourceFamily::kGpuManager &&
                                  pod->spec.annotations.contains(core::kGpuManagerCoreLimit)));
          if (t.priority && app) {
            if (priority && *priority != *t.priority) {
              return deny(StrCat("containers ", priority_from, " and ", parsed[i].name, " give ",
                                            options_.parse.hami.priority, " different values; a pod has one ",
                                            "priority: give every container the same"));
            }
            priority = t.priority;
            priority_from = parsed[i].name;
          }
          lists[k] = std::move(t.resources);
          changed[k] = true;
        }
        for (const auto& [name, value] : lists[k]) {
          if (name.rfind("tessera.dev/", 0) == 0) gpu = true;
        }
      }
      // The kubelet calls the device plugin's Allocate only for tessera.dev/gpu (docs/requests.md): a
      // share given without it gets it, with the number of vGPUs the share expands to.
      if (app) {
        absl::StatusOr<std::optional<int64_t>> count = core::ImpliedGpuCount(lists[0], options_.parse);
        // An invalid request is refused below, judged on the patched pod, with the parser's message.
        if (count.ok() && count->has_value()) {
          for (size_t k = 0; k < lists.size(); ++k) {
            if (k == 1 && lists[1].empty() && !changed[1]) {
              // No requests: the API server has not defaulted them from the limits (it always does before
              // admission); adding only tessera.dev/gpu would be all the container requests. Leave it.
              continue;
            }
            lists[k][core::kResourceGpu] = StrCat(**count);
            changed[k] = true;
          }
          gpu_added.push_back(parsed[i].name);
        }
      }
      core::ContainerSpec& target = containers_list ? patched.containers[i] : patched.init_containers[i];
      if (changed[0]) target.limits = lists[0];
      if (changed[1]) target.requests = lists[1];
      for (size_t k = 0; k < lists.size(); ++k) {
        bool asks = false;
        for (const auto& [name, value] : lists[k]) asks = asks || name.starts_with("tessera.dev/");
        // Changed, or in Tessera's names already (a pod whose GPUs come from DRA loses them).
        if (changed[k] || asks) resource_ops.push_back({list, i, k, lists[k], changed[k]});
      }
    }
  }
  // What the translated resources cannot say goes into annotations, as the user would have written them.
  std::map<std::string, std::string> annotations;
  if (!gpu_added.empty()) annotations[core::kAnnotationGpuAdded] = StrJoin(gpu_added, ",");
  const auto& present = pod->spec.annotations;
  // Elastic when the original request is (HAMi, Volcano and gpu-manager without a core limit), as the
  // translations said. An unparsed request is refused below.
  if (elastic && !present.contains(core::kAnnotationComputePolicy)) {
    annotations[core::kAnnotationComputePolicy] = "elastic";
    warnings.push_back(StrCat("no core limit (", options_.parse.hami.cores, " left out or 0, or ",
                              core::kGpuManagerCoreLimit, " absent): the pod is ", core::kAnnotationComputePolicy,
                              ": elastic, its share guaranteed and idle compute usable (tessera-scheduler ",
                              "--hami-no-core-limit)"));
  }
  if (priority) {
    auto it = present.find(core::kAnnotationPriority);
    if (it != present.end() && core::PriorityAnnotation(it->second) != priority) {
      return deny(StrCat(options_.parse.hami.priority, " of container ", priority_from, " says ",
                                    core::ToString(*priority), " but the pod's ", core::kAnnotationPriority,
                                    " says ", it->second, "; keep one of them"));
    }
    if (it == present.end()) annotations[core::kAnnotationPriority] = core::ToString(*priority);
  }
  for (const auto& [key, v] : annotations) patched.annotations[key] = v;
  std::optional<Conversion> conversion;
  if (judged) {
    absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(patched, options_.parse, gpushare_count);
    if (!request.ok()) {
      *decision = Decision::kDenied;
      return RefuseInvalid(*review, *pod, request.status());
    }
    // GPUs from DRA (docs/dra.md, "Extended resources on DRA GPUs"): claims of the same meaning instead.
    if (request->wants_gpu() && conversion_.mode != ExtendedToDra::kNever && conversion_.offer &&
        conversion_.ensure) {
      const DraOffer offer = conversion_.offer();
      if (ShouldConvert(conversion_.mode, offer)) {
        std::set<std::string> pod_claims;
        if (auto claims = spec.find("resourceClaims"); claims != spec.end() && claims->is_array()) {
          for (const json& c : *claims) {
            if (c.is_object() && c.contains("name") && c["name"].is_string()) pod_claims.insert(c["name"]);
          }
        }
        absl::StatusOr<Conversion> c = ConvertToClaims(*request, patched, offer, pod_claims);
        if (!c.ok()) {
          *decision = Decision::kDenied;
          return RefuseInvalid(*review, *pod, c.status());
        }
        const std::string ns = !review->ns.empty() ? review->ns : pod->spec.ns;
        // Created before the pod, so that the claim controller finds it; never on a dry run.
        for (const ClaimTemplate& t : c->templates) {
          if (review->dry_run) break;
          if (absl::Status st = conversion_.ensure(ns, t); !st.ok()) {
            *decision = Decision::kDenied;
            return RefuseInvalid(*review, *pod, st);
          }
        }
        conversion = *std::move(c);
      }
    }
  }
  if (conversion) {
    // The GPU resources leave the containers: the claims say it all (the device plugin is not asked).
    for (ResourceOp& op : resource_ops)
      std::erase_if(op.map, [](const auto& kv) { return kv.first.starts_with("tessera.dev/"); });
    annotations.erase(core::kAnnotationGpuAdded);
    for (const ContainerClaim& c : conversion->claims) {
      warnings.push_back(StrCat("container ", c.container, ": its GPUs come from DRA, as ResourceClaim ",
                                c.claim, " made from ResourceClaimTemplate ", c.template_name,
                                " (docs/dra.md)"));
    }
    for (std::string& w : conversion->warnings) warnings.push_back(std::move(w));
  }
  for (const ResourceOp& op : resource_ops) {
    if (!op.changed && !conversion) continue;
    json map = json::object();
    for (const auto& [name, value] : op.map) map[name] = value;
    patch.push_back(
        {{"op", "add"},
         {"path", StrCat("/spec/", op.list, "/", op.index, "/resources/", op.k == 0 ? "limits" : "requests")},
         {"value", std::move(map)}});
  }
  if (conversion) {
    // The claims: the pod's entries naming the templates, each container's reference.
    json pod_copy = *review->object;  // what the gate decides on: the pod with its claims
    json& entries = pod_copy["spec"]["resourceClaims"];
    const bool had_claims = entries.is_array();
    if (!had_claims) entries = json::array();
    for (const ContainerClaim& c : conversion->claims) {
      const json entry = {{"name", c.claim}, {"resourceClaimTemplateName", c.template_name}};
      entries.push_back(entry);
      if (had_claims) patch.push_back({{"op", "add"}, {"path", "/spec/resourceClaims/-"}, {"value", entry}});
      const char* list = c.init ? "initContainers" : "containers";
      const json& container = spec.at(list).at(c.index);
      const json* resources = container.contains("resources") ? &container["resources"] : nullptr;
      const json ref = {{"name", c.claim}};
      if (resources != nullptr && resources->is_object() && resources->contains("claims") &&
          (*resources)["claims"].is_array()) {
        patch.push_back({{"op", "add"},
                         {"path", StrCat("/spec/", list, "/", c.index, "/resources/claims/-")},
                         {"value", ref}});
      } else {
        patch.push_back({{"op", "add"},
                         {"path", StrCat("/spec/", list, "/", c.index, "/resources/claims")},
                         {"value", json::array({ref})}});
      }
    }
    if (!had_claims) patch.push_back({{"op", "add"}, {"path", "/spec/resourceClaims"}, {"value", entries}});
    // Gated for Tessera's DRA placement in this same patch, when tessera-scheduler places such claims (the
    // dra.tessera.dev webhook then finds the gate there and adds nothing).
    if (dra_gate_ && dra_gate_(pod_copy)) {
      AppendGate(*review->object, &patch);
      annotations[formats::kDraGatedAtAnnotation] = formats::FormatHeartbeat(options_.clock->Now());
    }
    gpu = false;  // kube-scheduler's own profile places it: no schedulerName set
  }
  if (!annotations.empty()) {
    auto metadata = review->object->find("metadata");  // found, not copied (see spec above)
    const bool has_annotations = metadata != review->object->end() && metadata->is_object() &&
                                 metadata->contains("annotations") && (*metadata)["annotations"].is_object();
    if (!has_annotations) {
      json value = json::object();
      for (const auto& [key, v] : annotations) value[key] = v;
      patch.push_back({{"op", "add"}, {"path", "/metadata/annotations"}, {"value", std::move(value)}});
    } else {
      for (const auto& [key, v] : annotations) {
        // "~1" is "/" in a JSON pointer (RFC 6901).
        patch.push_back({{"op", "add"},
                         {"path", StrCat("/metadata/annotations/", JsonPointerToken(key))},
                         {"value", v}});
      }
    }
  }
  if (gpu && !options_.scheduler_name.empty() && pod->scheduler_name != options_.scheduler_name) {
    patch.push_back({{"op", "add"}, {"path", "/spec/schedulerName"}, {"value", options_.scheduler_name}});
  }
  json response = {{"allowed", true}};
  if (!warnings.empty()) response["warnings"] = warnings;  // kubectl prints them (admission.k8s.io/v1)
  if (!patch.empty()) {
    *decision = Decision::kPatched;
    response["patchType"] = "JSONPatch";
    response["patch"] = Base64(formats::DumpJson(patch));
  }
  return Reply(*review, std::move(response));
}

Response Admission::MutateDra(std::string_view body) const {
  Decision decision = Decision::kAllowed;
  absl::StatusOr<Review> review = ParseReview(body);
  Response r;
  if (!review.ok()) {
    decision = Decision::kError;
    r = Malformed(Message(review.status()));
  } else if (review->object == nullptr || !review->object->is_object() || !dra_gate_ ||
             (review->operation != "CREATE" && !review->operation.empty())) {
    r = Reply(*review, {{"allowed", true}});
  } else {
    const json& pod = *review->object;
    const json* spec = pod.contains("spec") && pod["spec"].is_object() ? &pod["spec"] : nullptr;
    const std::string scheduler =
        spec != nullptr && spec->contains("schedulerName") && (*spec)["schedulerName"].is_string()
            ? (*spec)["schedulerName"].get<std::string>()
            : "";
    const bool ours =
        scheduler.empty() || scheduler == "default-scheduler" || scheduler == options_.scheduler_name;
    if (!ours || spec == nullptr || !dra_gate_(pod)) {
      r = Reply(*review, {{"allowed", true}});
    } else {
      json patch = json::array();
      AppendGate(pod, &patch);
      const json& metadata = pod.contains("metadata") ? pod["metadata"] : json();
      const std::string at = formats::FormatHeartbeat(options_.clock->Now());
      if (metadata.is_object() && metadata.contains("annotations") && metadata["annotations"].is_object()) {
        patch.push_back(
            {{"op", "add"},
             {"path", StrCat("/metadata/annotations/", JsonPointerToken(formats::kDraGatedAtAnnotation))},
             {"value", at}});
      } else {
        patch.push_back({{"op", "add"},
                         {"path", "/metadata/annotations"},
                         {"value", {{formats::kDraGatedAtAnnotation, at}}}});
      }
      decision = Decision::kPatched;
      r = Reply(*review,
                {{"allowed", true}, {"patchType", "JSONPatch"}, {"patch", Base64(formats::DumpJson(patch))}});
    }
  }
  counts_[static_cast<size_t>(Verb::kMutate)][static_cast<size_t>(decision)].fetch_add(
      1, std::memory_order_relaxed);
  return r;
}

bool Admission::ForUs(const formats::PodObject& pod) const {
  return pod.scheduler_name.empty() || pod.scheduler_name == "default-scheduler" ||
         pod.scheduler_name == options_.scheduler_name;
}

Response Admission::DoValidate(std::string_view body, Decision* decision) const {
  absl::StatusOr<Review> review = ParseReview(body);
  if (!review.ok()) {
    *decision = Decision::kError;
    return Malformed(Message(review.status()));
  }
  if (review->object == nullptr || (review->operation != "CREATE" && !review->operation.empty())) {
    return Reply(*review, {{"allowed", true}});
  }
  absl::StatusOr<formats::PodObject> pod = ParsePod(*review->object);
  if (!pod.ok()) {
    *decision = Decision::kDenied;
    return RefuseUnreadable(*review, pod.status());
  }
  if (!ForUs(*pod)) return Reply(*review, {{"allowed", true}});
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod->spec, options_.parse);
  if (!request.ok()) {
    *decision = Decision::kDenied;
    return RefuseInvalid(*review, *pod, request.status());
  }
  return Reply(*review, {{"allowed", true}});
}

}  // namespace tessera::scheduler
