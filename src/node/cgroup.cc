#include "node/cgroup.h"

#include <fstream>
#include <sstream>

#include "core/strings.h"

namespace tessera::node {

namespace {

bool IsUidChar(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || c == '-' || c == '_';
}

// "pod<uid>" inside a path segment (both drivers); the systemd driver writes the UID with '_' for '-'.
std::string PodUidOf(std::string_view segment) {
  size_t at = segment.find("pod");
  while (at != std::string_view::npos) {
    size_t end = at + 3;
    while (end < segment.size() && IsUidChar(segment[end])) ++end;
    std::string uid(segment.substr(at + 3, end - at - 3));
    for (char& c : uid) {
      if (c == '_') c = '-';
    }
    if (uid.size() == 36) return uid;
    at = segment.find("pod", at + 1);
  }
  return "";
}

std::string ContainerIdOf(std::string_view segment) {
  std::string_view s = segment;
  if (s.size() > 6 && s.substr(s.size() - 6) == ".scope") s.remove_suffix(6);
  if (size_t dash = s.rfind('-'); dash != std::string_view::npos) s.remove_prefix(dash + 1);
  if (size_t colon = s.rfind(':'); colon != std::string_view::npos)
    s.remove_prefix(colon + 1);  // cri-o "crio:<id>"
  if (s.size() < 12) return "";
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return "";
  }
  return std::string(s);
}

}  // namespace

absl::StatusOr<CgroupIdentity> ParseCgroupFile(std::string_view text) {
  for (std::string_view line : StrSplit(text, '\n')) {
    // hierarchy-ID:controllers:path
    const size_t first = line.find(':');
    if (first == std::string_view::npos) continue;
    const size_t second = line.find(':', first + 1);
    if (second == std::string_view::npos) continue;
    const std::string_view path = line.substr(second + 1);
    std::vector<std::string_view> segments = StrSplit(path, '/');
    for (size_t i = 0; i < segments.size(); ++i) {
      std::string uid = PodUidOf(segments[i]);
      if (uid.empty()) continue;
      CgroupIdentity id;
      id.pod_uid = std::move(uid);
      if (i + 1 < segments.size()) id.container_id = ContainerIdOf(segments[i + 1]);
      return id;
    }
  }
  return absl::NotFoundError("the process is in no Kubernetes pod's cgroup");
}

absl::StatusOr<CgroupIdentity> IdentifyProcess(const std::string& proc_root, int pid) {
  const std::string path = StrCat(proc_root, "/", pid, "/cgroup");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(StrCat("cannot read ", path, " (the process is gone?)"));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<CgroupIdentity> id = ParseCgroupFile(ss.str());
  if (!id.ok()) return absl::NotFoundError(StrCat("process ", pid, ": ", Message(id.status())));
  return id;
}

}  // namespace tessera::node
