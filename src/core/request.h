// What a pod asks for, once parsed and validated (docs/requests.md), and what it was given.
//
// A container's demand is a list of vGPUs; each vGPU is a share of a distinct physical GPU:
//   tessera.dev/gpu: 2, gpu-cores: 30, gpu-memory: 4096   ->  [{300, 4096 MiB}, {300, 4096 MiB}]
//   tessera.dev/gpu-cores: 250 (no tessera.dev/gpu)       ->  [{1000}, {1000}, {500}]   ("2.5 GPUs")
//   aliyun.com/gpu-mem: 8 (GiB, gpushare)                 ->  [{cores from memory, 8192 MiB}]
//
// Thread-safety: plain values.
#ifndef TESSERA_CORE_REQUEST_H_
#define TESSERA_CORE_REQUEST_H_

#include <string>
#include <vector>

#include "core/cluster_types.h"
#include "core/ids.h"
#include "core/units.h"

namespace tessera::core {

// The memory of one vGPU.
struct MemorySpec {
  enum class Kind {
    kDefault,  // not given: proportional to the cores share (or the whole GPU, by PlacementOptions)
    kMiB,      // value in MiB
    kPercent,  // value in percent of the GPU's memory, 1..100
  };
  Kind kind = Kind::kDefault;
  int64_t value = 0;

  bool operator==(const MemorySpec&) const = default;
};

// One vGPU: a share of one physical GPU.
struct VGpuDemand {
  // Compute share, 1..1000; 1000 is the whole GPU, exclusively. 0 means "proportional to the memory asked
  // for" (requests that name only memory, as gpushare's do).
  MilliGpu cores{0};
  MemorySpec memory;

  bool exclusive() const { return cores == kWholeGpu; }
  bool operator==(const VGpuDemand&) const = default;
};

struct ContainerRequest {
  std::string name;
  std::vector<VGpuDemand> vgpus;  // empty: the container uses no GPU

  bool operator==(const ContainerRequest&) const = default;
};

struct PodRequest {
  Namespace ns;
  std::string name;
  PodUid uid;
  std::vector<ContainerRequest> containers;  // only the containers that use GPUs

  // Constraints (pod annotations). Empty include lists mean "any".
  std::vector<std::string> model_include;
  std::vector<std::string> model_exclude;
  // HAMi's use-gputype / nouse-gputype: a model matches when it contains the word, in any case ("A100" matches
  // "NVIDIA A100-SXM4-80GB"). Tessera's own annotations match the model name exactly.
  bool model_include_substring = false;
  bool model_exclude_substring = false;
  std::vector<GpuUuid> uuid_include;
  std::vector<GpuUuid> uuid_exclude;
  Priority priority = Priority::kLow;
  ComputePolicy compute_policy = ComputePolicy::kHard;
  bool numa_bind = false;

  // Host resources the pod asks for (sum of its containers' requests); 0 means not accounted.
  MilliCpu cpu{0};
  MiB memory{0};

  bool wants_gpu() const { return !containers.empty(); }
  // Total compute asked for, in thousandths of a GPU (a pod of 2 x 30% asks 600). Shares proportional to
  // memory count as 0 here: they are known only on a given GPU.
  MilliGpu TotalCores() const;
  // Number of vGPUs over all containers.
  int VGpuCount() const;
  // "ns/name".
  std::string FullName() const;

  bool operator==(const PodRequest&) const = default;
};

// A pod's shape, as GPU clustering groups pods: 0 for one share of a GPU, k for k whole GPUs, 1000 + n for
// anything else with n vGPUs (several shares, or whole GPUs and a share), kNoGpuShape for a pod without GPU.
inline constexpr int kNoGpuShape = -1;
int PodShapeTag(const PodRequest& request);

// One vGPU as given: which GPU, what share, what memory limit.
struct VGpuAssignment {
  int gpu_index = -1;
  GpuUuid uuid;
  MilliGpu cores{0};
  MiB memory{0};  // the container's memory limit on this GPU
  // The share asked for, when a high-priority pod compressed this one below it (SharedGPU); 0 otherwise. Kept
  // so that the share can be given back, also after the placement was read back from the API.
  MilliGpu requested{0};

  MilliGpu requested_or_cores() const { return requested > cores ? requested : cores; }
  bool operator==(const VGpuAssignment&) const = default;
};

struct ContainerAssignment {
  std::string name;
  std::vector<VGpuAssignment> vgpus;
  int numa_node = -1;  // set when NUMA binding was asked for
  std::string cpus;    // the CPUs nearest the GPUs (NUMA binding), a CPU list

  bool operator==(const ContainerAssignment&) const = default;
};

// A low-priority tenant whose share is cut to make room for a high-priority pod (SharedGPU equations 1-2).
struct Compression {
  TenantId tenant;
  int gpu_index = -1;
  MilliGpu old_cores{0};
  MilliGpu new_cores{0};

  bool operator==(const Compression&) const = default;
};

// A placement decision for one pod on one node.
struct Placement {
  NodeName node;
  std::vector<ContainerAssignment> containers;
  std::vector<Compression> compressions;
  double score = 0;  // the policy's score of this node; higher is better

  bool operator==(const Placement&) const = default;
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_REQUEST_H_
