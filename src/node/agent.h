// tessera-node's core: the device plugin's backend, the per-container directories, limits files and shared
// regions, the tenant registry behind the registration socket, reconciliation with the API and the kubelet's
// pod-resources, garbage collection, the node annotations and the Prometheus metrics. docs/node-agent.md
// describes it as built. One class, its work in one file per job:
//   agent.cc            lifecycle, the background loop, the pod list, the node's inventory and health
//   agent_allocate.cc   Allocate and PreStartContainer: which container a call is for, its files
//   agent_claims.cc     DRA claims prepared and unprepared by the kubelet (node/dra_driver.h)
//   agent_reconcile.cc  the reconcile pass: phases, changed assignments, swapped allocations, collection
//   agent_tenants.cc    records loaded at start, the registration socket's handlers, the tenants' regions
//   agent_metrics.cc    the Prometheus text
// and the record itself, its file format and the records directory in node/record.h.
//
//   NodeAgentConfig config;  config.node_name = "gpu-1";  config.state_dir = "/var/lib/tessera";
//   NodeAgent agent(config, &api, inventory, pod_resources_client.get());
//   agent.Start();                                    // loads the records, serves the registration socket
//   plugin = kubelet::DevicePlugin::Create(..., &agent);   // the kubelet's Allocate lands in agent.Allocate
//   agent.ReconcileOnce();                            // also done by the background loop every `resync`
//
// Host layout under state_dir (docs/node-agent.md, "Per-container directory layout"):
//   containers/<pod-uid>/<container>/limits  the limits file (read-only at /etc/tessera)
//   regions/<pod-uid>/<container>/region      the shared region (read-write at /var/lib/tessera/region)
//   sock/agent.sock                           the registration socket (its directory at /var/run/tessera)
//   records/<pod-uid>_<container>.json        the agent's record of each allocation (survives restarts)
//   lib/ and ld.so.preload                    the hook libraries (at /usr/lib/tessera)
//
// Thread-safety: every public method may be called from any thread; Allocate runs concurrently on the gRPC
// threads. The agent's mutex is held only to read or change its maps: never across a file read or write or an
// API call.
//
// Tenants' shared regions are the containers' own: the agent never maps one, never locks one and never writes
// one. Limits reach the container's processes through the limits file (read-only in the container) and RELOAD
// on the registration socket; the processes reclaim their own dead; the metrics read a bounded copy of each
// region as untrusted data (hook/common/region_snapshot.h, docs/security.md).
#ifndef TESSERA_NODE_AGENT_H_
#define TESSERA_NODE_AGENT_H_

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "common/mutex.h"
#include "core/request.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "hook/common/region_snapshot.h"
#include "kubelet/allocation_backend.h"
#include "kubelet/pod_resources_client.h"
#include "node/node_api.h"
#include "node/record.h"
#include "node/registration_server.h"

namespace tessera::node {

// Paths inside the container.
inline constexpr char kContainerLimitsDir[] = "/etc/tessera";
inline constexpr char kContainerLimitsFile[] = "/etc/tessera/limits";
inline constexpr char kContainerRegionDir[] = "/var/lib/tessera/region";
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
  // How long an Allocate whose only candidates would overcommit a GPU waits, listing the pods again, before
  // it refuses: the scheduler binds a high-priority pod first and lowers the shares it compressed a moment
  // later (its housekeeping, every 500 ms), and the kubelet's refusal of a pod is final.
  std::chrono::milliseconds overcommit_wait{5000};
  // UUIDs of the GPUs given to the DRA driver (tessera-node --dra-gpus): an assignment naming one is never
  // allocated through the device plugin, whatever the extender decided (docs/dra.md, "One node, two paths").
  std::set<std::string> dra_gpu_uuids;
  RegistrationLimits registration;    // caps of the registration socket
  const Clock* clock = &RealClock();  // never null (common/clock.h); the registration server reads it too
};

