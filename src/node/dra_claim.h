// The pure parts of tessera-node's DRA driver (node/dra_driver.h, docs/dra.md): the node's ResourceSlice,
// what a ResourceClaim's allocation gives the node, and the CDI spec of a prepared claim. No I/O; the fuzz
// target claim_fuzz feeds ReadClaim arbitrary JSON.
//
// Thread-safety: pure functions.
#ifndef TESSERA_NODE_DRA_CLAIM_H_
#define TESSERA_NODE_DRA_CLAIM_H_

#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "formats/inventory.h"
#include "kubelet/allocation_backend.h"
#include "kubelet/dra_plugin.h"
#include "node/record.h"
#include <nlohmann/json.hpp>

namespace tessera::node {

using Json = nlohmann::json;

inline constexpr char kCdiDir[] = "/var/run/cdi";
inline constexpr char kCdiKind[] = "tessera.dev/claim";  // CDI vendor/class of the claims' devices
inline constexpr int64_t kCoresCapacity = 100;          // `cores`: percent of one GPU

struct DraDriverConfig {
  std::string driver = kubelet::kDraDriverName;
  std::string node_name;
  std::string cdi_dir = kCdiDir;
  std::set<int> gpus;  // indices of the GPUs published to DRA
  std::chrono::milliseconds resync{10000};
  // A claim the kubelet never unprepared is unprepared by the driver once it has looked forgotten this long
  // (DraDriver::SweepForgottenClaims; tessera-node --dra-forgotten-claim-grace).
  std::chrono::milliseconds forgotten_claim_grace{120000};
};

// The device name of GPU `index` in the node's slice, and back (-1 when `name` is not one).
std::string DraDeviceName(int index);
int DraDeviceIndex(std::string_view name);

// The node's ResourceSlice (resource.k8s.io/v1) for `config.gpus` of `inventory`, owned by the Node of UID
// `node_uid` (so that it goes with the node), pool generation `generation`.
Json ResourceSliceFor(const DraDriverConfig& config, const formats::GpuInventory& inventory,
                           const std::string& node_uid, int64_t generation);

// What a claim's allocation gives this node: the tenant's record (without directories) and the devices to
// report to the kubelet (without CDI IDs). Errors name what is wrong with the claim and what to do.
struct ClaimOnNode {
  ContainerRecord record;
  std::vector<kubelet::DraPreparedDevice> devices;
};
absl::StatusOr<ClaimOnNode> ReadClaim(const Json& claim, const kubelet::DraClaim& ref,
                                      const DraDriverConfig& config, const formats::GpuInventory& inventory);

// The CDI device ID of a prepared claim, the path of its spec file, and the spec (CDI 0.6.0, JSON) that gives
// its containers `edits` (the node agent's Response for its record).
std::string CdiDeviceId(const std::string& claim_uid);
std::string CdiSpecPath(const DraDriverConfig& config, const std::string& claim_uid);
std::string CdiSpec(const std::string& claim_uid, const kubelet::ContainerAllocation& edits);

}  // namespace tessera::node

#endif  // TESSERA_NODE_DRA_CLAIM_H_
