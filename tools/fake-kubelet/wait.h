// The fake kubelet's waits: a condition on state guarded by a Mutex, with a deadline.
#ifndef TESSERA_TOOLS_FAKE_KUBELET_WAIT_H_
#define TESSERA_TOOLS_FAKE_KUBELET_WAIT_H_

#include <chrono>

#include "common/mutex.h"

namespace tessera::kubelet {

// Waits on `cv` until `done()` holds or `timeout` passes (a real wait: the deadline is the OS's time); false
// when it did not hold in time. `done` runs with `mu` held (it says so with mu->AssertHeld()).
template <typename Done>
bool WaitFor(Mutex* mu, CondVar* cv, std::chrono::milliseconds timeout, const Done& done)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return done();
    cv->WaitFor(mu, left);
  }
  return true;
}

}  // namespace tessera::kubelet

#endif  // TESSERA_TOOLS_FAKE_KUBELET_WAIT_H_
