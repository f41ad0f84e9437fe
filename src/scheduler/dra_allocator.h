// Placement of DRA ResourceClaims by Tessera (docs/dra.md, "Placement by Tessera"): which node and which
// devices of driver gpu.tessera.dev each claim of a gated pod gets, chosen by the same Placer, policy and
// Gaia cost tree as the device-plugin path, and written as the allocation kube-scheduler's own allocator
// would have written.
//
// The allocator is pure: it is fed the objects the informers hold (ResourceSlices, DeviceClasses, allocated
// claims, nodes and the CPU and memory their pods request) and answers, for each pod, the allocation of each
// of its claims, or why it waits, or why Tessera leaves the pod to kube-scheduler (a selector it does not
// evaluate, a feature it does not model).
//
//   DraAllocator a({.seed = 42});
//   a.SetSlices(slices); a.SetClasses(classes); a.SetAllocatedClaims(claims); a.SetNodes(nodes);
//   std::vector<PodDecision> d = a.Place(pods);     // in order: each decision sees the previous ones
//
// What it checks, as kube-scheduler's allocator does: the class's and the request's selectors (the subset in
// dra_selector.h), counts, the capacities' request policies (default, validRange, validValues), devices'
// NoSchedule/NoExecute taints (no tolerations are read: a tainted device is never chosen), `matchAttribute`
// constraints, `firstAvailable` (the first alternative that fits anywhere), and for the node: its pool, the
// pod's nodeSelector, required node affinity, tolerations of the node's taints, and the pod's CPU and memory
// against what the node's pods request. Never over a device's capacity: every allocated claim on Tessera's
// devices is counted, whoever allocated it; a node where they already add up to more is not placed on.
//
// Thread-safety: not thread-safe; one owner (the DRA controller's thread).
#ifndef TESSERA_SCHEDULER_DRA_ALLOCATOR_H_
#define TESSERA_SCHEDULER_DRA_ALLOCATOR_H_

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/topology.h"
#include "nlohmann/json.hpp"
#include "scheduler/dra_selector.h"

namespace tessera::scheduler::dra {

using Json = nlohmann::json;

// Reading the API's objects without a copy: a member (null when absent or not an object), a member along a
// path, a string member ("" when absent or not a string). Shared by the allocator and the DRA controller.
const Json& Field(const Json& j, const char* key);
const Json& Path(const Json& j, std::initializer_list<const char*> keys);
std::string Str(const Json& j, const char* key);

// A capacity of a device and its request policy (resource.k8s.io/v1 DeviceCapacity).
struct Capacity {
  int64_t value = 0;
  std::optional<int64_t> default_value;  // what a request that names no amount consumes (none: all of it)
  int64_t min = 0, max = 0, step = 0;    // validRange (0: unset)
  std::vector<int64_t> valid_values;     // sorted
  // What a request of `asked` (nullopt: not asked) consumes, or nullopt when the policy cannot give it.
  std::optional<int64_t> Consumed(std::optional<int64_t> asked) const;
};

struct Device {
  std::string name;                                  // "gpu-3"
  int index = -1;                                    // the `index` attribute
  std::map<std::string, AttributeValue> attributes;  // by qualified name, "gpu.tessera.dev/model"
  Capacity cores, memory;                            // percent; bytes
  bool shared = false;                               // allowMultipleAllocations
  bool tainted = false;                              // a NoSchedule or NoExecute taint
};

// One node's pool of Tessera devices (one ResourceSlice).
struct Pool {
  std::string node;
  std::string name;
  std::vector<Device> devices;
};
absl::StatusOr<Pool> ParseSlice(const Json& slice);

struct DeviceClass {
  std::vector<Selector> selectors;
  Json config = Json::array();  // spec.config
  std::string undecided;        // non-empty: a selector Tessera does not evaluate (the reason)
};
DeviceClass ParseDeviceClass(const Json& device_class);

// A node as the allocator sees it.
struct NodeView {
  std::string name;
  std::map<std::string, std::string> labels;
  Json taints = Json::array();
  bool unschedulable = false;
  int64_t cpu_milli = 0, memory_bytes = 0;          // allocatable (0: not accounted)
  int64_t cpu_requested = 0, memory_requested = 0;  // by the pods bound or about to be (claims allocated)
  std::optional<core::LinkMatrix> links;            // by GPU index, from the node agent's inventory
};
NodeView ParseNode(const Json& node);

// What a pod asks of the node, as kube-scheduler's NodeResourcesFit counts it (containers summed, the largest
// init container if larger, sidecars included, overhead added).
struct HostRequest {
  int64_t cpu_milli = 0, memory_bytes = 0;
};
HostRequest PodHostRequest(const Json& pod);

// A pod's CPU and memory and the node it is bound to ("" while not bound).
struct PodOnNode {
  std::string uid, node;
  HostRequest host;
};
// What the pods take of each node: those bound to it, and those not bound yet whose claims (`allocated`, by
// reservedFor) are allocated on it: placed in an earlier round (by Tessera or kube-scheduler), they will bind
// there, and a pod placed beside them on their CPU would find the node full when kube-scheduler binds it.
std::map<std::string, HostRequest> RequestedByNode(std::span<const PodOnNode> pods,
                                                   std::span<const Json> allocated);

// The one node an allocated claim is bound to (its allocation's node selector names it by metadata.name, as
// kube-scheduler and Tessera write it for node-local devices); "" when it names none or several.
std::string AllocatedNode(const Json& claim);

// A gated pod and its claims (the ResourceClaim objects, in spec.resourceClaims order).
struct PodInput {
  Json pod;
  std::vector<Json> claims;
  // Nodes not to place it on: kube-scheduler refused to bind it there (dra_rebind.h).
  std::set<std::string> avoid_nodes = {};
};

struct PodDecision {
  enum class Kind {
    kPlaced,    // `allocations` hold the claims' new status.allocation, `node` the node
    kWait,      // keep the gate: nothing fits now (`reason` says why), or a claim is not created yet
    kHandOver,  // lift the gate without allocating: kube-scheduler's allocator decides (`reason` says why)
  };
  Kind kind = Kind::kWait;
  std::string node;
  std::vector<std::optional<Json>> allocations;  // per claim of the input; nullopt: allocated already
  std::string reason;
};

struct AllocatorOptions {
  std::string policy = "tessera";
  uint64_t seed = 0;  // ties between equal nodes: by a hash of seed and name
  std::set<std::string> classes = {"gpu.tessera.dev", "gpu-elastic.tessera.dev"};
};

class DraAllocator {
 public:
  explicit DraAllocator(AllocatorOptions options);
  ~DraAllocator();

