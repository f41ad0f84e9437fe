#include "k8s/kube_api.h"

#include <atomic>
#include <chrono>
#include <cstdio>

#include "common/clock.h"
#include "core/strings.h"
#include "k8s/api_status.h"

namespace tessera::k8s {

std::string_view ContentType(PatchType type) {
  switch (type) {
    case PatchType::kMerge:
      return "application/merge-patch+json";
    case PatchType::kStrategicMerge:
      return "application/strategic-merge-patch+json";
    case PatchType::kJson:
      return "application/json-patch+json";
  }
  return "application/merge-patch+json";
}

std::string_view TypeName(WatchEvent::Type type) {
  switch (type) {
    case WatchEvent::Type::kAdded:
      return "ADDED";
    case WatchEvent::Type::kModified:
      return "MODIFIED";
    case WatchEvent::Type::kDeleted:
      return "DELETED";
    case WatchEvent::Type::kBookmark:
      return "BOOKMARK";
  }
  return "?";
}

absl::StatusOr<ObjectList> KubeApi::ListAll(const ResourceType& type, std::string_view ns,
                                            ListOptions options) {
  ObjectList all;
  bool first = true;
  while (true) {
    absl::StatusOr<ObjectList> page = List(type, ns, options);
    if (!page.ok()) {
      if (IsGone(page.status()) && !options.continue_token.empty()) {
        // The continue token expired between pages: start again in one piece, as client-go does.
        options.continue_token.clear();
        options.limit = 0;
        all = ObjectList();
        first = true;
        continue;
      }
      return page.status();
    }
    if (first) {
      all.resource_version = page->resource_version;
      first = false;
    }
    all.items.reserve(all.items.size() + page->items.size());
    for (Json& item : page->items) all.items.push_back(std::move(item));
    if (page->continue_token.empty() || options.limit == 0) break;
    options.continue_token = page->continue_token;
  }
  return all;
}

absl::Status KubeApi::Bind(std::string_view ns, std::string_view pod, std::string_view node,
                           const BindOptions& options) {
  Json binding = {{"apiVersion", "v1"},
                  {"kind", "Binding"},
                  {"metadata", {{"name", pod}, {"namespace", ns}}},
                  {"target", {{"apiVersion", "v1"}, {"kind", "Node"}, {"name", node}}}};
  if (!options.pod_uid.empty()) binding["metadata"]["uid"] = options.pod_uid;
  if (!options.annotations.empty()) binding["metadata"]["annotations"] = options.annotations;
  absl::StatusOr<Json> r = CreateSubresource(kPods, ns, pod, "binding", binding);
  return r.status();
}

absl::StatusOr<Json> KubeApi::CreateEvent(const EventSpec& event) {
  static std::atomic<uint64_t> sequence{0};
  auto now = RealClock().Now();
  int64_t nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  char suffix[40];
  std::snprintf(suffix, sizeof(suffix), "%llx",
                static_cast<unsigned long long>(nanos + static_cast<int64_t>(sequence++)));
  std::string ns = event.involved_object.ns.empty() ? "default" : event.involved_object.ns;
  std::string ts = FormatTime(now);
  Json e = {{"apiVersion", "v1"},
            {"kind", "Event"},
            {"metadata", {{"name", StrCat(event.involved_object.name, ".", suffix)}, {"namespace", ns}}},
            {"involvedObject", event.involved_object.ToJson()},
            {"reason", event.reason},
            {"message", event.message},
            {"type", event.type},
            {"count", event.count},
            {"firstTimestamp", ts},
            {"lastTimestamp", ts},
            {"source", {{"component", event.component}}},
            {"reportingComponent", event.component},
            {"reportingInstance", event.reporting_instance}};
  if (!event.host.empty()) e["source"]["host"] = event.host;
  return Create(kEvents, ns, e);
}

}  // namespace tessera::k8s
