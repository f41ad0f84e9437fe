#include "common/clock.h"

namespace tessera {

namespace {

class SystemClock final : public Clock {
 public:
  std::chrono::system_clock::time_point Now() const override { return std::chrono::system_clock::now(); }
  std::chrono::steady_clock::time_point Steady() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock& RealClock() {
  static const SystemClock clock;
  return clock;
}

}  // namespace tessera