struct AgentStats {
  uint64_t allocations = 0;
  uint64_t allocation_errors = 0;
  uint64_t limit_updates = 0;  // limits files rewritten for a changed assignment
  uint64_t collected = 0;      // containers garbage-collected
  uint64_t swaps = 0;          // records corrected from pod-resources
  uint64_t registrations = 0;
  uint64_t registrations_refused = 0;
  uint64_t reconciles = 0;
  uint64_t api_errors = 0;
  uint64_t regions_unreadable = 0;  // region reads that found no region (truncated, replaced, forged)
  uint64_t record_errors = 0;       // records that could not be saved or removed
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

  // DRA (node/dra_driver.h, docs/dra.md). A ResourceClaim the kubelet prepares becomes a tenant like an
  // allocated container: limits file, region, record, registration. `record` carries the claim, the GPUs and
  // shares of its allocation, its consumers (pod_uid: the first) and policy; the agent fills in the rest.
  // Idempotent (the kubelet prepares again after restarts): a claim with a record gets that record back.
  absl::StatusOr<ContainerRecord> PrepareClaim(ContainerRecord record);
  // Removes the claim's tenant, limits file, region and record; a claim without one is not an error.
  absl::Status UnprepareClaim(const std::string& claim_uid);
  // What a tenant's containers are given: Allocate's answer for a device-plugin allocation, the CDI spec's
  // edits for a claim.
  kubelet::ContainerAllocation Response(const ContainerRecord& record) const;

  // Prometheus text exposition (docs/node-agent.md, "Metrics").
  std::string MetricsText() const;

  std::vector<ContainerRecord> Records() const;
  std::vector<int> TenantPids(const std::string& pod_uid, const std::string& container) const;
  // The UIDs of the pods on this node as the last list of them read (each pass lists them); nullopt before the
  // first list.
  std::optional<std::set<std::string>> ListedPodUids() const;
  std::string registration_socket() const;
  AgentStats stats() const;
  const NodeAgentConfig& config() const { return config_; }

 private:
  struct Candidate;
  struct Tenant {  // a record plus what lives in memory only
    ContainerRecord record;
    uint64_t allocation = 0;  // NodeAgent::allocations_ when it was allocated; 0: loaded from disk
    // The pod's tessera.dev/assignment does not tell this record, so the next report (ReportPhases) writes
    // the record's part there: a swap gave the record to the pod, or the pod was allocated another pod's part
    // (an exchange), or the record was loaded before it was reported. Any other record that reads otherwise
    // than its pod's text was rewritten by the scheduler since (a compression), which is to be followed.
    bool untold = false;
    // A text of the pod's assignment that does not tell this record: the one the pod had when it became
    // untold, or the one our report replaced. Read again, it is the pod list lagging behind our own write,
    // never the scheduler's rewrite; forgotten once anything else is read.
    std::string superseded;
  };
  // A pod's tessera.dev/assignment as the pod list reads it now: its text, and what it says.
  struct AssignedNow {
    std::string text;
    formats::Assignment assignment;
  };
  // A file operation decided under the lock and done after it.
  struct FileOp {
    ContainerRecord save;  // saved when `remove` is empty
    std::string remove;    // a record file to remove
  };

