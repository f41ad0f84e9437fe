// Placement policies: how GPUs are chosen on a node, and how nodes are ranked.
//
// A policy answers two questions for the Placer, which does everything else (constraints, models, quotas,
// NUMA, priorities, explanations):
//   SelectGpus: which GPUs of this node get this container's vGPUs?
//   Score:      how good is this node for this pod, once its GPUs are chosen? (higher is better)
//
// Policies are chosen by name through MakePolicy ("gaia", "binpack", "spread", "gpushare"); see
// docs/placement.md for what each does and where it comes from.
//
//   absl::StatusOr<std::unique_ptr<Policy>> p = MakePolicy("gaia");
//
// Thread-safety: policies' methods are const; they may run concurrently, each call with its own Rng and
// NodeScratch, except fgd's and tessera's, which keep a per-node cache: one instance per thread for those.
#ifndef TESSERA_CORE_PLACEMENT_POLICY_H_
#define TESSERA_CORE_PLACEMENT_POLICY_H_

#include <array>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster.h"
#include "core/gpu_mask.h"
#include "core/placement/compiled_request.h"
#include "core/placement/fragmentation.h"
#include "core/random.h"
#include "core/request.h"
#include "core/units.h"

namespace tessera::core {

struct PlacementOptions {
  // Memory of a vGPU whose memory is left out: proportional to its compute share (docs/requests.md), or
  // the whole memory of the GPU.
  enum class DefaultMemory { kProportional, kWholeGpuMemory };
  DefaultMemory default_memory = DefaultMemory::kProportional;
  // Compression for high-priority pods (SharedGPU) never cuts a low-priority tenant below this share.
  MilliGpu min_compressed_share{10};
  bool allow_compression = true;
};

// What one vGPU takes from one particular GPU.
struct Realized {
  MilliGpu cores{0};
  MiB memory_limit{0};      // handed to the container
  MiB memory_accounted{0};  // taken from the GPU's ledger (all of it for an exclusive vGPU)
};

// A vGPU demand made concrete on a GPU of `gpu_memory`.
Realized Realize(const VGpuDemand& demand, MiB gpu_memory, const PlacementOptions& options);

// The free share and memory of one node's GPUs while a pod's containers are placed one after the other.
// Holds at most 64 GPUs inline and initializes only the node's own: evaluating a node allocates nothing.
class NodeScratch {
 public:
  NodeScratch(const NodeState& node, const PlacementOptions& options);
  NodeScratch(const NodeScratch&) = delete;
  NodeScratch& operator=(const NodeScratch&) = delete;
  // Back to the node's state, forgetting what was taken.
  void Reset();

  const NodeState& node() const { return *node_; }
  const PlacementOptions& options() const { return *options_; }
  int gpu_count() const { return n_; }
  std::span<const MilliGpu> free_cores() const { return {free_cores_, static_cast<size_t>(n_)}; }
  MilliGpu free_cores(int g) const { return free_cores_[g]; }
  MiB free_memory(int g) const { return free_memory_[g]; }

  Realized RealizeOn(const VGpuDemand& demand, int g) const {
    return Realize(demand, node_->memory(g), *options_);
  }
  bool Fits(const Realized& r, int g) const {
    return r.cores <= free_cores_[g] && r.memory_accounted <= free_memory_[g] &&
           r.memory_limit <= node_->memory(g);
  }
  bool Fits(const VGpuDemand& demand, int g) const { return Fits(RealizeOn(demand, g), g); }
  // The GPUs of `eligible` that can take `demand`.
  GpuMask Fitting(const VGpuDemand& demand, GpuMask eligible) const;
  void Take(const VGpuDemand& demand, int g);

  // What the pod's containers placed so far take from this node, in all.
  MilliGpu taken_cores() const { return taken_cores_; }
  MiB taken_memory() const { return taken_memory_; }

 private:
  const NodeState* node_;
  const PlacementOptions* options_;
  int n_;
  MilliGpu taken_cores_{0};
  MiB taken_memory_{0};
  // Only the first n_ entries are set.
  MilliGpu free_cores_[kMaxGpusPerNode];
  MiB free_memory_[kMaxGpusPerNode];
};

// The GPUs chosen for a whole pod on one node, in the order of its vGPUs (containers in order).
struct PodChoice {
  std::array<int8_t, kMaxGpusPerNode> gpus{};
  int count = 0;
  // What the policy's GPU selection thinks of its own choice: lower is better (e.g. Gaia's access cost).
  double selection_cost = 0;
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual std::string_view name() const = 0;

  // Picks a distinct GPU among `eligible` for each vGPU of one container of `pod`, writing the indices into
  // `out` (same order as `vgpus`). Adds its view of the choice's quality to `cost` (lower is better). Returns
  // false when the container does not fit.
  virtual bool SelectGpus(const NodeScratch& node, const CompiledRequest& pod,
                          std::span<const VGpuDemand> vgpus, GpuMask eligible, Rng& rng,
                          std::span<int8_t> out, double& cost) const = 0;

  // Scores a node that fits the pod: `after` is the node with the pod placed (a pod without GPU has an empty
  // `choice`). Higher is better.
  virtual double Score(const NodeScratch& after, const CompiledRequest& pod, const PodChoice& choice,
                       Rng& rng) const = 0;

  // Whether a node's answer depends only on the node's state, the pod and state_key() (not on the Rng), so
  // that it may be reused while none of them changes (EvaluationCache).
  virtual bool deterministic() const { return true; }

  // Reads what the policy weighs from the cluster as a whole; Placer::Place calls it before ranking the nodes
  // for a pod. state_key() names what was read: answers remembered under another key are not reused.
  virtual void Observe(const Cluster&) const {}
  virtual uint64_t state_key() const { return 0; }
  // The part of state_key() this pod's answers depend on (all of it unless the policy knows better): a pod
  // that reads nothing of what changed keeps its remembered answers (EvaluationCache, RankedIndex).
  virtual uint64_t state_key(const CompiledRequest&) const { return state_key(); }
};

// What some policies need to know beyond one node.
struct PolicyContext {
  // The workload's typical pods and FGD's fragmentation measure over them: needed by fgd and tessera.
  std::shared_ptr<const FragmentationModel> fragmentation;
  // The largest node's CPU and GPU count, which bestfit and dotprod normalize by (the FGD study's constants
  // for the Alibaba trace: 128 cores, 8 GPUs).
  MilliCpu max_node_cpu{128000};
  int max_node_gpus = 8;
  // What the workload's GPU pods ask of the host per GPU they use (GPU-weighted means), for tessera's
  // estimate of GPUs stranded by a node's CPU or memory running out first.
  MilliCpu cpu_per_gpu{10000};
  MiB memory_per_gpu{40960};
  // Per GPU model id: the GPU the workload's model-constrained pods ask of that model (split evenly over the
  // models each allows), as a share of all the GPU the workload asks; and that model's GPUs.
  std::vector<double> model_demand_share;
  std::vector<double> model_supply;
};

// A policy by name. Policies that keep caches (fgd, tessera) must not be shared between threads.
absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name, const PolicyContext& context = {});
std::vector<std::string> PolicyNames();
// The context the policies need for a cluster and a workload (its pods, e.g. a trace or the pods seen so
// far).
PolicyContext MakePolicyContext(const Cluster& cluster, std::span<const PodRequest> workload);

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_POLICY_H_
