// The agent's record of one container's allocation, and the records directory that keeps them across restarts
// (<state_dir>/records/<pod-uid>_<container>.json; the format is in docs/node-agent.md, "Records").
//
//   RecordStore store(state_dir + "/records");
//   store.Save(record);                        // atomic: written to a temporary file, then renamed
//   RecordStore::Loaded l = store.LoadAll();   // unreadable files are moved aside as <name>.bad and named in
//   l.bad
//
// Also here: what a record means to the rest of the agent (the limits file it gives the hook, whether two
// records may trade their allocations) and which names may become a path component under the state directory.
#ifndef TESSERA_NODE_RECORD_H_
#define TESSERA_NODE_RECORD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/request.h"
#include "hook/common/limits.h"

namespace tessera::node {

// Where the limits file and the region appear inside the container (the hook reads TESSERA_REGION from the
// limits file's region line).
inline constexpr char kContainerRegionFile[] = "/var/lib/tessera/region/region";

struct ContainerRecord {
  std::string pod_uid;
  std::string ns;
  std::string pod_name;
  std::string container;
  std::vector<core::VGpuAssignment> vgpus;  // the container's part of the assignment, as applied
  // Per vGPU: the containers holding its GPU, this one included, as last written to the limits file
  // (`tenants=`); empty when not counted (records of older agents).
  std::vector<uint32_t> gpu_tenants;
  int numa_node = -1;
  std::string cpus;
  std::vector<std::string> device_ids;  // the kubelet's slots of the Allocate call
  uint64_t generation = 1;              // of the limits file
  std::string dir;                      // host: the limits directory
  std::string region_dir;               // host: the region's directory
  core::ComputePolicy compute_policy = core::ComputePolicy::kHard;
  core::Priority priority = core::Priority::kLow;
  std::string allocated_at;  // RFC 3339
  bool reported = false;     // tessera.dev/phase: allocated written for this container
  bool confirmed = false;    // seen in the kubelet's pod-resources with these devices
  // A DRA ResourceClaim prepared by the kubelet (node/dra_driver.h) instead of a device-plugin allocation:
  // then `container` is "claim_<claim UID>", `pod_uid` the first pod that reserved the claim, and the record is
  // created by NodePrepareResources and removed by NodeUnprepareResources only (no pod annotation describes it).
  struct Claim {
    std::string uid;
    std::string ns;
    std::string name;
    std::vector<std::string> consumers;  // UIDs of the pods that reserved it when it was prepared
    bool operator==(const Claim&) const = default;
  };
  std::optional<Claim> claim;

  bool is_claim() const { return claim.has_value(); }

  std::string key() const { return pod_uid + "/" + container; }
  bool operator==(const ContainerRecord&) const = default;
};

// The record's file name in the records directory.
std::string RecordFileName(const ContainerRecord& record);
// The file's text (JSON, version 1) and back. Parsing is strict: a missing required field, a wrong type, a
// number out of range or an unknown computePolicy or priority is an error naming what is wrong; nesting and
// size are bounded (formats/bounded_json.h).
std::string SerializeRecord(const ContainerRecord& record);
absl::StatusOr<ContainerRecord> ParseRecord(std::string_view text);

// The limits file the agent writes for a record.
hook::Limits LimitsFor(const ContainerRecord& record);

// The request signature of a container's allocation (count, shares, memory) plus its pod's constraints: two
// containers with equal signatures may trade their allocations without breaking any promise.
std::string Signature(const std::vector<core::VGpuAssignment>& vgpus, core::ComputePolicy policy,
                      core::Priority priority);
bool SameGpus(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b);
bool SameLimits(const std::vector<core::VGpuAssignment>& a, const std::vector<core::VGpuAssignment>& b);

// Whether `name` (a pod UID, a container name) can be one component of a path under the state directory:
// 1-253 characters of [A-Za-z0-9._-], not "." or "..". Kubernetes UIDs and container names always are; an
// edited annotation or API file may not be.
bool SafePathName(std::string_view name);

// The records directory. Not synchronized: the agent calls it outside its lock, one operation per file.
class RecordStore {
 public:
  explicit RecordStore(std::string dir) : dir_(std::move(dir)) {}

  const std::string& dir() const { return dir_; }
  // The path of `record`'s file, and of the file of pod `pod_uid`'s container `container`.
  std::string PathOf(const ContainerRecord& record) const;
  std::string PathOf(std::string_view pod_uid, std::string_view container) const;

  // Writes the record's file atomically (temporary file, then rename; not fsynced: see the .cc).
  absl::Status Save(const ContainerRecord& record) const;
  // Removes a record file; one that does not exist is not an error.
  absl::Status Remove(const std::string& path) const;

  struct Loaded {
    std::vector<ContainerRecord> records;
    std::vector<std::string> bad;  // "<file>: <why>" for each file moved aside as <file>.bad
  };
  // Reads every record; removes temporary files a crash left behind. A record that `check` (when given)
  // refuses is moved aside like an unreadable one, with its reason.
  Loaded LoadAll(const std::function<absl::Status(const ContainerRecord&)>& check = nullptr) const;

 private:
  std::string dir_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_RECORD_H_
