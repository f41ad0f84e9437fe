// Watches a GpuSource for GPU health changes on its own thread and tells a listener about each change.
//
//   HealthMonitor monitor(source.get(), inventory, [&](const HealthUpdate& u) {
//     plugin->SetGpuHealth(u.uuid, u.health == core::GpuHealth::kHealthy, u.reason);
//   });
//   ...                                   // the destructor stops the thread (within one wait slice)
//
// The listener hears only changes against the health it last reported (starting from `initial`), for GPUs of
// `initial`; sources may repeat unchanged states. Errors from the source (a malformed fake-GPU file, a failing
// NVML wait) are logged once per distinct message and the last known health stays.
//
// Thread-safety: the listener runs on the monitor's thread; Current() may be called from any thread.
#ifndef TESSERA_GPU_HEALTH_MONITOR_H_
#define TESSERA_GPU_HEALTH_MONITOR_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <thread>

#include "common/mutex.h"
#include "gpu/gpu_source.h"

namespace tessera::gpu {

class HealthMonitor {
 public:
  using Listener = std::function<void(const HealthUpdate&)>;

  // `source` must outlive the monitor. `wait_slice` bounds each wait, and so how long the destructor takes.
  HealthMonitor(GpuSource* source, const formats::GpuInventory& initial, Listener listener,
                std::chrono::milliseconds wait_slice = std::chrono::milliseconds(200));
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // The last reported health of every GPU of the initial inventory.
  std::map<core::GpuUuid, HealthUpdate> Current() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);  // the listener runs without the lock

  GpuSource* const source_;
  const Listener listener_;
  const std::chrono::milliseconds wait_slice_;
  mutable Mutex mu_;  // the last reported health
  std::map<core::GpuUuid, HealthUpdate> current_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace tessera::gpu

#endif  // TESSERA_GPU_HEALTH_MONITOR_H_
