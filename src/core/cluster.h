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

#include <array>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/cost_tree.h"
#include "core/gpu_mask.h"
#include "core/request.h"

namespace tessera::core {

// One node and the use of its GPUs.
//
// Layout: what a filter over thousands of nodes reads (summaries, per-GPU free share and memory, sizes,
// models) sits in the object itself, ahead of the cold description, so that evaluating a node chases no
// pointers.
class NodeState {
 public:
  const NodeInfo& info() const { return info_; }
  const NodeName& name() const { return info_.name; }
  const AccessCostTree& tree() const { return tree_; }
  int gpu_count() const { return gpu_count_; }
  const GpuInfo& gpu(int g) const { return info_.gpus[static_cast<size_t>(g)]; }
  bool schedulable() const { return schedulable_; }

  // Free compute share and memory per GPU, by index.
  std::span<const MilliGpu> free_cores() const {
    return {free_cores_.data(), static_cast<size_t>(gpu_count_)};
  }
  MilliGpu free_cores(int g) const { return free_cores_[static_cast<size_t>(g)]; }
  MiB free_memory(int g) const { return free_memory_[static_cast<size_t>(g)]; }
  // Total memory of GPU g (the same as gpu(g).memory, without touching the cold description).
  MiB memory(int g) const { return memory_[static_cast<size_t>(g)]; }
  // The memory every GPU of this node has, when they all have the same; 0 otherwise.
  MiB uniform_memory() const { return uniform_memory_; }
  const std::vector<Tenant>& tenants(int g) const { return tenants_[static_cast<size_t>(g)]; }

  // The cluster-wide model id of each GPU (see Cluster::ModelId).
  int model_id(int g) const { return model_ids_[static_cast<size_t>(g)]; }
  // Distinct model ids on this node (almost always one).
  std::span<const int> model_ids() const {
    return single_model_ >= 0 ? std::span<const int>(&single_model_, 1)
                              : std::span<const int>(distinct_models_);
  }
  GpuMask healthy() const { return healthy_; }
  // GPUs of one NUMA node (-1: GPUs whose NUMA node is unknown).
  GpuMask GpusOnNuma(int numa) const;
  std::span<const int> numa_nodes() const { return numa_list_; }

  MilliCpu free_cpu() const { return cpu_capacity_ - cpu_used_; }
  MiB free_host_memory() const { return memory_capacity_ - memory_used_; }
  bool tracks_cpu() const { return cpu_capacity_.value() > 0; }
  bool tracks_host_memory() const { return memory_capacity_.value() > 0; }

  // Summaries over healthy GPUs, kept current by every change, for a filter that rejects in O(1) where it
  // can.
  MilliGpu max_free_cores() const { return max_free_cores_; }
  MiB max_free_memory() const { return max_free_memory_; }
  int whole_free_gpus() const { return whole_free_; }
  MilliGpu total_free_cores() const { return total_free_cores_; }
  MiB total_free_memory() const { return total_free_memory_; }
  // Compute and memory of the healthy GPUs, in all.
  MilliGpu healthy_cores() const { return healthy_cores_; }
  MiB healthy_memory() const { return healthy_memory_; }
  int tenant_count() const { return tenant_count_; }
  int high_priority_tenants() const { return high_tenants_; }

  // The number of pods of each shape on the node (PodShapeTag -> count), pods without GPU left out.
  std::span<const std::pair<int, int>> pod_shapes() const { return pod_shapes_; }
  // Changes with every change of the node, and is never reused within one Cluster: a key for caches of
  // anything computed from the node's state.
  uint64_t version() const { return version_; }

  bool operator==(const NodeState&) const;

 private:
  friend class Cluster;
  void Recompute();  // the summaries, from the per-GPU state

  // Hot.
  int gpu_count_ = 0;
  bool schedulable_ = true;
  GpuMask healthy_;
  int single_model_ = -1;  // the model id when every GPU has the same model
  MiB uniform_memory_{0};
  MilliCpu cpu_capacity_{0};
  MiB memory_capacity_{0};
  MilliCpu cpu_used_{0};
  MiB memory_used_{0};
  MilliGpu max_free_cores_{0};
  MiB max_free_memory_{0};
  MilliGpu total_free_cores_{0};
  MiB total_free_memory_{0};
  MilliGpu healthy_cores_{0};
  MiB healthy_memory_{0};
  int whole_free_ = 0;
  int tenant_count_ = 0;
  int high_tenants_ = 0;
  uint64_t version_ = 0;
  std::array<MilliGpu, kMaxGpusPerNode> free_cores_{};
  std::array<MiB, kMaxGpusPerNode> free_memory_{};
  std::array<MiB, kMaxGpusPerNode> memory_{};
  std::array<int, kMaxGpusPerNode> model_ids_{};
  // Cold.
  NodeInfo info_;
  AccessCostTree tree_;
  std::vector<std::vector<Tenant>> tenants_;
  std::vector<int> distinct_models_;
  std::vector<std::pair<int, GpuMask>> numa_masks_;
  std::vector<int> numa_list_;
  std::vector<std::pair<int, int>> pod_shapes_;
};

// A tenant whose share changed as a side effect (restored after a high-priority pod left).
using ShareChange = Compression;

// The largest capacities a node may state (the file formats and the inventory annotation cap them too): sums
// of them over a node's GPUs, and of pods under them, stay far from wrapping.
inline constexpr MiB kMaxGpuMemory{int64_t{1} << 40};
inline constexpr MilliCpu kMaxNodeCpu{int64_t{1} << 40};
inline constexpr MiB kMaxNodeMemory{int64_t{1} << 40};

class Cluster {
 public:
  Cluster() = default;

