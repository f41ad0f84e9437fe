// tessera-node's core: the device plugin's backend (Allocate resolves the pod and container, DESIGN.md
// section 4), the per-container records, directories, limits files and shared regions (section 5), the tenant
// registry behind the registration socket, reconciliation with the API and the kubelet's pod-resources,
// garbage collection, the node annotations and the Prometheus metrics. docs/node-agent.md describes it as
// built.
//
//   NodeAgentConfig config;  config.node_name = "gpu-1";  config.state_dir = "/var/lib/tessera";
//   NodeAgent agent(config, &api, inventory, pod_resources_client.get());
//   agent.Start();                                    // loads the records, serves the registration socket
//   plugin = kubelet::DevicePlugin::Create(..., &agent);   // the kubelet's Allocate lands in agent.Allocate
//   agent.ReconcileOnce();                            // also done by the background loop every `resync`
//
// Host layout under state_dir (docs/node-agent.md):
//   containers/<pod-uid>/<container>/limits   the limits file (mounted read-only at /etc/tessera)
//   regions/<pod-uid>/<container>/region       the shared region (mounted read-write at
//   /var/lib/tessera/region) sock/agent.sock                             the registration socket (directory
//   mounted at /var/run/tessera) records/<pod-uid>_<container>.json          the agent's record of each
//   allocation (survives restarts) lib/                                        the hook libraries (mounted at
//   /usr/lib/tessera) + ld.so.preload
//
// Thread-safety: every public method may be called from any thread; Allocate runs concurrently on the gRPC
// threads and holds the agent's mutex only to claim a container (no I/O under it).
#ifndef TESSERA_NODE_AGENT_H_
#define TESSERA_NODE_AGENT_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "core/request.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "hook/common/region.h"
#include "kubelet/allocation_backend.h"
#include "kubelet/pod_resources_client.h"
#include "node/node_api.h"
#include "node/registration_server.h"

namespace tessera::node {

// Paths inside the container.
inline constexpr char kContainerLimitsDir[] = "/etc/tessera";
inline constexpr char kContainerLimitsFile[] = "/etc/tessera/limits";
inline constexpr char kContainerRegionDir[] = "/var/lib/tessera/region";
inline constexpr char kContainerRegionFile[] = "/var/lib/tessera/region/region";
inline constexpr char kContainerSocketDir[] = "/var/run/tessera";
inline constexpr char kContainerSocket[] = "/var/run/tessera/agent.sock";
inline constexpr char kContainerHookDir[] = "/usr/lib/tessera";

struct NodeAgentConfig {
  std::string node_name;
  std::string state_dir = "/var/lib/tessera";
  std::string hook_dir;  // host directory of libtessera-*.so; empty: <state_dir>/lib
  std::string proc_root = "/proc";
  bool device_nodes = false;  // add /dev/nvidia* to the response (runtimes without the NVIDIA runtime)
  std::string dev_root = "/dev";
  std::string resource_name = "tessera.dev/gpu";
  std::chrono::milliseconds resync{2000};      // background reconcile period
  std::chrono::milliseconds heartbeat{10000};  // node annotation refresh period
};

// The agent's record of one container's allocation: persisted in records/, rebuilt from it after a restart.
struct ContainerRecord {
  std::string pod_uid;
  std::string ns;
  std::string pod_name;
  std::string container;
  std::vector<core::VGpuAssignment> vgpus;  // the container's part of the assignment, as applied
  int numa_node = -1;
  std::string cpus;
  std::vector<std::string> device_ids;  // the kubelet's slots of the Allocate call
  uint64_t generation = 1;              // of the limits file
  std::string dir;                      // host: the limits directory
  std::string region_dir;               // host: the region's directory
  std::string compute_policy = "hard";
  std::string priority = "low";
  std::string allocated_at;  // RFC 3339
  bool reported = false;     // tessera.dev/phase: allocated written for this container
  bool confirmed = false;    // seen in the kubelet's pod-resources with these devices

  std::string key() const { return pod_uid + "/" + container; }
  bool operator==(const ContainerRecord&) const = default;
};

struct AgentStats {
  uint64_t allocations = 0;
  uint64_t allocation_errors = 0;
  uint64_t limit_updates = 0;  // limits files rewritten for a changed assignment
  uint64_t collected = 0;      // containers garbage-collected
  uint64_t swaps = 0;          // records corrected from pod-resources
  uint64_t registrations = 0;
  uint64_t registrations_refused = 0;
  uint64_t slots_reclaimed = 0;  // region slots of dead processes freed
  uint64_t reconciles = 0;
  uint64_t api_errors = 0;
};

class NodeAgent : public kubelet::AllocationBackend {
 public:
  // `api` must outlive the agent; `pod_resources` may be null (then nothing is reconciled against the
  // kubelet).
  NodeAgent(NodeAgentConfig config, NodeApi* api, formats::GpuInventory inventory,
            kubelet::PodResourcesClient* pod_resources);
  ~NodeAgent() override;
  NodeAgent(const NodeAgent&) = delete;
  NodeAgent& operator=(const NodeAgent&) = delete;

  // Creates the state directories, loads the records of an earlier run, writes ld.so.preload, serves the
  // registration socket and, when `background` is true, starts the reconcile/heartbeat thread.
  absl::Status Start(bool background = true);
  void Stop();

  // kubelet::AllocationBackend.
  absl::StatusOr<std::vector<kubelet::ContainerAllocation>> Allocate(
      const kubelet::AllocateRequestView& request) override;
  absl::Status PreStartContainer(const kubelet::PreStartRequestView& request) override;

