#include "scheduler/housekeeping.h"

#include "common/log.h"

namespace tessera::scheduler {

Housekeeping::Housekeeping(ClusterCache& cache, Extender& extender, ApiBackend* backend)
    : cache_(cache), extender_(extender), backend_(backend) {}

Housekeeping::~Housekeeping() {
  Stop();
}

void Housekeeping::Start() {
  if (thread_.joinable()) return;
  {
    MutexLock lock(&mu_);
    stopping_ = false;
  }
  thread_ = std::thread([this] {
    while (true) {
      {
        MutexLock lock(&mu_);
        if (!stopping_) cv_.WaitFor(&mu_, kPeriod);  // a real wait: the period is the machine's
        if (stopping_) return;
      }
      RunOnce();
    }
  });
}

void Housekeeping::Stop() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

Housekeeping::Round Housekeeping::RunOnce() {
  Round round;
  round.expired = cache_.ExpireReservations(kReservationTtl);
  if (round.expired > 0) {
    log::Warn("released reservations whose bind never finished", {{"count", std::to_string(round.expired)}});
  }
  round.share_failures = extender_.SyncChangedShares();
  for (const std::string& f : round.share_failures) log::Warn("share update failed", {{"pod", f}});
  if (backend_ != nullptr) backend_->Housekeeping();
  return round;
}

}  // namespace tessera::scheduler
