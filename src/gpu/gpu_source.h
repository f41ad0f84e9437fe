// Where tessera-node learns about its GPUs: NVML on a real node, or a fake-GPU file (tests, demos, clusters
// without GPUs). Both give the same inventory type that the node annotation carries (formats/inventory.h) and
// report health changes the same way.
//
//   GpuSourceOptions o;
//   o.fake_gpus_file = flags.fake_gpus;                 // empty: NVML
//   absl::StatusOr<std::unique_ptr<GpuSource>> src = OpenGpuSource(o);
//   absl::StatusOr<formats::GpuInventory> inv = (*src)->Read();
//   HealthMonitor monitor(src->get(), *inv, [&](const HealthUpdate& u) { plugin.SetGpuHealth(u.uuid, ...); });
//
// Thread-safety: Read() may be called from any thread, also while another thread is in WaitForHealthEvents();
// WaitForHealthEvents() itself is for one thread at a time (the HealthMonitor's).
#ifndef TESSERA_GPU_GPU_SOURCE_H_
#define TESSERA_GPU_GPU_SOURCE_H_

#include <chrono>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "core/cluster_types.h"
#include "core/ids.h"
#include "formats/inventory.h"

namespace tessera::gpu {

// The health of one GPU as a source observed it.
struct HealthUpdate {
  core::GpuUuid uuid;
  core::GpuHealth health = core::GpuHealth::kHealthy;
  std::string reason;  // why it is unhealthy: "XID 79", "NVML_ERROR_GPU_IS_LOST (15)", "fake-GPU file"

  bool operator==(const HealthUpdate&) const = default;
};

class GpuSource {
 public:
  virtual ~GpuSource() = default;

  // "nvml" or "fake:<file>".
  virtual std::string Name() const = 0;

  // Reads every GPU (index order), the link-level matrix and each GPU's health now.
  virtual absl::StatusOr<formats::GpuInventory> Read() = 0;

  // Blocks until something may have changed a GPU's health or `timeout` passed, and returns what it observed:
  // health states of GPUs (possibly unchanged ones; possibly none). The HealthMonitor keeps only changes.
  virtual absl::StatusOr<std::vector<HealthUpdate>> WaitForHealthEvents(std::chrono::milliseconds timeout) = 0;
};

// XIDs that are the application's fault, not the GPU's; NVIDIA's device plugin skips the same ones:
// 13 (graphics engine exception), 31 (GPU memory page fault), 43 (GPU stopped processing), 45 (preemptive
// cleanup), 68 (video processor exception), 109 (context switch timeout).
const std::set<unsigned long long>& DefaultIgnoredXids();

struct GpuSourceOptions {
  // A fake-GPU file (YAML or JSON, docs/node-agent.md); empty: use NVML.
  std::string fake_gpus_file;
  // The node's name; fake GPUs without a UUID are named GPU-<node>-<index> (GPU-fake-<index> without it).
  std::string node_name;
  // NVML: the library to dlopen, the sysfs root for NUMA nodes and nearest CPUs (tests point it elsewhere).
  std::string nvml_library = "libnvidia-ml.so.1";
  std::string sysfs_root = "/sys";
  // NVML: XIDs that do not mark a GPU unhealthy, and how often every GPU is queried to see that it still
  // answers (a GPU that has fallen off the bus answers NVML_ERROR_GPU_IS_LOST).
  std::set<unsigned long long> ignored_xids = DefaultIgnoredXids();
  std::chrono::milliseconds check_interval{10000};
  // Time of those checks; never null (common/clock.h).
  const Clock* clock = &RealClock();
};

// NVML when fake_gpus_file is empty, else the fake-GPU file. Errors say what to do (e.g. no NVML here:
// install the driver or use --fake-gpus).
absl::StatusOr<std::unique_ptr<GpuSource>> OpenGpuSource(const GpuSourceOptions& options);

// NVML's model names without the vendor prefixes, spaces as dashes: "NVIDIA A100-SXM4-80GB" -> "A100-SXM4-80GB",
// "Tesla T4" -> "T4", "NVIDIA GeForce RTX 3090" -> "GeForce-RTX-3090". These are the names pods write in
// tessera.dev/gpu-model.
std::string NormalizeModelName(std::string_view nvml_name);

// "00000000:3B:00.0" (NVML) -> "0000:3b:00.0" (sysfs): lower case, 4-digit domain when the domain fits.
std::string NormalizePciBusId(std::string_view bus_id);

}  // namespace tessera::gpu

#endif  // TESSERA_GPU_GPU_SOURCE_H_
