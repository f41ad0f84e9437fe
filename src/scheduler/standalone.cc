#include "scheduler/standalone.h"

#include "common/files.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "formats/bounded_json.h"
#include "formats/cluster_file.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

absl::Status LoadClusterFile(ClusterCache& cache, const std::string& path) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<formats::ClusterFile> file = formats::ParseClusterFile(*text, path);
  if (!file.ok()) return file.status();
  for (core::NodeInfo& node : file->nodes) {
    if (absl::Status st = cache.UpsertNode(std::move(node)); !st.ok()) return st;
  }
  for (const formats::QuotaEntry& q : file->quotas) cache.SetQuota(q.ns, q.model, q.limit);
  return absl::OkStatus();
}

absl::Status StandaloneBinder::Bind(const BindTarget& pod, const core::Placement& placement) {
  MutexLock lock(&mu_);
  assignments_[StrCat(pod.ns, "/", pod.name)] =
      placement.containers.empty() ? "" : formats::FormatAssignment(placement);
  return absl::OkStatus();
}

absl::Status StandaloneBinder::UpdateAssignment(const BindTarget& pod, const core::Placement& placement) {
  return Bind(pod, placement);
}

std::map<std::string, std::string> StandaloneBinder::Assignments() const {
  MutexLock lock(&mu_);
  return assignments_;
}

void StandaloneBinder::Forget(const std::string& key) {
  MutexLock lock(&mu_);
  assignments_.erase(key);
}

Response ReleaseStandalone(ClusterCache& cache, StandaloneBinder& binder, std::string_view body) {
  using nlohmann::json;
  absl::StatusOr<json> parsed = formats::ParseBoundedJson(body, "the request body");
  json doc = parsed.ok() ? *std::move(parsed) : json(nullptr);
  if (!doc.is_object() || !doc.contains("PodUID") || !doc["PodUID"].is_string()) {
    return {
        400,
        json{{"Error", "release: send {\"PodUID\": ..., \"PodNamespace\": ..., \"PodName\": ...}"}}.dump()};
  }
  cache.ForgetPod(core::PodUid(doc["PodUID"].get<std::string>()));
  if (doc.contains("PodNamespace") && doc.contains("PodName") && doc["PodNamespace"].is_string() &&
      doc["PodName"].is_string()) {
    binder.Forget(StrCat(doc["PodNamespace"].get<std::string>(), "/", doc["PodName"].get<std::string>()));
  }
  return {200, json{{"Error", ""}}.dump()};
}

}  // namespace tessera::scheduler