  // One pass: lists the node's pods (and the kubelet's pod-resources), writes pending phase annotations,
  // corrects swapped records, applies changed assignments to running containers' limits files, collects the
  // containers that are gone. Errors: the API list failed (nothing was collected then).
  absl::Status ReconcileOnce();
  // Writes tessera.dev/gpu-inventory and tessera.dev/heartbeat on the node.
  absl::Status PublishInventory();
  // GPU health (from the HealthMonitor): the inventory annotation and the metrics follow.
  void SetGpuHealth(const core::GpuUuid& uuid, bool healthy, const std::string& reason);
  // Asks the background thread for a reconcile pass soon.
  void Nudge();

  // Prometheus text exposition (docs/node-agent.md, "Metrics").
  std::string MetricsText() const;

  std::vector<ContainerRecord> Records() const;
  std::vector<int> TenantPids(const std::string& pod_uid, const std::string& container) const;
  std::string registration_socket() const;
  AgentStats stats() const;
  const NodeAgentConfig& config() const { return config_; }

 private:
  struct Candidate;
  struct Tenant {  // a record plus what lives in memory only
    ContainerRecord record;
    std::unique_ptr<hook::SharedRegion> region;
  };

  absl::StatusOr<kubelet::ContainerAllocation> AllocateOne(const kubelet::AllocateContainerRequest& request);
  // Picks and claims the oldest matching container; NotFound when none.
  absl::StatusOr<formats::Assignment> ParseCached(const std::string& uid, const std::string& text);
  absl::StatusOr<ContainerRecord> Claim(size_t count, const std::vector<NodePod>& pods);
  absl::Status Materialize(Tenant* tenant);  // directory, limits file, region
  kubelet::ContainerAllocation Response(const ContainerRecord& record) const;
  absl::Status SaveRecord(const ContainerRecord& record) const;
  void LoadRecords();
  absl::Status WriteLimits(const ContainerRecord& record) const;
  void ApplyRegionLimits(Tenant* tenant);
  std::shared_ptr<const std::vector<NodePod>> Pods() const;
  absl::Status RefreshPods();
  void Event(const NodePod& pod, const std::string& type, const std::string& reason,
             const std::string& message);
  void ReportPhases(const std::vector<NodePod>& pods);
  void ApplyAssignmentChanges(const std::vector<NodePod>& pods);
  void ReconcilePodResources(const std::vector<NodePod>& pods);
  // Y's allocation went to pod X's `container`, which had none: Y takes X's part of the ledger. Records the
  // exchange and returns Y's pod and its new tessera.dev/assignment. Needs mu_.
  absl::StatusOr<std::pair<const NodePod*, std::string>> ExchangeLedger(const NodePod& x,
                                                                        const std::string& container,
                                                                        const ContainerRecord& y,
                                                                        const std::vector<NodePod>& pods);
  // A pod's assignment with the exchanges not yet visible in its annotation applied. Needs mu_.
  absl::StatusOr<formats::Assignment> LedgerOf(const NodePod& pod) const;
  void Collect(const std::vector<NodePod>& pods, bool pod_resources_ok,
               const std::set<std::string>& kubelet_pods);
  void RemoveTenantFiles(const ContainerRecord& record);
  absl::StatusOr<RegistrationServer::Accepted> OnHello(int pid, const hook::Hello& hello);
  void OnGone(int pid, const std::string& tenant);
  void RetryReclaims();
  void OpenRegions();  // creates the regions of new tenants
  void Loop();

  const NodeAgentConfig config_;
  NodeApi* const api_;
  kubelet::PodResourcesClient* const pod_resources_;
  std::unique_ptr<RegistrationServer> registration_;

  mutable std::mutex mu_;  // guards everything below (never held across I/O except the tiny region reads)
  formats::GpuInventory inventory_;
  std::map<std::string, Tenant> tenants_;  // by record key
  std::set<std::string> claims_;           // keys being allocated right now
  std::shared_ptr<const std::vector<NodePod>> pods_;
  std::set<std::string> pending_reclaims_;   // tenants whose exited process was not reaped yet (zombie)
  std::set<std::string> reported_problems_;  // "<uid>|<annotation>" already told as an event
  // Containers the kubelet's pod-resources reported holding our devices ("ns/pod/container"): they were
  // allocated already, so an Allocate call is never for them.
  std::set<std::string> held_;
  // A pod whose allocation the kubelet gave to another pod's container before this pod's own container was
  // allocated: it takes that container's part of the ledger instead (docs/node-agent.md, "Swapped
  // allocations"), so that no share is handed out twice. By record key (uid/container).
  struct Exchange {
    // The pod's tessera.dev/assignment values under which the exchange holds: as it read when decided, and as
    // the agent writes it (with its other exchanges). Any other value is the scheduler's rewrite, which wins.
    std::set<std::string> accepted;
    std::vector<core::VGpuAssignment> vgpus;  // the container's new part
  };
  std::map<std::string, Exchange> exchanges_;
  AgentStats stats_;

  std::mutex parse_mu_;  // the assignments of pods, parsed once per annotation value
  std::map<std::string, std::pair<std::string, absl::StatusOr<formats::Assignment>>> parse_cache_;

  std::mutex reconcile_mu_;  // one reconcile pass at a time
  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool nudged_ = false;
  bool stopping_ = false;
  std::thread thread_;
};

// The limits file the agent writes for a record (exposed for tests).
hook::Limits LimitsFor(const ContainerRecord& record);

}  // namespace tessera::node

#endif  // TESSERA_NODE_AGENT_H_
