#include "node/gpu_split.h"

#include <vector>

#include "core/strings.h"
#include "core/topology.h"

namespace tessera::node {

HealthRoute GpuSplit::RouteHealth(const core::GpuUuid& gpu, bool healthy) const {
  return HealthRoute{.dra = has_dra(), .device_plugin = !healthy || !dra_uuids.contains(gpu.value())};
}

absl::StatusOr<GpuSplit> SplitGpus(const formats::GpuInventory& inventory, std::string_view dra_gpus) {
  GpuSplit split;
  if (dra_gpus == "all") {
    for (const formats::InventoryGpu& g : inventory.gpus) split.dra_indices.insert(g.info.index);
  } else if (!dra_gpus.empty()) {
    absl::StatusOr<std::vector<int>> list = core::ParseCpuList(dra_gpus);
    if (!list.ok()) {
      return absl::InvalidArgumentError(StrCat("--dra-gpus \"", dra_gpus, "\": ", Message(list.status()),
                                               "; give \"all\" or GPU indices such as 6,7 or 4-7"));
    }
    for (int i : *list) {
      if (i < 0 || static_cast<size_t>(i) >= inventory.gpus.size()) {
        return absl::InvalidArgumentError(
            StrCat("--dra-gpus names GPU ", i, "; this node has GPUs 0-", inventory.gpus.size() - 1));
      }
      split.dra_indices.insert(i);
    }
  }
  for (int i : split.dra_indices)
    split.dra_uuids.insert(inventory.gpus[static_cast<size_t>(i)].info.uuid.value());
  split.device_plugin_inventory = inventory;
  for (formats::InventoryGpu& g : split.device_plugin_inventory.gpus) {
    if (!split.dra_indices.contains(g.info.index)) continue;
    g.info.health = core::GpuHealth::kUnhealthy;
    g.health_reason = formats::kDraHealthReason;
  }
  return split;
}

}  // namespace tessera::node