  // Adds a node. Refuses duplicates, GPU lists whose indices are not 0..n-1, duplicate UUIDs, a link matrix
  // of the wrong size, zero memory, and capacities above the caps above.
  absl::Status AddNode(NodeInfo info);
  // Removes a node that holds no pods.
  absl::Status RemoveNode(const NodeName& name);
  // Marks a GPU healthy or not (unhealthy GPUs get no new tenants; present tenants stay recorded).
  absl::Status SetGpuHealth(const NodeName& node, const GpuUuid& gpu, GpuHealth health);
  absl::Status SetSchedulable(const NodeName& node, bool schedulable);

  const NodeState* FindNode(const NodeName& name) const;
  // The same by a name not (yet) held as a NodeName: the extender resolves thousands of names per request
  // straight from the request body, without a string each.
  const NodeState* FindNode(std::string_view name) const;
  std::span<const NodeState> nodes() const { return nodes_; }
  int node_count() const { return static_cast<int>(nodes_.size()); }
  // Each node's version() by position, side by side: finding the nodes changed since some version reads 8
  // bytes per node instead of a NodeState each (RankedIndex). A node moved to another position by RemoveNode
  // gets a new version.
  std::span<const uint64_t> node_versions() const { return versions_; }
  // The newest node version issued: it changes whenever a node is added or changes (a pod placed or gone, a
  // GPU's health, schedulability); a removal shows in node_count(). Equal values and counts: the same
  // cluster.
  uint64_t last_version() const { return last_version_; }

  // Cluster-wide GPU model ids, so that placement compares integers, not strings. -1: no such model here.
  int ModelId(std::string_view model) const;
  // The ids of the models a name matches: exactly (ModelId), or with `substring` every model containing it,
  // in any case (HAMi's use-gputype: "a100" matches "NVIDIA A100-SXM4-80GB").
  std::vector<int> ModelIds(std::string_view model, bool substring) const;
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
  // Removes every quota (what is held stays counted: a quota set again sees it).
  void ClearQuotas() { quota_.clear(); }
  std::optional<MilliGpu> Quota(const Namespace& ns, int model_id) const;
  // What the namespace holds of the model: its pods here and what SetQuotaHeldElsewhere says it holds
  // elsewhere.
  MilliGpu QuotaUsed(const Namespace& ns, int model_id) const;
  // What a namespace holds of a model on GPUs this cluster does not place on, counted against its quota with
  // what it holds here: the DRA path's claims for the extender's cluster, the device-plugin path's pods for
  // the DRA allocator's (docs/dra.md, "Quotas on both paths"). Replaces every earlier figure.
  void SetQuotaHeldElsewhere(std::span<const QuotaStanding> held);
  // Every namespace and model with a quota or a holding: the limit, what this cluster's pods hold (held_here)
  // and what is held elsewhere; in namespace, then model order.
  std::vector<QuotaStanding> QuotaStandings() const;

 private:
  struct PodRecord {
    int node = -1;
    int shape = kNoGpuShape;
    Namespace ns;
    Placement placement;
    MilliCpu cpu{0};
    MiB memory{0};
  };
  int InternModel(const std::string& model);
  int NodeIndex(const NodeName& name) const;
  // Gives the node (one of nodes_) a new version.
  void Touch(NodeState& node) {
    node.version_ = ++last_version_;
    versions_[static_cast<size_t>(&node - nodes_.data())] = node.version_;
  }

  std::vector<NodeState> nodes_;
  std::vector<uint64_t> versions_;  // nodes_[i].version() at i
  uint64_t last_version_ = 0;
  // Node name -> position in nodes_. An open-addressing table: the extender resolves thousands of names per
  // request, and a node-based map's pointer chasing showed up as a fifth of its time.
  absl::flat_hash_map<std::string, int> node_index_;
  std::vector<std::string> models_;
  std::unordered_map<std::string, int> model_index_;
  std::unordered_map<PodUid, PodRecord> pods_;
  std::map<std::pair<Namespace, int>, MilliGpu> quota_;
  // Summed in 64 bits: one namespace may hold more than 2^31 thousandths (2.1 million GPUs) of a model in a
  // large enough cluster, and a wrapped sum would free its quota. QuotaUsed clamps what it returns.
  std::map<std::pair<Namespace, int>, int64_t> quota_used_;
  std::map<std::pair<Namespace, int>, int64_t> quota_elsewhere_;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_CLUSTER_H_
