// Who a process is, in Kubernetes terms, from its cgroup: the pod UID and the runtime's container ID, read
// from /proc/<pid>/cgroup. The node agent identifies hooked processes this way (from the host PID that
// SO_PEERCRED gives), never from what the process says about itself.
//
//   absl::StatusOr<CgroupIdentity> id = IdentifyProcess("/proc", pid);
//   // id->pod_uid == "0f0c6a4e-...", id->container_id == "3b1f..." (64 hex digits)
//
// Understood layouts (cgroup v1 and v2): the cgroupfs driver (/kubepods/burstable/pod<uid>/<id>) and the
// systemd driver (/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
// cri-containerd-<id>.scope, also docker-<id>.scope and crio-<id>.scope).
//
// Thread-safety: pure functions (IdentifyProcess reads one file).
#ifndef TESSERA_NODE_CGROUP_H_
#define TESSERA_NODE_CGROUP_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::node {

struct CgroupIdentity {
  std::string pod_uid;       // with dashes, as in metadata.uid
  std::string container_id;  // the runtime's ID; empty for a process in the pod's cgroup but no container's

  bool operator==(const CgroupIdentity&) const = default;
};

// Parses the text of /proc/<pid>/cgroup. NotFound when the process is in no pod's cgroup.
absl::StatusOr<CgroupIdentity> ParseCgroupFile(std::string_view text);

// Reads <proc_root>/<pid>/cgroup and parses it. NotFound when the process is gone or in no pod.
absl::StatusOr<CgroupIdentity> IdentifyProcess(const std::string& proc_root, int pid);

}  // namespace tessera::node

#endif  // TESSERA_NODE_CGROUP_H_
