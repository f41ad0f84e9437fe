// Warming the cluster cache's remembered answers off the request path (CacheOptions::warm_shapes): a
// background thread that evaluates every node for the pod shapes that come back, after a rebuilt policy or a
// change in what it weighs from the whole cluster invalidated them, so that only the pod that triggered the
// change pays.
//
//   ShapeWarmer warmer(ledger);                       // starts the thread (none when warm_shapes is 0)
//   warmer.NoteShapeLocked(ledger, request, fp);      // filter and prioritize, ledger lock held
//   warmer.WaitForWarming();                          // tests: until what was due is done
//
// Thread-safety: thread-safe. Its state is guarded by the ledger's lock; the thread takes it for a few node
// evaluations at a time (kNodesPerHold) and lets whoever waits for it (LedgerLock) go first.
#ifndef TESSERA_SCHEDULER_CACHE_WARMER_H_
#define TESSERA_SCHEDULER_CACHE_WARMER_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "core/request.h"
#include "scheduler/cache/ledger.h"

namespace tessera::scheduler {

class ShapeWarmer {
 public:
  // `ledger` must outlive the warmer.
  explicit ShapeWarmer(CacheLedger& ledger);
  ~ShapeWarmer();
  ShapeWarmer(const ShapeWarmer&) = delete;
  ShapeWarmer& operator=(const ShapeWarmer&) = delete;

  // Notes the pod's shape among those to warm, and wakes the thread when the answers the ledger keeps were
  // invalidated (a rebuilt policy, another state_key) since it last warmed. `ledger` is the warmer's own,
  // named by the caller so that the analysis checks the caller holds its lock.
  void NoteShapeLocked(const CacheLedger& ledger, const core::PodRequest& request, uint64_t fingerprint)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ledger.mu);
  // For tests: waits until the thread has nothing left to do for what it has been asked so far.
  void WaitForWarming() const;
  // The node evaluations the thread has made.
  uint64_t warmed_evaluations() const;

 private:
  void Loop();

  CacheLedger& ledger_;
  // The last distinct pod shapes seen (by CompiledRequest fingerprint), with when each was last seen and how
  // many pods apart its pods come (to warm the shape due soonest first).
  struct Shape {
    uint64_t fingerprint = 0;
    core::PodRequest request;  // its last pod
    uint64_t last_seen = 0;    // shape_clock_ then
    double gap = 0;            // pods between two of its pods, a moving average; 0: seen once
  };
  std::vector<Shape> shapes_ ABSL_GUARDED_BY(ledger_.mu);
  uint64_t shape_clock_ ABSL_GUARDED_BY(ledger_.mu) =
      0;  // pods seen (filter and prioritize of one count once)
  core::PodUid last_shape_pod_ ABSL_GUARDED_BY(ledger_.mu);
  // The policy and state_key the thread was last woken for; whether it has work.
  uint64_t warm_generation_ ABSL_GUARDED_BY(ledger_.mu) = ~uint64_t{0};
  uint64_t warm_state_key_ ABSL_GUARDED_BY(ledger_.mu) = 0;
  bool due_ ABSL_GUARDED_BY(ledger_.mu) = false;
  bool warming_ ABSL_GUARDED_BY(ledger_.mu) = false;  // the thread is at work on what was due
  bool stop_ ABSL_GUARDED_BY(ledger_.mu) = false;
  uint64_t warmed_ ABSL_GUARDED_BY(ledger_.mu) = 0;  // evaluations made by the thread
  // Its own: the verbs' Rng sequence stays what it would be without warming.
  core::Rng rng_ ABSL_GUARDED_BY(ledger_.mu){1};
  mutable CondVar cv_;       // wakes the thread (work due, or stop)
  mutable CondVar idle_cv_;  // the thread finished what was due
  std::thread thread_;       // last: started once everything above is built
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_WARMER_H_
