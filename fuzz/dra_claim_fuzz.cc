// A ResourceClaim as the DRA driver reads it when the kubelet prepares it (node/dra_claim.h). The claim's spec,
// including the opaque parameters copied into its allocation, is written by whoever may create claims; its
// allocation by kube-scheduler. Whatever the JSON: an error or a record the agent can write, never a crash, and
// every share within the GPU.
#include <nlohmann/json.hpp>

#include "fuzz_util.h"
#include "node/dra_claim.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json claim = nlohmann::json::parse(tessera::fuzz::Text(data, size), nullptr, /*allow_exceptions=*/false);
  if (claim.is_discarded()) return 0;
  static const tessera::formats::GpuInventory inventory = [] {
    tessera::formats::GpuInventory inv;
    for (int i = 0; i < 4; ++i) {
      tessera::formats::InventoryGpu g;
      g.info.uuid = tessera::core::GpuUuid("GPU-" + std::to_string(i));
      g.info.index = i;
      g.info.model = "V100";
      g.info.memory = tessera::core::MiB(32768);
      g.info.numa_node = i / 2;
      g.cpus = i < 2 ? "0-7" : "8-15";
      inv.gpus.push_back(g);
    }
    inv.links = tessera::core::LinkMatrix(4, tessera::core::Link::Of(tessera::core::LinkKind::kSys));
    return inv;
  }();
  tessera::node::DraDriverConfig config;
  config.node_name = "gpu-1";
  config.gpus = {1, 2, 3};
  absl::StatusOr<tessera::node::ClaimOnNode> c = tessera::node::ReadClaim(claim, {"ns", "c1", "claim"}, config, inventory);
  if (!c.ok()) return 0;
  for (const tessera::core::VGpuAssignment& v : c->record.vgpus) {
    if (v.cores.value() < 10 || v.cores.value() > 1000 || v.memory.value() < 1 || v.memory.value() > 32768) __builtin_trap();
  }
  // What the agent saves must read back as it was (the record survives restarts).
  absl::StatusOr<tessera::node::ContainerRecord> again =
      tessera::node::ParseRecord(tessera::node::SerializeRecord(c->record));
  if (c->record.pod_uid.empty() || !tessera::node::SafePathName(c->record.pod_uid)) return 0;  // PrepareClaim refuses
  c->record.container = "claim_c1";
  again = tessera::node::ParseRecord(tessera::node::SerializeRecord(c->record));
  if (!again.ok() || !(*again == c->record)) __builtin_trap();
  return 0;
}
