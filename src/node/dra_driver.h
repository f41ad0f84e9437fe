// tessera-node's Dynamic Resource Allocation driver, `gpu.tessera.dev` (docs/dra.md).
//
// What it does:
//   - publishes one ResourceSlice for the node: each GPU given to DRA is a device `gpu-<index>` with
//     attributes to select on (model, uuid, index, memory, numaNode, pciBusID, nvlinkDomain) and two capacities
//     that claims consume in part (`cores`, percent of the GPU's compute; `memory`), with
//     allowMultipleAllocations, so that several claims share one GPU (consumable capacity, beta and on by
//     default since Kubernetes 1.36). A claim that asks neither takes the whole GPU (the policies' defaults);
//   - prepares a claim when the kubelet asks (kubelet::DraPlugin): reads the ResourceClaim's allocation from
//     the API server, turns it into a tenant of the node agent (limits file, region, record: exactly what a
//     device-plugin allocation gets) and writes a CDI spec whose device carries the tenant's mounts and
//     environment; unprepares by removing both;
//   - unprepares a claim the kubelet forgot: prepared here, its ResourceClaim gone from the API server, no pod
//     of it left on the node and no process of it registered, for a grace period (SweepForgottenClaims).
//
// The GPUs given to DRA (`gpus`) are taken out of the inventory the device plugin and the extender see, so
// the two paths never hand out the same GPU (tessera-node --dra-gpus).
//
//   DraDriver driver(config, &kube_api, &agent, inventory);
//   driver.Start();                        // the slice now and every `resync`
//   kubelet::DraPlugin::Create(plugin_config, &driver);
//
// Thread-safety: Prepare and Unprepare run concurrently on the plugin's gRPC threads; claims are independent.
#ifndef TESSERA_NODE_DRA_DRIVER_H_
#define TESSERA_NODE_DRA_DRIVER_H_

#include <array>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "formats/inventory.h"
#include "k8s/kube_api.h"
#include "kubelet/dra_plugin.h"
#include "node/agent.h"
#include "node/dra_claim.h"
#include "node/record.h"

namespace tessera::node {

class DraDriver : public kubelet::DraBackend {
 public:
  DraDriver(DraDriverConfig config, k8s::KubeApi* api, NodeAgent* agent, formats::GpuInventory inventory);
  ~DraDriver() override;
  DraDriver(const DraDriver&) = delete;
  DraDriver& operator=(const DraDriver&) = delete;

  absl::StatusOr<std::vector<kubelet::DraPreparedDevice>> Prepare(const kubelet::DraClaim& claim) override
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Unprepare(const kubelet::DraClaim& claim) override;

  // Creates the node's slice, or updates it when it differs (a new pool generation). Also run every `resync`
  // by Start's thread: the kubelet deletes a driver's slices when its plugin has been gone a while.
  absl::Status PublishSlice() ABSL_LOCKS_EXCLUDED(mu_);
  // Claims the kubelet never unprepared (docs/dra.md, "Claims the kubelet forgot"). The kubelet calls
  // NodeUnprepareResources only for the claims its own records say it prepared for a pod; a pod deleted while
  // its prepare was in flight, or a kubelet that lost its DRA checkpoint, leaves the claim's tenant here for
  // good, its share held on the GPU. A claim record is forgotten when, at every sweep for
  // `forgotten_claim_grace` in a row: its ResourceClaim is gone from the API server or stands there under
  // another UID (the claim controller deletes a pod's claim only once the pod is gone, and none is deleted
  // while reserved), none of its consumer pods is in the node's pod list, and no process of it is
  // registered with the agent. A sweep that cannot read the claim or the pod list decides nothing. Then it is
  // unprepared as the kubelet would have (the claim's lock, its tenant, its CDI spec). Run by Start's thread
  // every `resync`; returns how many it unprepared.
  int SweepForgottenClaims() ABSL_LOCKS_EXCLUDED(mu_);
  // Prometheus text: tessera_node_dra_forgotten_claims_unprepared_total.
  std::string MetricsText() const ABSL_LOCKS_EXCLUDED(mu_);
  void Start();
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);
  // GPU health (the HealthMonitor): an unhealthy GPU is published with a NoSchedule taint, so no new claim gets
  // it; claims already prepared keep it. The slice is updated at once.
  void SetGpuHealth(const core::GpuUuid& uuid, bool healthy) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const DraDriverConfig config_;
  k8s::KubeApi* const api_;
  NodeAgent* const agent_;
  // Prepare and Unprepare of one claim never overlap (the kubelet may unprepare a claim whose prepare it gave
  // up waiting for): each holds the lock its claim UID hashes to for the whole call. They guard no field: the
  // API calls and files of one claim. Taken before mu_.
  Mutex& ClaimLock(const std::string& uid);
  std::array<Mutex, 64> claim_locks_;

  mutable Mutex mu_;  // the inventory (health changes), the publishing loop's state and the sweeps'
  formats::GpuInventory inventory_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool publish_now_ ABSL_GUARDED_BY(mu_) = false;
  CondVar cv_;  // signalled when stopping_ or publish_now_ is set
  // Claim UID -> when a sweep first found it forgotten (in the sweeps since, without a break).
  std::map<std::string, std::chrono::steady_clock::time_point> forgotten_since_ ABSL_GUARDED_BY(mu_);
  uint64_t forgotten_unprepared_ ABSL_GUARDED_BY(mu_) = 0;
  std::thread thread_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_DRA_DRIVER_H_
