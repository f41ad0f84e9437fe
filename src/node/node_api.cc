#include "node/node_api.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/files.h"
#include "core/strings.h"
#include "formats/bounded_json.h"

namespace tessera::node {

namespace {

using nlohmann::json;

std::string StringField(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return "";
  return it->get<std::string>();
}

void ApplyPatch(std::map<std::string, std::string>* annotations, const AnnotationPatch& patch) {
  for (const auto& [key, value] : patch) {
    if (value.has_value()) {
      (*annotations)[key] = *value;
    } else {
      annotations->erase(key);
    }
  }
}

void ApplyPatch(json* annotations, const AnnotationPatch& patch) {
  if (!annotations->is_object()) *annotations = json::object();
  for (const auto& [key, value] : patch) {
    if (value.has_value()) {
      (*annotations)[key] = *value;
    } else {
      annotations->erase(key);
    }
  }
}

}  // namespace

absl::StatusOr<NodePod> NodePodFromJson(const json& pod) {
  if (!pod.is_object()) return absl::InvalidArgumentError("a pod must be a JSON object");
  NodePod out;
  const json meta = pod.value("metadata", json::object());
  if (!meta.is_object()) return absl::InvalidArgumentError("pod metadata must be an object");
  out.name = StringField(meta, "name");
  if (out.name.empty()) return absl::InvalidArgumentError("pod metadata.name is missing");
  out.ns = StringField(meta, "namespace");
  if (out.ns.empty()) out.ns = "default";
  out.uid = StringField(meta, "uid");
  out.creation_timestamp = StringField(meta, "creationTimestamp");
  out.deleting = meta.contains("deletionTimestamp") && !meta["deletionTimestamp"].is_null();
  if (auto it = meta.find("annotations"); it != meta.end() && !it->is_null()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          StrCat("pod ", out.ns, "/", out.name, ": metadata.annotations must be an object"));
    }
    for (const auto& [k, v] : it->items()) {
      if (!v.is_string()) {
        return absl::InvalidArgumentError(
            StrCat("pod ", out.ns, "/", out.name, ": annotation ", k, " must be a string"));
      }
      out.annotations[k] = v.get<std::string>();
    }
  }
  const json status = pod.value("status", json::object());
  if (status.is_object()) {
    out.phase = StringField(status, "phase");
    if (auto it = status.find("containerStatuses"); it != status.end() && it->is_array()) {
      for (const json& cs : *it) {
        if (!cs.is_object()) continue;
        std::string id = StringField(cs, "containerID");
        if (size_t p = id.find("://"); p != std::string::npos) id = id.substr(p + 3);
        const std::string name = StringField(cs, "name");
        if (!name.empty() && !id.empty()) out.container_ids[name] = id;
      }
    }
  }
  return out;
}

// --- InMemoryNodeApi --------------------------------------------------------------------------------------

absl::StatusOr<std::vector<NodePod>> InMemoryNodeApi::ListNodePods() {
  MutexLock lock(&mu_);
  ++list_calls_;
  if (listed_.has_value()) return *listed_;
  std::vector<NodePod> out;
  out.reserve(pods_.size());
  for (const auto& [key, pod] : pods_) out.push_back(pod);
  return out;
}

void InMemoryNodeApi::LagList(bool lag) {
  MutexLock lock(&mu_);
  if (!lag) {
    listed_.reset();
    return;
  }
  if (listed_.has_value()) return;
  listed_.emplace();
  for (const auto& [key, pod] : pods_) listed_->push_back(pod);
}

absl::Status InMemoryNodeApi::PatchPodAnnotations(const std::string& ns, const std::string& name,
                                                  const AnnotationPatch& patch) {
  Delay();
  MutexLock lock(&mu_);
  if (fail_patches_ > 0) {
    --fail_patches_;
    return absl::UnavailableError("injected failure: the API server is unavailable");
  }
  auto it = pods_.find(ns + "/" + name);
  if (it == pods_.end()) return absl::NotFoundError(StrCat("pod ", ns, "/", name, " not found"));
  ApplyPatch(&it->second.annotations, patch);
  return absl::OkStatus();
}

