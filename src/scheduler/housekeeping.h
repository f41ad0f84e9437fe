// The scheduler's housekeeping, off the request path every half second: reservations whose bind never
// finished are released after a minute (ClusterCache::ExpireReservations), shares changed by compression or
// give-back are written to their pods (Extender::SyncChangedShares), and on a cluster stale heartbeats and
// the problems found become Events (ApiBackend::Housekeeping). Failures are logged; none stops the loop.
//
//   Housekeeping housekeeping(cache, extender, backend.get());   // backend: null in the standalone mode
//   housekeeping.Start();
//   ...
//   housekeeping.Stop();
//
// Thread-safety: Start and Stop from one thread; RunOnce from any (tests call it by hand, with the cache's
// clock a FakeClock).
#ifndef TESSERA_SCHEDULER_HOUSEKEEPING_H_
#define TESSERA_SCHEDULER_HOUSEKEEPING_H_

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "scheduler/api_backend.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"

namespace tessera::scheduler {

class Housekeeping {
 public:
  // How often a round runs, and how old a reservation may grow before it is released (the cache's clock).
  static constexpr std::chrono::milliseconds kPeriod{500};
  static constexpr std::chrono::seconds kReservationTtl{60};

  struct Round {
    int expired = 0;                          // reservations released
    std::vector<std::string> share_failures;  // pods whose changed share could not be written
  };

  // `backend` may be null (standalone); every part must outlive the housekeeping.
  Housekeeping(ClusterCache& cache, Extender& extender, ApiBackend* backend);
  ~Housekeeping();
  Housekeeping(const Housekeeping&) = delete;
  Housekeeping& operator=(const Housekeeping&) = delete;

  // A thread that runs a round every kPeriod (a real wait) until Stop().
  void Start();
  void Stop();
  // One round, logged.
  Round RunOnce();

 private:
  ClusterCache& cache_;
  Extender& extender_;
  ApiBackend* const backend_;
  Mutex mu_;  // guards stopping_; cv_ wakes the thread to stop
  CondVar cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_HOUSEKEEPING_H_
