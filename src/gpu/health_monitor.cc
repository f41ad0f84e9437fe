#include "gpu/health_monitor.h"

#include "common/log.h"
#include "core/strings.h"

namespace tessera::gpu {

HealthMonitor::HealthMonitor(GpuSource* source, const formats::GpuInventory& initial, Listener listener,
                             std::chrono::milliseconds wait_slice)
    : source_(source), listener_(std::move(listener)), wait_slice_(wait_slice) {
  for (const formats::InventoryGpu& g : initial.gpus) {
    current_[g.info.uuid] = {g.info.uuid, g.info.health, g.health_reason};
  }
  thread_ = std::thread([this] { Run(); });
}

HealthMonitor::~HealthMonitor() {
  stop_ = true;
  thread_.join();
}

std::map<core::GpuUuid, HealthUpdate> HealthMonitor::Current() const {
  MutexLock lock(&mu_);
  return current_;
}

void HealthMonitor::Run() {
  std::string last_error;
  while (!stop_) {
    absl::StatusOr<std::vector<HealthUpdate>> updates = source_->WaitForHealthEvents(wait_slice_);
    if (!updates.ok()) {
      if (Message(updates.status()) != last_error) {
        last_error = Message(updates.status());
        log::Warn("GPU health source failed", {{"source", source_->Name()}, {"error", last_error}});
      }
      continue;
    }
    last_error.clear();
    for (const HealthUpdate& u : *updates) {
      {
        MutexLock lock(&mu_);
        auto it = current_.find(u.uuid);
        if (it == current_.end() || it->second.health == u.health) continue;
        it->second = u;
      }
      log::Info(u.health == core::GpuHealth::kHealthy ? "GPU healthy again" : "GPU unhealthy",
                {{"gpu", u.uuid.value()}, {"reason", u.reason}});
      listener_(u);
    }
  }
}

}  // namespace tessera::gpu
