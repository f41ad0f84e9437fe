// Reads what a pod asks for from its containers' resources and its annotations (docs/requests.md), in
// Tessera's own names and in those of the systems users migrate from:
//
//   tessera.dev/gpu, gpu-cores, gpu-memory, gpu-memory-percentage          (Tessera)
//   nvidia.com/gpu, gpucores, gpumem, gpumem-percentage, priority          (HAMi, and the NVIDIA plugin)
//   tencent.com/vcuda-core, vcuda-memory (x 256 MiB)                       (tkestack gpu-manager)
//   aliyun.com/gpu-mem (GiB by default), gpu-count                         (Aliyun gpushare)
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
  bool sidecar = false;  // an init container with restartPolicy: Always (it runs for the pod's life)
};

// The parts of a Kubernetes pod that placement reads.
struct PodSpec {
  std::string ns = "default";
  std::string name;
  std::string uid;
  std::map<std::string, std::string> annotations;
  std::map<std::string, std::string> labels;
  std::vector<ContainerSpec> containers;
  std::vector<ContainerSpec> init_containers;
};

// HAMi's resource names, which its chart lets operators rename (resourceName, resourceCores, resourceMem,
// resourceMemPercentage, resourcePriority): Tessera accepts the names the cluster used.
struct HamiNames {
  std::string gpu = "nvidia.com/gpu";
  std::string cores = "nvidia.com/gpucores";
  std::string memory = "nvidia.com/gpumem";
  std::string memory_percent = "nvidia.com/gpumem-percentage";
  std::string priority = "nvidia.com/priority";
};

// What a HAMi or Volcano request without a core limit (gpucores left out, or 0) means.
enum class NoCoreLimit {
  kElastic,       // HAMi's meaning kept: a share in proportion to memory, and idle compute up to the ceiling
  kProportional,  // Tessera's native rule: a hard share in proportion to memory
};

struct ParseOptions {
  // The unit of aliyun.com/gpu-mem: gpushare's device plugin counts GiB unless started with
  // --memory-unit=MiB.
  MiB gpushare_memory_unit{1024};
  HamiNames hami;
  NoCoreLimit hami_no_core_limit = NoCoreLimit::kElastic;
};

// Parses "gpu=NAME,cores=NAME,memory=NAME,memory-percentage=NAME,priority=NAME" (any subset) onto `names`:
// tessera-scheduler's --hami-resource-names.
absl::Status ParseHamiNames(std::string_view text, HamiNames* names);

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
// The same with the pod's aliyun.com/gpu-count label as GpushareCountLabel(pod) read it: the admission
// webhook reads it once, for the translation and for the check of the translated pod.
absl::StatusOr<PodRequest> ParsePodRequest(const PodSpec& pod, const ParseOptions& options,
                                           const absl::StatusOr<std::optional<int64_t>>& gpushare_count);

// The number of vGPUs a container's GPU resources (in Tessera's names, as after TranslateToTessera) expand to,
// when they do not state tessera.dev/gpu themselves: the value the admission webhook adds. nullopt when the
// container asks for no GPU or already states tessera.dev/gpu; an error when the request is invalid.
absl::StatusOr<std::optional<int64_t>> ImpliedGpuCount(const ResourceList& limits, const ParseOptions& options = {});

// Every resource name the parser reads as a GPU request (Tessera's, and the other systems' with HAMi's as
// `options` name them): the admission webhook's matchConditions list them (deploy/, checked against this).
std::vector<std::string> GpuResourceNames(const ParseOptions& options = {});

// The system whose resource names a container uses.
enum class ResourceFamily { kNone, kTessera, kHami, kGpuManager, kGpushare, kVolcano };
const char* ToString(ResourceFamily f);

// A container's GPU resources in Tessera's names, and what of the original request the resources cannot carry:
// the pod's annotations must (the webhook adds them).
struct Translation {
  ResourceList resources;
  // The system whose names the container used.
  ResourceFamily family = ResourceFamily::kNone;
  // HAMi or Volcano without a core limit, under NoCoreLimit::kElastic: the pod is elastic (gpu-manager's
  // share too, unless the pod has tencent.com/vcuda-core-limit: the admission webhook decides from the whole
  // pod, as ParsePodRequest does).
  bool elastic = false;
  // HAMi's task priority resource (0 high, anything else low), removed from the resources.
  std::optional<Priority> priority;
};

// Rewrites a container's GPU resources written for another system into Tessera's names, with the same meaning
// (what the mutating admission webhook patches in). Other resources are kept. Returns nullopt when the
// container already uses Tessera's names or no GPU at all. `gpushare_count` is the pod's aliyun.com/gpu-count
// label, when it has one (gpushare's memory is then split evenly over that many GPUs). Errors here and from
// ImpliedGpuCount do not name the container: the caller knows it.
absl::StatusOr<std::optional<Translation>> TranslateToTessera(const ResourceList& resources,
                                                              const ParseOptions& options = {},
                                                              std::optional<int64_t> gpushare_count = {});

// The pod's aliyun.com/gpu-count label (ACK: a gpushare pod's memory over that many GPUs); nullopt without it,
// an error when it is not a whole number from 1 to the most GPUs a node has.
absl::StatusOr<std::optional<int64_t>> GpushareCountLabel(const PodSpec& pod);

// HAMi annotations Tessera reads but cannot honour, or honours differently: one line each for the user (the
// admission webhook returns them as warnings). Empty when there is nothing to say.
std::vector<std::string> MigrationWarnings(const PodSpec& pod);

// Annotation keys read as Tessera's (HAMi's names for them).
inline constexpr char kHamiUseGpuType[] = "nvidia.com/use-gputype";
inline constexpr char kHamiNoUseGpuType[] = "nvidia.com/nouse-gputype";
inline constexpr char kHamiUseGpuUuid[] = "nvidia.com/use-gpuuuid";
inline constexpr char kHamiNoUseGpuUuid[] = "nvidia.com/nouse-gpuuuid";
inline constexpr char kHamiNumaBind[] = "nvidia.com/numa-bind";
inline constexpr char kGpushareCount[] = "aliyun.com/gpu-count";
// gpu-manager's hard limit on a share's utilization; without it the share may use idle compute.
inline constexpr char kGpuManagerCoreLimit[] = "tencent.com/vcuda-core-limit";

}  // namespace tessera::core

#endif  // TESSERA_CORE_REQUEST_PARSER_H_