absl::Status InMemoryNodeApi::PatchNodeAnnotations(const AnnotationPatch& patch) {
  Delay();
  MutexLock lock(&mu_);
  ApplyPatch(&node_annotations_, patch);
  return absl::OkStatus();
}

absl::Status InMemoryNodeApi::PostEvent(const NodeEvent& event) {
  Delay();
  MutexLock lock(&mu_);
  ++events_waiting_;
  while (hold_events_) held_cv_.Wait(&mu_);
  --events_waiting_;
  events_.push_back(event);
  return absl::OkStatus();
}

void InMemoryNodeApi::Delay() const {
  std::chrono::milliseconds d;
  {
    MutexLock lock(&mu_);
    d = delay_;
  }
  if (d.count() > 0) std::this_thread::sleep_for(d);
}

void InMemoryNodeApi::SetCallDelay(std::chrono::milliseconds delay) {
  MutexLock lock(&mu_);
  delay_ = delay;
}

void InMemoryNodeApi::HoldEvents(bool hold) {
  {
    MutexLock lock(&mu_);
    hold_events_ = hold;
  }
  held_cv_.SignalAll();
}

int InMemoryNodeApi::events_waiting() const {
  MutexLock lock(&mu_);
  return events_waiting_;
}

void InMemoryNodeApi::UpsertPod(NodePod pod) {
  MutexLock lock(&mu_);
  pods_[pod.key()] = std::move(pod);
}

void InMemoryNodeApi::DeletePod(const std::string& ns, const std::string& name) {
  MutexLock lock(&mu_);
  pods_.erase(ns + "/" + name);
}

std::optional<NodePod> InMemoryNodeApi::GetPod(const std::string& ns, const std::string& name) const {
  MutexLock lock(&mu_);
  auto it = pods_.find(ns + "/" + name);
  if (it == pods_.end()) return std::nullopt;
  return it->second;
}

std::map<std::string, std::string> InMemoryNodeApi::node_annotations() const {
  MutexLock lock(&mu_);
  return node_annotations_;
}

std::vector<NodeEvent> InMemoryNodeApi::events() const {
  MutexLock lock(&mu_);
  return events_;
}

void InMemoryNodeApi::FailPatches(int n) {
  MutexLock lock(&mu_);
  fail_patches_ = n;
}

int InMemoryNodeApi::list_calls() const {
  MutexLock lock(&mu_);
  return list_calls_;
}

// --- FileNodeApi ------------------------------------------------------------------------------------------

FileNodeApi::FileNodeApi(std::string path, std::string node_name)
    : path_(std::move(path)), node_name_(std::move(node_name)) {}

namespace {

class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0) flock(fd_, LOCK_EX);
  }
  ~FileLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  bool ok() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Larger than any node's pods and events; a file past it is refused, not read into memory.
constexpr size_t kMaxApiFileBytes = size_t{64} << 20;

absl::StatusOr<json> ReadApiFile(const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path, kMaxApiFileBytes);
  if (absl::IsNotFound(text.status()) || absl::IsPermissionDenied(text.status())) {
    return absl::NotFoundError(
        StrCat("cannot read the fake API file ", path, "; create it with {\"pods\": []} or fix --fake-api"));
  }
  if (!text.ok()) return text.status();
  absl::StatusOr<json> parsed = formats::ParseBoundedJson(*text, StrCat("the fake API file ", path));
  if (!parsed.ok()) return absl::InvalidArgumentError(StrCat(Message(parsed.status()), "; fix its syntax"));
  json doc = *std::move(parsed);
  if (!doc.is_object()) {
    return absl::InvalidArgumentError(
        StrCat("the fake API file ", path, " is not a JSON object {\"pods\": [...]}; fix its syntax"));
  }
  if (doc.contains("pods") && !doc["pods"].is_array()) {
    return absl::InvalidArgumentError(StrCat("the fake API file ", path, ": \"pods\" must be an array"));
  }
  return doc;
}