  void SetPools(std::vector<Pool> pools);
  void SetClasses(std::map<std::string, DeviceClass> classes);
  void SetNodes(std::vector<NodeView> nodes);
  // Every ResourceClaim with an allocation (any class, any allocator): what Tessera's devices hold.
  void SetAllocatedClaims(const std::vector<Json>& claims);
  // The namespaces' GPU quotas per model (tessera-scheduler --quota-file), each with what the namespace holds
  // on the device-plugin path (held_elsewhere): a claim is placed only while its namespace's claims on
  // Tessera's devices and those pods stay within the quota (docs/dra.md, "Quotas on both paths").
  void SetQuotas(std::vector<core::QuotaStanding> quotas);
  // What each namespace holds of each model through the allocated claims on Tessera's devices (held_here, in
  // thousandths of a GPU: a share's cores, or 1000 for a device taken whole), for the device-plugin path;
  // after Place, with the claims it placed.
  std::vector<core::QuotaStanding> QuotaHeld() const;

  // Decides the pods in order; each placement is counted before the next pod is decided.
  std::vector<PodDecision> Place(const std::vector<PodInput>& pods);

  // Does a claim ask only for Tessera's classes (the webhook gates such pods)?
  static bool UsesOnly(const Json& claim_spec, const std::set<std::string>& classes);

  // The shareID Tessera writes in result `index` of the claim with this UID: an RFC 4122 version 4 UUID made
  // from a hash of the two, the same whatever the seed, replica or round. kube-scheduler's are random, so
  // the shareIDs say who allocated a claim (AllocatedByTessera), and no two claims Tessera allocates on one
  // device share one.
  static std::string ShareIdFor(const std::string& claim_uid, size_t index);
  // Is the claim's allocation Tessera's own: results of gpu.tessera.dev only, each with ShareIdFor's shareID?
  // (A result without a shareID, a device taken whole and not shared, cannot tell: not Tessera's.)
  static bool AllocatedByTessera(const Json& claim);

 private:
  struct State;
  // The cluster of Tessera's pools with the allocated claims committed, and the quotas in force (Place then
  // makes the policy over it; QuotaHeld needs none).
  void Build(State& s) const;
  PodDecision PlaceOne(const PodInput& input);

  AllocatorOptions options_;
  std::vector<Pool> pools_;
  std::map<std::string, DeviceClass> classes_;
  std::vector<NodeView> nodes_;
  std::vector<Json> allocated_;
  std::vector<core::QuotaStanding> quotas_;
  std::optional<std::vector<core::QuotaStanding>> placed_held_;  // QuotaHeld after Place, until a Set
  State* state_ = nullptr;  // during Place
};

}  // namespace tessera::scheduler::dra

#endif  // TESSERA_SCHEDULER_DRA_ALLOCATOR_H_
