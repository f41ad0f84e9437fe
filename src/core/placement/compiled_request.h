// A pod's request compiled against one cluster: done once per pod, read by the Placer and the policies for
// every node.
//
//   CompiledRequest compiled(cluster, request);   // `request` must outlive `compiled`
//   for (const NodeState& n : cluster.nodes()) placer.Evaluate(n, compiled, rng);
//
// Thread-safety: immutable after construction.
#ifndef TESSERA_CORE_PLACEMENT_COMPILED_REQUEST_H_
#define TESSERA_CORE_PLACEMENT_COMPILED_REQUEST_H_

#include <optional>
#include <span>
#include <vector>

#include "core/cluster.h"
#include "core/request.h"

namespace tessera::core {

// A request compiled against one cluster, once per pod: models resolved to ids, vGPUs flattened.
class CompiledRequest {
 public:
  CompiledRequest(const Cluster& cluster, const PodRequest& request);

  const PodRequest& request() const { return *request_; }
  std::span<const VGpuDemand> vgpus() const { return vgpus_; }
  // vGPUs of container i are vgpus()[container_start(i) .. container_start(i + 1)).
  size_t container_start(size_t i) const { return starts_[i]; }
  size_t container_count() const { return starts_.size() - 1; }
  bool ModelAllowed(int model_id) const;
  // The GPUs of `node` the UUID constraints allow.
  GpuMask UuidAllowed(const NodeState& node) const;
  int exclusive_count() const { return exclusive_; }
  // The most vGPUs any one container asks for (each of a container's vGPUs needs a GPU of its own).
  int max_container_vgpus() const { return max_container_vgpus_; }
  // Smallest compute share any vGPU needs, known before a GPU is chosen (proportional shares count as 1).
  MilliGpu min_cores() const { return min_cores_; }
  // Share of GPUs of this model the pod's namespace may still take; nullopt: no quota.
  std::optional<MilliGpu> QuotaLeft(int model_id) const;
  // The pod's shape (see PodShapeTag).
  int shape_tag() const { return shape_tag_; }
  // A hash of everything a node's evaluation depends on besides the node: equal for pods that every node
  // would answer alike (see EvaluationCache).
  uint64_t fingerprint() const { return fingerprint_; }

 private:
  const PodRequest* request_;
  std::vector<std::optional<MilliGpu>> quota_left_;  // by model id
  std::vector<VGpuDemand> vgpus_;
  std::vector<size_t> starts_;
  std::vector<char> allowed_models_;  // by model id; empty: all allowed
  int exclusive_ = 0;
  int max_container_vgpus_ = 0;
  MilliGpu min_cores_{0};
  int shape_tag_ = kNoGpuShape;
  uint64_t fingerprint_ = 0;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_PLACEMENT_COMPILED_REQUEST_H_
