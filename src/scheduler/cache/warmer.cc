#include "scheduler/cache/warmer.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <utility>

#include "core/placement/policy.h"

namespace tessera::scheduler {

ShapeWarmer::ShapeWarmer(CacheLedger& ledger) : ledger_(ledger) {
  if (ledger_.options().warm_shapes > 0) thread_ = std::thread([this] { Loop(); });
}

ShapeWarmer::~ShapeWarmer() {
  if (!thread_.joinable()) return;
  {
    LedgerLock lock(&ledger_);
    stop_ = true;
  }
  cv_.SignalAll();
  idle_cv_.SignalAll();
  thread_.join();
}

void ShapeWarmer::NoteShapeLocked([[maybe_unused]] const CacheLedger& ledger, const core::PodRequest& request,
                                  uint64_t fingerprint) {
  // One ledger: the lock the caller holds is this warmer's (the analysis cannot see that they are one).
  assert(&ledger == &ledger_);
  ledger_.mu.AssertHeld();
  const size_t most = ledger_.options().warm_shapes;
  if (most == 0 || !ledger_.policy->deterministic()) return;
  if (request.uid != last_shape_pod_) {
    last_shape_pod_ = request.uid;
    ++shape_clock_;
  }
  auto shape = std::find_if(shapes_.begin(), shapes_.end(),
                            [&](const Shape& k) { return k.fingerprint == fingerprint; });
  if (shape == shapes_.end()) {
    if (shapes_.size() >= most) {  // forget the one seen longest ago
      shapes_.erase(std::min_element(shapes_.begin(), shapes_.end(),
                                     [](const auto& a, const auto& b) { return a.last_seen < b.last_seen; }));
    }
    shapes_.push_back({fingerprint, request, shape_clock_, 0});
  } else if (shape->last_seen != shape_clock_) {
    const auto gap = static_cast<double>(shape_clock_ - shape->last_seen);
    shape->gap = shape->gap == 0 ? gap : 0.75 * shape->gap + 0.25 * gap;
    shape->last_seen = shape_clock_;
    shape->request = request;
  }
  if (warm_generation_ != ledger_.policy_generation || warm_state_key_ != ledger_.policy->state_key()) {
    warm_generation_ = ledger_.policy_generation;
    warm_state_key_ = ledger_.policy->state_key();
    due_ = true;
    cv_.Signal();
  }
}

void ShapeWarmer::Loop() {
  // Nodes evaluated per hold of the lock: about 0.5 ms while the policy's per-node views are cold (tessera:
  // 16 us a node over a full workload window), some 20 us once they are warm.
  constexpr int kNodesPerHold = 32;
  ledger_.mu.Lock();
  while (true) {
    while (!stop_ && !due_) cv_.Wait(&ledger_.mu);
    if (stop_) break;
    due_ = false;
    warming_ = true;
    // The shape whose next pod is due soonest first: its usual gap less the pods since it was last seen. Pods
    // of a few shapes in turn come in the order they were last seen, pods of one frequent shape come at once;
    // warming in the order of recency came last for the former. Only shapes that come back: seen twice at
    // least, and within the last `rebuild_after` pods (a shape of the past is not worth 5,000 evaluations
    // after every rebuild; under load they took 12% of the pods/s).
    std::vector<std::pair<double, const core::PodRequest*>> order;
    for (const Shape& k : shapes_) {
      const auto age = static_cast<double>(shape_clock_ - k.last_seen);
      if (k.gap == 0 || age > static_cast<double>(std::max<size_t>(ledger_.options().rebuild_after, 1)))
        continue;
      order.emplace_back(k.gap - age, &k.request);
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<core::PodRequest> shapes;
    for (const auto& [due, request] : order) shapes.push_back(*request);
    core::NodeFit scratch;
    // Stop as soon as what is warmed would go stale: a verb has marked a newer state due (NoteShapeLocked),
    // or the cluster moved the policy's state_key (then mark it here).
    for (size_t k = 0; k < shapes.size(); ++k) {
      for (int next = 0; !stop_ && !due_ && next < ledger_.cluster.node_count();) {
        ledger_.ObserveLocked();  // what the verbs would read first; nothing when the cluster did not change
        if (ledger_.policy->state_key() != warm_state_key_) {
          warm_state_key_ = ledger_.policy->state_key();
          due_ = true;
          break;
        }
        const core::CompiledRequest compiled(ledger_.cluster, shapes[k]);
        const int end = std::min(next + kNodesPerHold, ledger_.cluster.node_count());
        for (; next < end; ++next) {
          ledger_.placer->EvaluateCached(ledger_.cluster, ledger_.cluster.nodes()[static_cast<size_t>(next)],
                                         compiled, rng_, &ledger_.evaluations, scratch);
          ++warmed_;
        }
        // Whoever waits for the lock goes first: warming is for them. (Not a yield each time: on a loaded
        // machine each one gave the core away for a whole time slice, and warming never caught up.)
        if (ledger_.waiting.load(std::memory_order_relaxed) > 0) {
          ledger_.mu.Unlock();
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          ledger_.mu.Lock();
        }
      }
    }
    warming_ = false;
    idle_cv_.SignalAll();
  }
  ledger_.mu.Unlock();
}

void ShapeWarmer::WaitForWarming() const {
  LedgerLock lock(&ledger_);
  while (!stop_ && (due_ || warming_)) idle_cv_.Wait(&ledger_.mu);
}

uint64_t ShapeWarmer::warmed_evaluations() const {
  LedgerLock lock(&ledger_);
  return warmed_;
}

}  // namespace tessera::scheduler
