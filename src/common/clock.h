// The clock seam: wall time and monotonic time through one interface (envoy's TimeSource is the model). Every
// timer, timeout, expiry and period of the daemons reads time through a Clock: the node agent (heartbeats,
// reconcile periods, records' ages), its registration server (HELLO timeouts), the GPU health checks' period,
// leader election, events' deduplication, informers' backoff, the scheduler's API sync (heartbeats' age,
// the node's heartbeat written), its cluster cache (reservations' age), its extender and operators' page
// (pending pods' ages), DRA placement (the webhook's gated-at stamp, the controller's allocationTimestamp and
// the age of its own writes) and the node's DRA fallback (pods' waits, the Lease's age). Tests give them a
// FakeClock and drive time by hand instead of sleeping:
//
//   FakeClock clock;                                   // starts at 2024-01-01T00:00:00Z
//   LeaderElectionConfig config; config.clock = &clock;
//   clock.Advance(std::chrono::seconds(20));           // the lease has now expired for every elector
//
// A part's clock is never null: options that hold one start with &RealClock(), and the parts read it without
// a fallback. Read directly, and on purpose:
//   - deadlines handed to the OS or to gRPC (poll and condition-variable waits, ClientContext::set_deadline):
//     they are real waits on real peers, which a fake time would cut short or stretch without end;
//   - measurements of how long something took (latency metrics, the simulator's and benchmarks' timings) and
//     the seed of a random tie-breaker: they describe the machine, not the program's logic;
//   - the test doubles under tools/ (the fake API server, the fake kubelet), which serve real clients in real
//     time.
//
// Thread-safety: RealClock() and FakeClock are safe to use from any thread.
#ifndef TESSERA_COMMON_CLOCK_H_
#define TESSERA_COMMON_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tessera {

class Clock {
 public:
  virtual ~Clock() = default;
  // Wall-clock time (Kubernetes timestamps are wall-clock).
  virtual std::chrono::system_clock::time_point Now() const = 0;
  // Monotonic time, for deadlines, expiry and periods.
  virtual std::chrono::steady_clock::time_point Steady() const = 0;
};

// The system clock.
const Clock& RealClock();

// A clock that moves only when told to.
class FakeClock final : public Clock {
 public:
  // 2024-01-01T00:00:00Z.
  static constexpr int64_t kDefaultStartSeconds = 1704067200;

  FakeClock()
      : FakeClock(std::chrono::system_clock::time_point(std::chrono::seconds(kDefaultStartSeconds))) {}
  explicit FakeClock(std::chrono::system_clock::time_point start)
      : nanos_(std::chrono::duration_cast<std::chrono::nanoseconds>(start.time_since_epoch()).count()) {}

  std::chrono::system_clock::time_point Now() const override {
    return std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(
            std::chrono::nanoseconds(nanos_.load())));
  }
  // Starts at an arbitrary point and moves with Advance (Set moves wall time only).
  std::chrono::steady_clock::time_point Steady() const override {
    return std::chrono::steady_clock::time_point(
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::nanoseconds(steady_.load())));
  }
  void Advance(std::chrono::nanoseconds d) {
    nanos_ += d.count();
    steady_ += d.count();
  }
  void Set(std::chrono::system_clock::time_point t) {
    nanos_ = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  }

 private:
  std::atomic<int64_t> nanos_;
  std::atomic<int64_t> steady_{int64_t{1} << 40};
};

}  // namespace tessera

#endif  // TESSERA_COMMON_CLOCK_H_
