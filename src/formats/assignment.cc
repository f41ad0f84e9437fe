#include "formats/assignment.h"

#include <cmath>
#include <optional>
#include <set>

#include "core/gpu_mask.h"
#include "core/strings.h"
#include "formats/bounded_json.h"
#include "formats/vgpu_json.h"
#include "nlohmann/json.hpp"

namespace tessera::formats {

namespace {

using nlohmann::json;

constexpr int64_t kMaxNumaNode = 1023;
constexpr int64_t kMaxMemoryMiB = int64_t{1}
                                  << 40;  // 1 EiB: more than any GPU, small enough to count in bytes

absl::Status Bad(std::string_view what) {
  return absl::InvalidArgumentError(StrCat("annotation ", kAnnotationAssignment, ": ", what));
}

// A share of a vGPU: `milli_key` (thousandths of a GPU, the ledger's unit: what counts) and/or `percent_key`
// (percent with up to one decimal, as version 1 was first written). When both are given they must be the same
// share; a reader never picks one of two disagreeing values. 0 when neither is given and !required.
absl::StatusOr<core::MilliGpu> Share(const json& v, const char* percent_key, const char* milli_key,
                                     const std::string& at, bool required) {
  std::optional<int64_t> milli;
  auto m = v.find(milli_key);
  if (m != v.end()) {
    milli = JsonIntIn(*m, 1, core::kWholeGpu.value());
    if (!milli) {
      return Bad(StrCat(at, ".", milli_key, " is ", m->dump(), "; a share is 1-1000 thousandths of one GPU"));
    }
  }
  auto p = v.find(percent_key);
  if (p == v.end()) {
    if (milli) return core::MilliGpu(static_cast<int32_t>(*milli));
    if (required) return Bad(StrCat(at, " has no numeric \"", percent_key, "\""));
    return core::MilliGpu(0);
  }
  if (!p->is_number()) return Bad(StrCat(at, " has no numeric \"", percent_key, "\""));
  const double percent = p->get<double>();
  if (!(percent > 0 && percent <= 100)) {
    return Bad(StrCat(at, ".", percent_key, " is ", p->dump(), "; a share is 0-100 percent of one GPU"));
  }
  const int64_t from_percent = std::llround(percent * 10);
  if (from_percent < 1) {
    return Bad(
        StrCat(at, ".", percent_key, " is ", p->dump(), "; the smallest share is 0.1 percent of one GPU"));
  }
  if (milli && *milli != from_percent) {
    return Bad(
        StrCat(at, ".", percent_key, " (", p->dump(), ") and ", milli_key, " (", *milli,
               ") are not the same share; the annotation is written by tessera-scheduler, do not edit it"));
  }
  return core::MilliGpu(static_cast<int32_t>(from_percent));
}

}  // namespace

std::string FormatAssignment(const core::Placement& placement) {
  json containers = json::array();
  for (const core::ContainerAssignment& c : placement.containers) {
    json vgpus = json::array();
    for (const core::VGpuAssignment& v : c.vgpus) vgpus.push_back(VGpuJson(v, VGpuFormat::kAssignment));
    json container = {{"name", c.name}, {"vgpus", std::move(vgpus)}};
    if (c.numa_node >= 0) container["numaNode"] = c.numa_node;
    if (!c.cpus.empty()) container["cpus"] = c.cpus;
    containers.push_back(std::move(container));
  }
  const json doc = {{"version", kAssignmentVersion},
                    {"node", placement.node.value()},
                    {"containers", std::move(containers)}};
  return doc.dump();
}

absl::StatusOr<Assignment> ParseAssignment(std::string_view text) {
  absl::StatusOr<json> parsed = ParseBoundedJson(text, "the value");
  if (!parsed.ok()) {
    return Bad(StrCat("cannot be read (", Message(parsed.status()),
                      "); it is written by tessera-scheduler, do not edit it"));
  }
  const json doc = *std::move(parsed);
  if (!doc.is_object()) return Bad("must be a JSON object");
  auto version = doc.find("version");
  if (version == doc.end() || !version->is_number_integer()) return Bad("has no integer \"version\"");
  if (JsonIntIn(*version, kAssignmentVersion, kAssignmentVersion) == std::nullopt) {
    return Bad(StrCat("has version ", version->dump(), "; this build reads version ", kAssignmentVersion,
                      " (upgrade tessera-node and tessera-scheduler together)"));
  }
  Assignment out;
  auto node = doc.find("node");
  if (node == doc.end() || !node->is_string() || node->get<std::string>().empty()) {
    return Bad("has no \"node\"");
  }
  out.node = core::NodeName(node->get<std::string>());
  auto containers = doc.find("containers");
  if (containers == doc.end() || !containers->is_array()) return Bad("has no \"containers\" list");
  std::set<std::string> names;
  for (size_t i = 0; i < containers->size(); ++i) {
    const json& c = (*containers)[i];
    const std::string where = StrCat("containers[", i, "]");
    if (!c.is_object()) return Bad(StrCat(where, " is not an object"));
    core::ContainerAssignment a;
    auto name = c.find("name");
    if (name == c.end() || !name->is_string() || name->get<std::string>().empty()) {
      return Bad(StrCat(where, " has no \"name\""));
    }
    a.name = name->get<std::string>();
    if (!names.insert(a.name).second) return Bad(StrCat("container \"", a.name, "\" appears twice"));
    if (auto numa = c.find("numaNode"); numa != c.end()) {
      const std::optional<int64_t> n = JsonIntIn(*numa, 0, kMaxNumaNode);
      if (!n) return Bad(StrCat(where, ".numaNode must be a NUMA node number (0 to ", kMaxNumaNode, ")"));
      a.numa_node = static_cast<int>(*n);
    }
    if (auto cpus = c.find("cpus"); cpus != c.end()) {
      if (!cpus->is_string()) return Bad(StrCat(where, ".cpus must be a CPU list such as \"0-15\""));
      a.cpus = cpus->get<std::string>();
    }
    auto vgpus = c.find("vgpus");
    if (vgpus == c.end() || !vgpus->is_array()) return Bad(StrCat(where, " has no \"vgpus\" list"));
    std::set<std::string> uuids;
    for (size_t k = 0; k < vgpus->size(); ++k) {
      const json& v = (*vgpus)[k];
      const std::string at = StrCat(where, ".vgpus[", k, "]");
      if (!v.is_object()) return Bad(StrCat(at, " is not an object"));
      core::VGpuAssignment g;
      auto uuid = v.find(kVGpuUuid);
      if (uuid == v.end() || !uuid->is_string() || uuid->get<std::string>().empty()) {
        return Bad(StrCat(at, " has no \"uuid\""));
      }
      g.uuid = core::GpuUuid(uuid->get<std::string>());
      if (!uuids.insert(g.uuid.value()).second) {
        return Bad(StrCat(at, ": GPU ", g.uuid.value(), " appears twice in one container"));
      }
      auto index = v.find(kVGpuIndex);
      if (index != v.end()) {
        const std::optional<int64_t> n = JsonIntIn(*index, 0, core::kMaxGpusPerNode - 1);
        if (!n) return Bad(StrCat(at, ".index must be a GPU index, 0 to ", core::kMaxGpusPerNode - 1));
        g.gpu_index = static_cast<int>(*n);
      }
      absl::StatusOr<core::MilliGpu> cores = Share(v, kVGpuCores, kVGpuMilliCores, at, /*required=*/true);
      if (!cores.ok()) return cores.status();
      g.cores = *cores;
      absl::StatusOr<core::MilliGpu> requested =
          Share(v, kVGpuRequestedCores, kVGpuRequestedMilliCores, at, /*required=*/false);
      if (!requested.ok()) return requested.status();
      if (requested->value() != 0) {
        if (*requested < g.cores) {
          return Bad(StrCat(at, ".requestedCores must be a share between cores and 100 percent"));
        }
        g.requested = *requested;
      }
      auto memory = v.find(kVGpuMemoryMiB);
      const std::optional<int64_t> mib =
          memory == v.end() ? std::nullopt : JsonIntIn(*memory, 0, kMaxMemoryMiB);
      if (!mib) return Bad(StrCat(at, " has no \"memoryMiB\" (a whole number of MiB, at most 2^40)"));
      g.memory = core::MiB(*mib);
      a.vgpus.push_back(std::move(g));
    }
    out.containers.push_back(std::move(a));
  }
  return out;
}

core::Placement ToPlacement(const Assignment& assignment) {
  core::Placement p;
  p.node = assignment.node;
  p.containers = assignment.containers;
  return p;
}

}  // namespace tessera::formats
