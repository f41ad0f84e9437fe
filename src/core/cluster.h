// The cluster as placement sees it: nodes, their GPUs and cost trees, and the ledger of who holds what.
//
// Every mutation goes through Commit (a placement decided by a Placer, or one read back from the API after a
// restart) and Release (the pod is gone). Both validate everything before they change anything, so a refused
// call leaves the cluster exactly as it was.
//
//   Cluster cluster;
//   TESSERA_RETURN_IF_ERROR(cluster.AddNode(node_info));
//   absl::StatusOr<Placement> p = placer.Place(cluster, request, rng);
//   if (p.ok()) TESSERA_RETURN_IF_ERROR(cluster.Commit(request, *p));
//   ...
//   cluster.Release(request.uid);
//
// Thread-safety: not thread-safe. The scheduler guards its Cluster with one mutex; the simulator gives each
// thread its own.
#ifndef TESSERA_CORE_CLUSTER_H_
#define TESSERA_CORE_CLUSTER_H_

#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/cost_tree.h"
#include "core/gpu_mask.h"
#include "core/request.h"

namespace tessera::core {

// One node and the use of its GPUs.
class NodeState {
 public:
  const NodeInfo& info() const { return info_; }
  const NodeName& name() const { return info_.name; }
  const AccessCostTree& tree() const { return tree_; }
  int gpu_count() const { return static_cast<int>(info_.gpus.size()); }
  const GpuInfo& gpu(int g) const { return info_.gpus[static_cast<size_t>(g)]; }

  // Free compute share and memory per GPU, by index.
  std::span<const MilliGpu> free_cores() const { return free_cores_; }
  std::span<const MiB> free_memory() const { return free_memory_; }
  MilliGpu free_cores(int g) const { return free_cores_[static_cast<size_t>(g)]; }
  MiB free_memory(int g) const { return free_memory_[static_cast<size_t>(g)]; }
  const std::vector<Tenant>& tenants(int g) const { return tenants_[static_cast<size_t>(g)]; }

  // The cluster-wide model id of each GPU (see Cluster::ModelId).
  int model_id(int g) const { return model_ids_[static_cast<size_t>(g)]; }
  // Distinct model ids on this node (almost always one).
  std::span<const int> model_ids() const { return distinct_models_; }
  GpuMask healthy() const { return healthy_; }
  // GPUs of one NUMA node (-1: GPUs whose NUMA node is unknown).
  GpuMask GpusOnNuma(int numa) const;
  std::span<const int> numa_nodes() const { return numa_list_; }

  MilliCpu free_cpu() const { return info_.cpu - cpu_used_; }
  MiB free_host_memory() const { return info_.memory - memory_used_; }

  // Summaries over healthy GPUs, kept current by every change, for a filter that rejects in O(1) where it can.
  MilliGpu max_free_cores() const { return max_free_cores_; }
  MiB max_free_memory() const { return max_free_memory_; }
  int whole_free_gpus() const { return whole_free_; }
  MilliGpu total_free_cores() const { return total_free_cores_; }
  int tenant_count() const { return tenant_count_; }
  int high_priority_tenants() const { return high_tenants_; }

  bool operator==(const NodeState&) const;

 private:
  friend class Cluster;
  void Recompute();  // the summaries, from the per-GPU state

  NodeInfo info_;
  AccessCostTree tree_;
  std::vector<MilliGpu> free_cores_;
  std::vector<MiB> free_memory_;
  std::vector<std::vector<Tenant>> tenants_;
  std::vector<int> model_ids_;
  std::vector<int> distinct_models_;
  std::vector<std::pair<int, GpuMask>> numa_masks_;
  std::vector<int> numa_list_;
  GpuMask healthy_;
  MilliCpu cpu_used_{0};
  MiB memory_used_{0};
  MilliGpu max_free_cores_{0};
  MiB max_free_memory_{0};
  MilliGpu total_free_cores_{0};
  int whole_free_ = 0;
  int tenant_count_ = 0;
  int high_tenants_ = 0;
};

// A tenant whose share changed as a side effect (restored after a high-priority pod left).
using ShareChange = Compression;

class Cluster {
 public:
  Cluster() = default;

  // Adds a node. Refuses duplicates, GPU lists whose indices are not 0..n-1, duplicate UUIDs, a link matrix of
  // the wrong size, zero memory.
  absl::Status AddNode(NodeInfo info);
  // Removes a node that holds no pods.
  absl::Status RemoveNode(const NodeName& name);
  // Marks a GPU healthy or not (unhealthy GPUs get no new tenants; present tenants stay recorded).
  absl::Status SetGpuHealth(const NodeName& node, const GpuUuid& gpu, GpuHealth health);
  absl::Status SetSchedulable(const NodeName& node, bool schedulable);

  const NodeState* FindNode(const NodeName& name) const;
  std::span<const NodeState> nodes() const { return nodes_; }
  int node_count() const { return static_cast<int>(nodes_.size()); }

  // Cluster-wide GPU model ids, so that placement compares integers, not strings. -1: no such model here.
  int ModelId(std::string_view model) const;
  const std::string& ModelName(int id) const { return models_[static_cast<size_t>(id)]; }
  int model_count() const { return static_cast<int>(models_.size()); }

  // Records a placement: the pod's tenants on their GPUs, its CPU and memory, and the compressions it made.
  // Refuses, changing nothing, when the pod is already placed, the node or a GPU does not exist, or a GPU
  // lacks the share or memory.
  absl::Status Commit(const PodRequest& request, const Placement& placement);
  // Removes a pod's tenants. Compressed low-priority tenants on the GPUs it leaves get their share back, as
  // far as free compute allows; those changes are returned so that their limits can be rewritten.
  absl::StatusOr<std::vector<ShareChange>> Release(const PodUid& pod);

  bool HasPod(const PodUid& pod) const { return pods_.contains(pod); }
  const Placement* FindPlacement(const PodUid& pod) const;
  int pod_count() const { return static_cast<int>(pods_.size()); }

  // Per-namespace quota of GPU share per model (Gaia's heterogeneous cluster quota). No entry: unlimited.
  void SetQuota(const Namespace& ns, std::string_view model, MilliGpu limit);
  std::optional<MilliGpu> Quota(const Namespace& ns, int model_id) const;
  MilliGpu QuotaUsed(const Namespace& ns, int model_id) const;

 private:
  struct PodRecord {
    int node = -1;
    Namespace ns;
    Placement placement;
    MilliCpu cpu{0};
    MiB memory{0};
  };
  int InternModel(const std::string& model);
  int NodeIndex(const NodeName& name) const;

  std::vector<NodeState> nodes_;
  std::unordered_map<NodeName, int> node_index_;
  std::vector<std::string> models_;
  std::unordered_map<std::string, int> model_index_;
  std::unordered_map<PodUid, PodRecord> pods_;
  std::map<std::pair<Namespace, int>, MilliGpu> quota_;
  std::map<std::pair<Namespace, int>, MilliGpu> quota_used_;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_CLUSTER_H_
