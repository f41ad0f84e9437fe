#include "formats/pod_object.h"

#include "core/strings.h"
#include "nlohmann/json.hpp"

namespace tessera::formats {

namespace {

using nlohmann::json;

absl::Status WrongType(std::string_view where, std::string_view expected, const json& got) {
  return absl::InvalidArgumentError(
      StrCat("pod object: ", where, " must be ", expected, ", not ", got.type_name()));
}

// An optional string field of `object`.
absl::Status String(const json& object, const char* key, std::string_view where, std::string* out) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return WrongType(StrCat(where, ".", key), "a string", *it);
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// An optional object field; null when absent.
absl::StatusOr<const json*> Object(const json& object, const char* key, std::string_view where) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  if (!it->is_object()) return WrongType(StrCat(where, ".", key), "an object", *it);
  return &*it;
}

absl::Status Resources(const json& list, std::string_view where, core::ResourceList* out) {
  for (auto it = list.begin(); it != list.end(); ++it) {
    if (it->is_string()) {
      (*out)[it.key()] = it->get<std::string>();
    } else if (it->is_number_integer()) {
      (*out)[it.key()] = std::to_string(it->get<int64_t>());
    } else {
      return WrongType(StrCat(where, "[\"", it.key(), "\"]"), "a quantity string such as \"1\" or \"512Mi\"",
                       *it);
    }
  }
  return absl::OkStatus();
}

absl::Status Containers(const json& spec, const char* key, std::vector<core::ContainerSpec>* out) {
  auto it = spec.find(key);
  if (it == spec.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return WrongType(StrCat("spec.", key), "a list", *it);
  for (size_t i = 0; i < it->size(); ++i) {
    const json& c = (*it)[i];
    const std::string where = StrCat("spec.", key, "[", i, "]");
    if (!c.is_object()) return WrongType(where, "an object", c);
    core::ContainerSpec container;
    if (absl::Status s = String(c, "name", where, &container.name); !s.ok()) return s;
    absl::StatusOr<const json*> resources = Object(c, "resources", where);
    if (!resources.ok()) return resources.status();
    if (*resources != nullptr) {
      for (const char* kind : {"limits", "requests"}) {
        absl::StatusOr<const json*> list = Object(**resources, kind, StrCat(where, ".resources"));
        if (!list.ok()) return list.status();
        if (*list == nullptr) continue;
        core::ResourceList& target = kind[0] == 'l' ? container.limits : container.requests;
        if (absl::Status s = Resources(**list, StrCat(where, ".resources.", kind), &target); !s.ok())
          return s;
      }
    }
    // An init container with restartPolicy Always is a sidecar: it runs for the pod's life (Kubernetes 1.29+).
    if (auto rp = c.find("restartPolicy"); rp != c.end() && !rp->is_null()) {
      if (!rp->is_string()) return WrongType(StrCat(where, ".restartPolicy"), "a string", *rp);
      container.sidecar = std::string_view(key) == "initContainers" && rp->get<std::string>() == "Always";
    }
    absl::StatusOr<const json*> security = Object(c, "securityContext", where);
    if (!security.ok()) return security.status();
    if (*security != nullptr) {
      auto p = (*security)->find("privileged");
      if (p != (*security)->end() && !p->is_null()) {
        if (!p->is_boolean())
          return WrongType(StrCat(where, ".securityContext.privileged"), "true or false", *p);
        container.privileged = p->get<bool>();
      }
    }
    out->push_back(std::move(container));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PodObject> ParsePodObject(const json& pod) {
  if (!pod.is_object()) return WrongType("the pod", "a JSON object (a v1 Pod)", pod);
  PodObject out;
  absl::StatusOr<const json*> metadata = Object(pod, "metadata", "pod");
  if (!metadata.ok()) return metadata.status();
  if (*metadata == nullptr)
    return absl::InvalidArgumentError("pod object: metadata is missing; send a v1 Pod");
  const json& m = **metadata;
  for (auto [key, target] : {std::pair{"name", &out.spec.name},
                             {"namespace", &out.spec.ns},
                             {"uid", &out.spec.uid},
                             {"resourceVersion", &out.resource_version},
                             {"creationTimestamp", &out.creation_timestamp}}) {
    if (absl::Status s = String(m, key, "metadata", target); !s.ok()) return s;
  }
  if (out.spec.ns.empty()) out.spec.ns = "default";
  if (out.spec.name.empty())
    return absl::InvalidArgumentError("pod object: metadata.name is missing or empty");
  absl::StatusOr<const json*> annotations = Object(m, "annotations", "metadata");
  if (!annotations.ok()) return annotations.status();
  if (*annotations != nullptr) {
    for (auto it = (*annotations)->begin(); it != (*annotations)->end(); ++it) {
      if (!it->is_string())
        return WrongType(StrCat("metadata.annotations[\"", it.key(), "\"]"), "a string", *it);
      out.spec.annotations[it.key()] = it->get<std::string>();
    }
  }
  // Of the labels, placement reads one: gpushare's GPU count (ACK writes it as a pod label).
  absl::StatusOr<const json*> labels = Object(m, "labels", "metadata");
  if (!labels.ok()) return labels.status();
  if (*labels != nullptr) {
    if (auto it = (*labels)->find(core::kGpushareCount); it != (*labels)->end()) {
      if (!it->is_string()) return WrongType(StrCat("metadata.labels[\"", it.key(), "\"]"), "a string", *it);
      out.spec.labels[it.key()] = it->get<std::string>();
    }
  }
  auto deletion = m.find("deletionTimestamp");
  out.deleting = deletion != m.end() && !deletion->is_null();

  absl::StatusOr<const json*> spec = Object(pod, "spec", "pod");
  if (!spec.ok()) return spec.status();
  if (*spec != nullptr) {
    if (absl::Status s = String(**spec, "nodeName", "spec", &out.node_name); !s.ok()) return s;
    if (absl::Status s = String(**spec, "schedulerName", "spec", &out.scheduler_name); !s.ok()) return s;
    if (absl::Status s = Containers(**spec, "containers", &out.spec.containers); !s.ok()) return s;
    if (absl::Status s = Containers(**spec, "initContainers", &out.spec.init_containers); !s.ok()) return s;
  }
  absl::StatusOr<const json*> status = Object(pod, "status", "pod");
  if (!status.ok()) return status.status();
  if (*status != nullptr) {
    if (absl::Status s = String(**status, "phase", "status", &out.phase); !s.ok()) return s;
  }
  return out;
}

}  // namespace tessera::formats