  absl::StatusOr<kubelet::ContainerAllocation> AllocateOne(const kubelet::AllocateContainerRequest& request);
  // Picks and claims the oldest matching container; NotFound when none.
  absl::StatusOr<formats::Assignment> ParseCached(const std::string& uid, const std::string& text);
  // AlreadyExists when a device slot is being allocated to another container right now.
  // Containers whose assignment would overcommit a GPU are passed over and added to `overcommitted` with why.
  // The tenant to be: its record, and the pod's text when it is allocated another pod's part (an exchange).
  absl::StatusOr<Tenant> Claim(const std::vector<std::string>& device_ids, const std::vector<NodePod>& pods,
                               std::vector<std::pair<NodePod, std::string>>* overcommitted);
  absl::Status Materialize(Tenant* tenant);  // directories, limits file, record
  // Why container `key` with `vgpus` would put one of its GPUs over its compute (1000 thousandths) or its
  // memory; empty when it fits. Counted with it: every other tenant of the GPU whose pod is in `live_uids`
  // (or that is a DRA claim) and every allocation in flight, each at the smaller of its record and its pod's
  // assignment in `assigned` (by pod UID): a share the scheduler lowered (SharedGPU compression) is free for
  // the pod it was lowered for before the next pass applies it. A record at its own shares alone where the
  // assignment is a text it supersedes (Tenant::superseded: that text is another part's).
  std::string OvercommitLocked(const std::string& key, const std::vector<core::VGpuAssignment>& vgpus,
                               const std::set<std::string>& live_uids,
                               const std::map<std::string, AssignedNow>& assigned) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Per vGPU of `record`: the containers holding its GPU (the records in tenants_, plus `record` itself when
  // it is not among them yet), the limits file's tenants=.
  std::vector<uint32_t> GpuTenantsLocked(const ContainerRecord& record) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoadRecords();
  // Host directories of a container: its limits file's, its region's.
  std::string ContainerDir(std::string_view pod_uid, std::string_view container) const;
  std::string RegionDir(std::string_view pod_uid, std::string_view container) const;
  // Sets record->dir and region_dir: ContainerDir and RegionDir of its pod and container, or, when a record
  // holds those already (a swapped record keeps the directories its running container mounts, named after the
  // pod it was made for), the same with ".1", ".2"... after the container's name: no two containers ever
  // share a limits file or a region.
  void ChooseDirsLocked(ContainerRecord* record) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether `dir` is <state_dir>/<top>/<name>/<name> with names a path component may be.
  bool IsContainerDirOf(const std::string& dir, const char* top) const;
  absl::Status WriteLimits(const ContainerRecord& record) const;
  void RunFileOps(const std::vector<FileOp>& ops);
  std::shared_ptr<const std::vector<NodePod>> Pods() const;
  absl::Status RefreshPods();
  void Event(const NodePod& pod, const std::string& type, const std::string& reason,
             const std::string& message);
  void ReportPhases(const std::vector<NodePod>& pods);
  // Rewrites the limits files (and tells the processes to reload) of containers whose assignment was resized
  // or whose GPUs gained or lost a co-tenant (tenants=).
  void ApplyAssignmentChanges(const std::vector<NodePod>& pods);
  void ReconcilePodResources(const std::vector<NodePod>& pods);
  // Y's allocation went to pod X's `container`, which had none: Y takes X's part of the ledger. Records the
  // exchange and returns Y's pod and its new tessera.dev/assignment.
  absl::StatusOr<std::pair<const NodePod*, std::string>> ExchangeLedger(const NodePod& x,
                                                                        const std::string& container,
                                                                        const ContainerRecord& y,
                                                                        const std::vector<NodePod>& pods)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pod's assignment with the exchanges not yet visible in its annotation applied.
  absl::StatusOr<formats::Assignment> LedgerOf(const NodePod& pod) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the tenants whose pods are gone, judging only those allocated up to `seen` (allocations_ when
  // `pods` was listed).
  void Collect(const std::vector<NodePod>& pods, bool pod_resources_ok,
               const std::set<std::string>& kubelet_pods, uint64_t seen);
  // Removes a collected tenant's limits directory, region and record file; false when one of them could not
  // be removed (the state directory read-only, say): then the tenant goes to unremoved_ and is tried again at
  // each pass (`quiet`: without logging the failure again).
  bool RemoveTenantFiles(const ContainerRecord& record, bool quiet = false);
  // RemoveTenantFiles, or the tenant kept in unremoved_ for the next passes (false then).
  bool RemoveOrKeep(const ContainerRecord& record) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<RegistrationServer::Accepted> OnHello(int pid, const hook::Hello& hello);
  void OnGone(int pid, const std::string& tenant);
  std::string PeerOf(int pid) const;  // the registration socket's fairness key: the process's pod
  void Loop();
  // What each tenant's processes report in its shared region (read outside the lock, as untrusted data); by
  // record key, only the tenants whose region could be read.
  std::map<std::string, hook::RegionSnapshot> ReadRegionReports() const;
  // Time through the clock seam (config.clock).
  std::chrono::system_clock::time_point WallNow() const;
  std::chrono::steady_clock::time_point SteadyNow() const;

  const NodeAgentConfig config_;
  const RecordStore records_;  // <state_dir>/records
  NodeApi* const api_;
  kubelet::PodResourcesClient* const pod_resources_;
  std::unique_ptr<RegistrationServer> registration_;

  // Guards the members below it. Held only to read or change them: never across file I/O, an API call or a
  // call into the registration server.
  mutable Mutex mu_;
  formats::GpuInventory inventory_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Tenant> tenants_ ABSL_GUARDED_BY(mu_);  // by record key
  // Collected tenants whose files could not all be removed yet: removed at the next passes. Without this, a
  // record whose removal failed once stayed on disk until the agent restarted (the fault harness found them
  // 90 s after their pods were gone: tests/cluster/chaos.py, docs/faults.md).
  std::vector<ContainerRecord> unremoved_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> claims_ ABSL_GUARDED_BY(mu_);  // keys being allocated right now
  // Pods (UIDs) an Allocate chose and then failed (the state directory read-only, full). The kubelet does not
  // admit a pod whose Allocate failed, so a later Allocate takes them last: taken first (the oldest), the
  // allocation the kubelet makes for another pod of the shape would go to a pod that never runs, its record
  // collected with it under the other pod's container. And the directories the failed Allocate made,
  // which no record tells, Collect removes once the pod is gone, without waiting for the orphans' age (those a
  // later Allocate's record holds stay with the record). Forgotten once the pod and its directories are gone.
  std::set<std::string> refused_pods_ ABSL_GUARDED_BY(mu_);
  // The vGPUs of the device-plugin claims among them, counted by OvercommitLocked until they are tenants.
  std::map<std::string, std::vector<core::VGpuAssignment>> in_flight_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> devices_in_flight_ ABSL_GUARDED_BY(mu_);  // device slots of those claims
  std::shared_ptr<const std::vector<NodePod>> pods_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> reported_problems_ ABSL_GUARDED_BY(mu_);  // "<uid>|<annotation>" already told
  // Containers the kubelet's pod-resources reported holding our devices ("ns/pod/container"): they were
  // allocated already, so an Allocate call is never for them.
  std::set<std::string> held_ ABSL_GUARDED_BY(mu_);
  // A pod whose allocation the kubelet gave to another pod's container before this pod's own container was
  // allocated: it takes that container's part of the ledger instead (docs/node-agent.md, "Swapped
  // allocations"), so that no share is handed out twice. By record key (uid/container).
  struct Exchange {
    // The pod's tessera.dev/assignment values under which the exchange holds: as it read when decided, and as
    // the agent writes it (with its other exchanges). Any other value is the scheduler's rewrite, which wins.
    std::set<std::string> accepted;
    std::vector<core::VGpuAssignment> vgpus;  // the container's new part
  };
  std::map<std::string, Exchange> exchanges_ ABSL_GUARDED_BY(mu_);
  AgentStats stats_ ABSL_GUARDED_BY(mu_);
  // Region reads that found no region, counted by MetricsText (const, and outside mu_).
  mutable std::atomic<uint64_t> regions_unreadable_{0};
  // "<tenant>|<why>" of unreadable regions already logged.
  mutable std::set<std::string> region_warned_ ABSL_GUARDED_BY(mu_);
  uint64_t allocations_ ABSL_GUARDED_BY(mu_) =
      0;  // tenants allocated since start (orders them against lists)

  Mutex parse_mu_;  // the assignments of pods, parsed once per annotation value
  std::map<std::string, std::pair<std::string, absl::StatusOr<formats::Assignment>>> parse_cache_
      ABSL_GUARDED_BY(parse_mu_);

  Mutex reconcile_mu_;  // one reconcile pass at a time (held across its I/O; Allocate never takes it)
  Mutex loop_mu_;       // the background loop's wake-up
  bool nudged_ ABSL_GUARDED_BY(loop_mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(loop_mu_) = false;
  CondVar loop_cv_;  // signalled when stopping_ or nudged_ is set
  std::thread thread_;
};

}  // namespace tessera::node

#endif  // TESSERA_NODE_AGENT_H_
