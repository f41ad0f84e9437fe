// GPUs read from NVML (nvml_library.h): count, index, UUID, model, memory, PCI bus, NUMA node and nearest CPUs
// (sysfs /sys/bus/pci/devices/<bus>/numa_node and local_cpulist, else nvmlDeviceGetCpuAffinity), the pairwise
// link levels (nvmlDeviceGetTopologyCommonAncestor for PCIe, NVLink counts from nvmlDeviceGetNvLinkState and
// nvmlDeviceGetNvLinkRemotePciInfo_v2 per link), and health.
//
// Link levels as nvidia-smi prints them: a pair joined by n active NVLinks (directly, or both through
// NVSwitches: then n is the smaller of the two GPUs' switch links) is NV<n>; otherwise the common PCIe
// ancestor: SINGLE -> PIX, MULTIPLE -> PXB, HOSTBRIDGE -> PHB, NODE -> NODE, SYSTEM -> SYS, INTERNAL (two GPUs
// on one board) -> PIX.
//
// Health: critical XID events (nvmlEventSetCreate, nvmlDeviceRegisterEvents with nvmlEventTypeXidCriticalError,
// nvmlEventSetWait_v2) mark a GPU unhealthy for the rest of the agent's life, except the XIDs in
// GpuSourceOptions::ignored_xids; an event not attributable to one device marks every GPU. Every
// check_interval each GPU is queried (nvmlDeviceGetMemoryInfo); a GPU that fails (e.g. GPU_IS_LOST) is
// unhealthy until it answers again.
//
//   absl::StatusOr<std::unique_ptr<NvmlGpuSource>> src = NvmlGpuSource::Open(options);
//
// Thread-safety: see GpuSource.
#ifndef TESSERA_GPU_NVML_SOURCE_H_
#define TESSERA_GPU_NVML_SOURCE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/mutex.h"
#include "gpu/gpu_source.h"
#include "gpu/nvml_library.h"

namespace tessera::gpu {

class NvmlGpuSource : public GpuSource {
 public:
  static absl::StatusOr<std::unique_ptr<NvmlGpuSource>> Open(const GpuSourceOptions& options);
  ~NvmlGpuSource() override;

  std::string Name() const override { return "nvml"; }
  absl::StatusOr<formats::GpuInventory> Read() override ABSL_LOCKS_EXCLUDED(mu_);
  // The NVML wait runs without the lock.
  absl::StatusOr<std::vector<HealthUpdate>> WaitForHealthEvents(std::chrono::milliseconds timeout) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Device {
    nvmlDevice_t handle = nullptr;
    core::GpuUuid uuid;
    bool xid_failed = false;    // sticky
    std::string xid_reason;
    bool check_failed = false;  // until the GPU answers again
    std::string check_reason;
  };

  NvmlGpuSource(std::unique_ptr<NvmlLibrary> nvml, GpuSourceOptions options)
      : nvml_(std::move(nvml)), options_(std::move(options)) {}
  absl::Status EnsureEventSet() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  HealthUpdate HealthOf(const Device& d) const;
  std::vector<HealthUpdate> RunChecks() ABSL_LOCKS_EXCLUDED(mu_);

  std::unique_ptr<NvmlLibrary> nvml_;
  const GpuSourceOptions options_;
  mutable Mutex mu_;                                      // the devices and the event set
  std::vector<Device> devices_ ABSL_GUARDED_BY(mu_);      // by index; filled by Read()
  nvmlEventSet_t events_ ABSL_GUARDED_BY(mu_) = nullptr;  // created at the first wait
  bool events_unavailable_ ABSL_GUARDED_BY(mu_) = false;
  std::chrono::steady_clock::time_point next_check_{};  // the waiting thread's only
};

}  // namespace tessera::gpu

#endif  // TESSERA_GPU_NVML_SOURCE_H_
