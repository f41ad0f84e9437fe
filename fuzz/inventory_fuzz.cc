// The tessera.dev/gpu-inventory and tessera.dev/heartbeat annotations (anyone with patch rights on Nodes
// writes them; a bad one used to abort tessera-scheduler at every start). What parses must round-trip.
#include "formats/inventory.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = tessera::fuzz::Text(data, size);
  (void)tessera::formats::ParseHeartbeat(text);
  absl::StatusOr<tessera::formats::GpuInventory> inv = tessera::formats::ParseGpuInventory(text);
  if (!inv.ok()) return 0;
  absl::StatusOr<tessera::formats::GpuInventory> again =
      tessera::formats::ParseGpuInventory(tessera::formats::SerializeGpuInventory(*inv));
  if (!again.ok() || !(*again == *inv)) __builtin_trap();
  tessera::core::NodeInfo node;
  inv->ApplyTo(&node);
  return 0;
}