absl::Status WriteApiFile(const std::string& path, const json& doc) {
  const std::string tmp = StrCat(path, ".tmp.", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << formats::DumpJson(doc, 2) << "\n";
    if (!out) return absl::InternalError(StrCat("cannot write ", tmp, "; check the directory is writable"));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename ", tmp, " to ", path, ": ", ec.message()));
  return absl::OkStatus();
}

std::string NodeNameOf(const json& pod) {
  if (!pod.is_object()) return "";
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->is_object()) return "";
  return StringField(*spec, "nodeName");
}

}  // namespace

absl::StatusOr<std::vector<NodePod>> FileNodeApi::ListNodePods() {
  MutexLock guard(&mu_);
  FileLock lock(path_ + ".lock");
  absl::StatusOr<json> doc = ReadApiFile(path_);
  if (!doc.ok()) return doc.status();
  std::vector<NodePod> out;
  auto pods = doc->find("pods");
  if (pods == doc->end()) return out;
  for (const json& p : *pods) {
    if (NodeNameOf(p) != node_name_) continue;
    absl::StatusOr<NodePod> pod = NodePodFromJson(p);
    if (!pod.ok()) return absl::InvalidArgumentError(StrCat(path_, ": ", Message(pod.status())));
    out.push_back(std::move(*pod));
  }
  return out;
}

absl::Status FileNodeApi::Update(const std::function<absl::StatusOr<bool>(json*)>& edit) {
  MutexLock guard(&mu_);
  FileLock lock(path_ + ".lock");
  absl::StatusOr<json> doc = ReadApiFile(path_);
  if (!doc.ok()) return doc.status();
  absl::StatusOr<bool> changed = edit(&*doc);
  if (!changed.ok()) return changed.status();
  if (!*changed) return absl::OkStatus();
  return WriteApiFile(path_, *doc);
}

absl::Status FileNodeApi::PatchPodAnnotations(const std::string& ns, const std::string& name,
                                              const AnnotationPatch& patch) {
  return Update([&](json* doc) -> absl::StatusOr<bool> {
    if (!doc->contains("pods")) (*doc)["pods"] = json::array();
    for (json& p : (*doc)["pods"]) {
      if (!p.is_object() || !p.contains("metadata")) continue;
      json& meta = p["metadata"];
      std::string pns = StringField(meta, "namespace");
      if (pns.empty()) pns = "default";
      if (pns != ns || StringField(meta, "name") != name) continue;
      ApplyPatch(&meta["annotations"], patch);
      return true;
    }
    return absl::NotFoundError(StrCat("pod ", ns, "/", name, " not found in ", path_));
  });
}

absl::Status FileNodeApi::PatchNodeAnnotations(const AnnotationPatch& patch) {
  return Update([&](json* doc) -> absl::StatusOr<bool> {
    json& node = (*doc)["node"];
    if (!node.is_object()) node = json::object();
    node["name"] = node_name_;
    ApplyPatch(&node["annotations"], patch);
    return true;
  });
}

absl::Status FileNodeApi::PostEvent(const NodeEvent& event) {
  return Update([&](json* doc) -> absl::StatusOr<bool> {
    json& events = (*doc)["events"];
    if (!events.is_array()) events = json::array();
    events.push_back({{"namespace", event.ns},
                      {"pod", event.pod_name},
                      {"uid", event.pod_uid},
                      {"type", event.type},
                      {"reason", event.reason},
                      {"message", event.message}});
    // Keep the file small: the newest 200 events.
    if (events.size() > 200)
      events.erase(events.begin(), events.begin() + static_cast<long>(events.size() - 200));
    return true;
  });
}

}  // namespace tessera::node
