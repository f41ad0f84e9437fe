// Reads what a pod asks for from its containers' resources and its annotations (docs/requests.md), in
// Tessera's own names and in those of the systems users migrate from:
//
//   tessera.dev/gpu, gpu-cores, gpu-memory, gpu-memory-percentage          (Tessera)
//   nvidia.com/gpu, gpucores, gpumem, gpumem-percentage                    (HAMi, and the NVIDIA plugin)
//   tencent.com/vcuda-core, vcuda-memory (x 256 MiB)                       (tkestack gpu-manager)
//   aliyun.com/gpu-mem (GiB by default)                                    (Aliyun gpushare)
//   volcano.sh/vgpu-number, vgpu-cores, vgpu-memory, vgpu-memory-percentage (Volcano)
//
// Every refusal says what is wrong and what to write instead.
//
//   PodSpec pod;                                  // filled from the API object by the caller
//   absl::StatusOr<PodRequest> req = ParsePodRequest(pod);
//   if (!req.ok()) reject(req.status().message());
//
// Thread-safety: pure functions.
#ifndef TESSERA_CORE_REQUEST_PARSER_H_
#define TESSERA_CORE_REQUEST_PARSER_H_

#include <map>
#include <optional>
#include <string_view>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/request.h"

namespace tessera::core {

// Resource name -> quantity text, as in a container's resources.limits.
using ResourceList = std::map<std::string, std::string>;

struct ContainerSpec {
  std::string name;
  ResourceList limits;
  ResourceList requests;
  bool privileged = false;
};

// The parts of a Kubernetes pod that placement reads.
struct PodSpec {
  std::string ns = "default";
  std::string name;
  std::string uid;
  std::map<std::string, std::string> annotations;
  std::vector<ContainerSpec> containers;
  std::vector<ContainerSpec> init_containers;
};

struct ParseOptions {
  // The unit of aliyun.com/gpu-mem: gpushare's device plugin counts GiB unless started with
  // --memory-unit=MiB.
  MiB gpushare_memory_unit{1024};
};

// Resource names and annotation keys (docs/requests.md).
inline constexpr char kResourceGpu[] = "tessera.dev/gpu";
inline constexpr char kResourceCores[] = "tessera.dev/gpu-cores";
inline constexpr char kResourceMemory[] = "tessera.dev/gpu-memory";
inline constexpr char kResourceMemoryPercent[] = "tessera.dev/gpu-memory-percentage";
inline constexpr char kAnnotationModel[] = "tessera.dev/gpu-model";
inline constexpr char kAnnotationModelExclude[] = "tessera.dev/gpu-model-exclude";
inline constexpr char kAnnotationUuid[] = "tessera.dev/gpu-uuid";
inline constexpr char kAnnotationUuidExclude[] = "tessera.dev/gpu-uuid-exclude";
inline constexpr char kAnnotationPriority[] = "tessera.dev/priority";
inline constexpr char kAnnotationComputePolicy[] = "tessera.dev/compute-policy";
inline constexpr char kAnnotationNumaBind[] = "tessera.dev/numa-bind";
// Written by the admission webhook, not by users: the containers (comma separated) whose tessera.dev/gpu the
// webhook added. Their tessera.dev/gpu is the number of vGPUs the rest of the request expands to (so that the
// kubelet calls the device plugin's Allocate for them, docs/requests.md) and is read as such, not as a count
// the cores are multiplied by: "gpu-cores: 250" stays 2.5 GPUs with tessera.dev/gpu: 3 added.
inline constexpr char kAnnotationGpuAdded[] = "tessera.dev/gpu-added";

// The values of tessera.dev/priority and tessera.dev/compute-policy as users write them: any case, blanks
// around. nullopt when the value is neither word. The scheduler and the node agent read them through these.
std::optional<Priority> PriorityAnnotation(std::string_view value);
std::optional<ComputePolicy> ComputePolicyAnnotation(std::string_view value);

// Parses and validates a pod's GPU request. A pod that asks for no GPU parses to a request with no
// containers.
absl::StatusOr<PodRequest> ParsePodRequest(const PodSpec& pod, const ParseOptions& options = {});

// The number of vGPUs a container's GPU resources (in Tessera's names, as after TranslateToTessera) expand to,
// when they do not state tessera.dev/gpu themselves: the value the admission webhook adds. nullopt when the
// container asks for no GPU or already states tessera.dev/gpu; an error when the request is invalid.
absl::StatusOr<std::optional<int64_t>> ImpliedGpuCount(const ResourceList& limits, const ParseOptions& options = {});

// The system whose resource names a container uses.
enum class ResourceFamily { kNone, kTessera, kHami, kGpuManager, kGpushare, kVolcano };
const char* ToString(ResourceFamily f);

// Rewrites a container's GPU resources written for another system into Tessera's names, with the same meaning
// (what the mutating admission webhook patches in). Other resources are kept. Returns nullopt when the
// container already uses Tessera's names or no GPU at all.
absl::StatusOr<std::optional<ResourceList>> TranslateToTessera(const ResourceList& resources,
                                                               const ParseOptions& options = {});

}  // namespace tessera::core

#endif  // TESSERA_CORE_REQUEST_PARSER_H_
