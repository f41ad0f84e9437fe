#include "scheduler/admission.h"

#include "core/strings.h"
#include "formats/bounded_json.h"
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
  json doc;
};

absl::StatusOr<Review> ParseReview(std::string_view body) {
  Review r;
  absl::StatusOr<json> doc = formats::ParseBoundedJson(body, "the AdmissionReview");
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

Response Malformed(std::string_view what) {
  return {400, formats::DumpJson(json{{"error", StrCat("admission: ", what)}})};
}

}  // namespace

Response Admission::Mutate(std::string_view body) const {
  absl::StatusOr<Review> review = ParseReview(body);
  if (!review.ok()) return Malformed(Message(review.status()));
  if (review->object == nullptr) return Reply(*review, {{"allowed", true}});
  absl::StatusOr<formats::PodObject> pod = formats::ParsePodObject(*review->object);
  // A pod that cannot be read is the validating webhook's (and the API server's) to refuse.
  if (!pod.ok()) return Reply(*review, {{"allowed", true}});

  json patch = json::array();
  bool gpu = false;
  // Found, not copied: the spec is the sender's, and a copy walks it recursively.
  static const json kNoSpec = json::object();
  auto spec_it = review->object->find("spec");
  const json& spec = spec_it != review->object->end() && spec_it->is_object() ? *spec_it : kNoSpec;
  for (const char* list : {"initContainers", "containers"}) {
    auto containers = spec.find(list);
    if (containers == spec.end() || !containers->is_array()) continue;
    const std::vector<core::ContainerSpec>& parsed =
        list[0] == 'i' ? pod->spec.init_containers : pod->spec.containers;
    for (size_t i = 0; i < parsed.size(); ++i) {
      for (const char* kind : {"limits", "requests"}) {
        const core::ResourceList& resources = kind[0] == 'l' ? parsed[i].limits : parsed[i].requests;
        absl::StatusOr<std::optional<core::ResourceList>> translated =
            core::TranslateToTessera(resources, options_.parse);
        if (!translated.ok()) {
          return Reply(
              *review,
              {{"allowed", false},
               {"status",
                {{"code", 422},
                 {"reason", "Invalid"},
                 {"message", StrCat("container ", parsed[i].name, ": ", Message(translated.status()))}}}});
        }
        for (const auto& [name, value] : translated->value_or(resources)) {
          if (name.rfind("tessera.dev/", 0) == 0) gpu = true;
        }
        if (!translated->has_value()) continue;
        json map = json::object();
        for (const auto& [name, value] : **translated) map[name] = value;
        patch.push_back({{"op", "replace"},
                         {"path", StrCat("/spec/", list, "/", i, "/resources/", kind)},
                         {"value", std::move(map)}});
      }
    }
  }
  if (gpu && !options_.scheduler_name.empty() &&
      (pod->scheduler_name.empty() || pod->scheduler_name == "default-scheduler")) {
    patch.push_back({{"op", "add"}, {"path", "/spec/schedulerName"}, {"value", options_.scheduler_name}});
  }
  json response = {{"allowed", true}};
  if (!patch.empty()) {
    response["patchType"] = "JSONPatch";
    response["patch"] = Base64(formats::DumpJson(patch));
  }
  return Reply(*review, std::move(response));
}

Response Admission::Validate(std::string_view body) const {
  absl::StatusOr<Review> review = ParseReview(body);
  if (!review.ok()) return Malformed(Message(review.status()));
  if (review->object == nullptr || (review->operation != "CREATE" && !review->operation.empty())) {
    return Reply(*review, {{"allowed", true}});
  }
  absl::StatusOr<formats::PodObject> pod = formats::ParsePodObject(*review->object);
  if (!pod.ok()) {
    return Reply(*review,
                 {{"allowed", false},
                  {"status", {{"code", 400}, {"reason", "BadRequest"}, {"message", Message(pod.status())}}}});
  }
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod->spec, options_.parse);
  if (!request.ok()) {
    return Reply(*review,
                 {{"allowed", false},
                  {"status",
                   {{"code", 422},
                    {"reason", "Invalid"},
                    {"message", StrCat("tessera: pod ", pod->key(), ": ", Message(request.status()))}}}});
  }
  return Reply(*review, {{"allowed", true}});
}

}  // namespace tessera::scheduler
