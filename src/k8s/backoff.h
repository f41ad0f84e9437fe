// Exponential backoff with jitter, capped: the wait before reconnecting a broken watch or retrying a list.
//
//   Backoff b({.initial = std::chrono::milliseconds(200), .max = std::chrono::seconds(30)});
//   std::chrono::milliseconds wait = b.Next();   // 200ms, then ~400ms, ~800ms ... never above 30s
//   b.Reset();                                   // after a success
//
// Each wait is the current step times a random factor in [1 - jitter, 1 + jitter]; the step doubles (by
// `factor`) after each wait, up to `max`. Thread-safety: not thread-safe (one per loop).
#ifndef TESSERA_K8S_BACKOFF_H_
#define TESSERA_K8S_BACKOFF_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>

namespace tessera::k8s {

struct BackoffPolicy {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{30000};
  double factor = 2.0;
  double jitter = 0.2;  // +-20%
};

class Backoff {
 public:
  explicit Backoff(BackoffPolicy policy = {}, uint64_t seed = std::random_device{}())
      : policy_(policy), step_(policy.initial), rng_(seed) {}

  std::chrono::milliseconds Next() {
    std::uniform_real_distribution<double> d(1.0 - policy_.jitter, 1.0 + policy_.jitter);
    double wait = static_cast<double>(step_.count()) * d(rng_);
    wait = std::min(wait, static_cast<double>(policy_.max.count()));
    auto next = static_cast<double>(step_.count()) * policy_.factor;
    step_ = std::chrono::milliseconds(
        static_cast<int64_t>(std::min(next, static_cast<double>(policy_.max.count()))));
    ++attempts_;
    return std::chrono::milliseconds(static_cast<int64_t>(wait));
  }

  void Reset() {
    step_ = policy_.initial;
    attempts_ = 0;
  }

  int attempts() const { return attempts_; }

 private:
  BackoffPolicy policy_;
  std::chrono::milliseconds step_;
  std::mt19937_64 rng_;
  int attempts_ = 0;
};

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_BACKOFF_H_
