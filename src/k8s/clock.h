// The clock seam: wall time and monotonic time through one interface. Leader election, token reloading, the
// scheduler's cluster cache and the node agent read time through it, so tests drive time by
// hand instead of sleeping.
//
//   FakeClock clock;                                   // starts at 2024-01-01T00:00:00Z
//   LeaderElectionConfig config; config.clock = &clock;
//   clock.Advance(std::chrono::seconds(20));           // the lease has now expired for every elector
//
// Thread-safety: RealClock() and FakeClock are safe to use from any thread.
#ifndef TESSERA_K8S_CLOCK_H_
#define TESSERA_K8S_CLOCK_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace tessera::k8s {

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

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_CLOCK_H_
