// The node's GPU inventory as the node agent publishes it on its Node object, and the agent's heartbeat.
//
// tessera-node writes two annotations on its Node (docs/file-formats.md, "GPU inventory annotation"):
//   tessera.dev/gpu-inventory  versioned JSON: every GPU (UUID, index, model, memory, NUMA node, health, PCI bus,
//                              nearest CPUs) and the pairwise link-level matrix
//   tessera.dev/heartbeat      RFC 3339 UTC time of the agent's last refresh
// tessera-scheduler parses them back into core::NodeInfo. Writer and reader live here so that they cannot drift.
//
//   GpuInventory inv = ...;                              // from src/gpu (NVML or a fake-GPU file)
//   std::string json = SerializeGpuInventory(inv);       // the annotation's value
//   absl::StatusOr<GpuInventory> back = ParseGpuInventory(json);
//   core::NodeInfo node; node.name = core::NodeName("gpu-1");
//   back->ApplyTo(&node);                                 // gpus, links, numa_cpus
//   std::string hb = FormatHeartbeat(std::chrono::system_clock::now());   // "2026-11-22T08:14:03.120Z"
//
// Parsing is strict about what it reads (types, ranges, required fields, matrix size, the version) and says
// what is wrong and what to do; fields it does not know are ignored, so that an agent may add optional fields
// without breaking older schedulers (a change that older readers would misread bumps the version instead).
//
// Thread-safety: plain values and pure functions.
#ifndef TESSERA_FORMATS_INVENTORY_H_
#define TESSERA_FORMATS_INVENTORY_H_

#include <chrono>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/cluster_types.h"
#include "core/topology.h"

namespace tessera::formats {

inline constexpr char kGpuInventoryAnnotation[] = "tessera.dev/gpu-inventory";
inline constexpr char kHeartbeatAnnotation[] = "tessera.dev/heartbeat";
// The version this build writes and the only one it reads.
inline constexpr int kGpuInventoryVersion = 1;
// The health reason of a GPU the node agent gave to its DRA driver (tessera-node --dra-gpus): unhealthy to
// the device-plugin path, which then never offers it. Every other GPU of an inventory is the device plugin's.
inline constexpr char kDraHealthReason[] = "given to DRA (gpu.tessera.dev)";

// One GPU of the node.
struct InventoryGpu {
  core::GpuInfo info;         // uuid, index (NVML order, 0..n-1), model, memory, numa_node (-1: unknown), health
  std::string health_reason;  // why the GPU is unhealthy (e.g. "XID 79"); empty when healthy
  std::string pci_bus_id;     // "0000:3b:00.0" (lower case, 4-digit domain); empty when unknown
  std::string cpus;           // the CPUs nearest the GPU as a Linux CPU list ("0-15,32-47"); empty when unknown

  bool operator==(const InventoryGpu&) const = default;
};

// Every GPU of one node and how they are connected.
struct GpuInventory {
  std::vector<InventoryGpu> gpus;  // gpus[i].info.index == i
  core::LinkMatrix links;          // gpus.size() x gpus.size()
  std::string source;              // where it was read: "nvml", or "fake:<file>"
  std::string driver_version;      // NVIDIA driver version; empty for fake GPUs

  // NUMA node -> the CPUs nearest the GPUs of that node (from the first GPU of each NUMA node with a CPU list).
  std::map<int, std::string> NumaCpus() const;
  // Writes gpus, links and numa_cpus into `node`; leaves name, cpu, memory and schedulable as they are.
  void ApplyTo(core::NodeInfo* node) const;
  // Checks what the parser checks (indices, unique UUIDs, memory, matrix size, CPU lists).
  absl::Status Validate() const;

  bool operator==(const GpuInventory&) const = default;
};

// The annotation's JSON (compact, one line). The inventory should be valid (see Validate).
std::string SerializeGpuInventory(const GpuInventory& inventory);

// Parses the annotation's JSON. Errors start with "tessera.dev/gpu-inventory:" and say what to fix.
absl::StatusOr<GpuInventory> ParseGpuInventory(std::string_view json);

// RFC 3339 in UTC with milliseconds: "2026-11-22T08:14:03.120Z".
std::string FormatHeartbeat(std::chrono::system_clock::time_point t);
// Accepts RFC 3339 ("Z" or a "+hh:mm"/"-hh:mm" offset; fractions of a second to nanoseconds).
absl::StatusOr<std::chrono::system_clock::time_point> ParseHeartbeat(std::string_view text);

}  // namespace tessera::formats

#endif  // TESSERA_FORMATS_INVENTORY_H_
