// Which of a node's GPUs go to the DRA driver gpu.tessera.dev and which stay on the device-plugin path
// (tessera-node --dra-gpus), and where a GPU's health change goes (docs/dra.md, "One node, two paths").
//
// GPUs given to DRA leave the device-plugin path: the inventory the extender reads and the device plugin's
// slots show them unhealthy for that reason (formats::kDraHealthReason), so nothing but a ResourceClaim can get them.
// A health change goes to the DRA driver (when there is one) for every GPU, and to the device plugin and the
// agent for the device-plugin GPUs, and for a DRA GPU only when it fails (a healthy DRA GPU stays out).
//
//   absl::StatusOr<GpuSplit> split = SplitGpus(inventory, "6,7");
//   NodeAgent agent(config, api, split->device_plugin_inventory, pod_resources);
//   HealthRoute route = split->RouteHealth(uuid, /*healthy=*/false);   // both .dra and .device_plugin
//
// Thread-safety: a GpuSplit is a value; its const methods may be called from any thread.
#ifndef TESSERA_NODE_GPU_SPLIT_H_
#define TESSERA_NODE_GPU_SPLIT_H_

#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/ids.h"
#include "formats/inventory.h"

namespace tessera::node {

// Where one health change goes.
struct HealthRoute {
  bool dra = false;            // the DRA driver (its ResourceSlices' devices)
  bool device_plugin = false;  // the device plugin's slots and the agent's inventory (the extender's view)
};

struct GpuSplit {
  std::set<int> dra_indices;                      // the inventory's GPU indices given to DRA
  std::set<std::string> dra_uuids;                // their UUIDs (NodeAgentConfig::dra_gpu_uuids)
  formats::GpuInventory device_plugin_inventory;  // every GPU; those given to DRA unhealthy, kDraHealthReason

  bool has_dra() const { return !dra_indices.empty(); }
  HealthRoute RouteHealth(const core::GpuUuid& gpu, bool healthy) const;
};

// `dra_gpus` as tessera-node's --dra-gpus takes it: "" (none), "all", or GPU indices ("6,7", "4-7").
// InvalidArgument, saying what to give, for a list that does not parse or names a GPU the node lacks.
absl::StatusOr<GpuSplit> SplitGpus(const formats::GpuInventory& inventory, std::string_view dra_gpus);

}  // namespace tessera::node

#endif  // TESSERA_NODE_GPU_SPLIT_H_
