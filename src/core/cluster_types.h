// The static description of nodes and GPUs, and the tenants that hold shares of them.
//
//   NodeInfo node;
//   node.name = NodeName("gpu-a");
//   node.gpus.push_back({GpuUuid("GPU-0"), 0, "A100-SXM4-80GB", MiB(81920), /*numa_node=*/0});
//   node.links = LinkMatrix(1);
//
// Thread-safety: plain values.
#ifndef TESSERA_CORE_CLUSTER_TYPES_H_
#define TESSERA_CORE_CLUSTER_TYPES_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ids.h"
#include "core/topology.h"
#include "core/units.h"

namespace tessera::core {

enum class GpuHealth { kHealthy, kUnhealthy };

struct GpuInfo {
  GpuUuid uuid;
  int index = 0;       // the NVML index on its node, 0..n-1
  std::string model;   // e.g. "A100-SXM4-80GB", "T4"; compared exactly (HAMi's use-gputype: by substring)
  MiB memory{0};       // total device memory
  int numa_node = -1;  // -1 when unknown
  GpuHealth health = GpuHealth::kHealthy;

  bool operator==(const GpuInfo&) const = default;
};

struct NodeInfo {
  NodeName name;
  std::vector<GpuInfo> gpus;             // gpus[i].index == i
  LinkMatrix links;                      // gpus.size() x gpus.size(); empty means every pair SYS
  MilliCpu cpu{0};                       // allocatable CPU; 0 means not accounted
  MiB memory{0};                         // allocatable host memory; 0 means not accounted
  std::map<int, std::string> numa_cpus;  // NUMA node -> CPU list ("0-15,32-47"), for GPU-CPU binding
  bool schedulable = true;               // false: no new pods (cordoned, or the agent's heartbeat is stale)

  bool operator==(const NodeInfo&) const = default;
};

// SharedGPU's two priority classes.
enum class Priority { kLow, kHigh };

// GaiaGPU's compute limits: hard holds the share; elastic may use idle compute up to a ceiling.
enum class ComputePolicy { kHard, kElastic };

const char* ToString(Priority p);
const char* ToString(ComputePolicy p);
const char* ToString(GpuHealth h);
// The inverses of ToString: exactly "low" or "high", "hard" or "elastic"; nullopt for anything else.
std::optional<Priority> PriorityFromString(std::string_view s);
std::optional<ComputePolicy> ComputePolicyFromString(std::string_view s);

// A container holding a share of one GPU.
struct Tenant {
  TenantId id;
  Namespace ns;
  Priority priority = Priority::kLow;
  MilliGpu requested{0};  // the share it asked for
  MilliGpu cores{0};    // the share it holds now (below `requested` while compressed for a high-priority pod)
  MiB memory{0};        // memory accounted on the GPU (the whole GPU for an exclusive tenant)
  MiB memory_limit{0};  // memory limit handed to the container

  bool operator==(const Tenant&) const = default;
};

// A namespace's quota of a GPU model and what it holds of it, in thousandths of a GPU (Gaia's heterogeneous
// cluster quota; Cluster::QuotaStandings).
struct QuotaStanding {
  Namespace ns;
  std::string model;
  std::optional<MilliGpu> limit = std::nullopt;  // none: no quota
  int64_t held_here = 0;                         // by the cluster's own pods
  int64_t held_elsewhere = 0;  // by what the cluster does not place (Cluster::SetQuotaHeldElsewhere)
};

}  // namespace tessera::core

#endif  // TESSERA_CORE_CLUSTER_TYPES_H_
