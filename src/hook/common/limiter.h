// Compute-share policy for the hook libraries, as pure classes with time passed in (no clock reads), so they
// are tested without a GPU and without sleeping:
//
// - TokenBucket: a budget of GPU time. It fills at the container's rate (share of one GPU, in parts per
//   million) and every launch takes the launch's estimated GPU time from it. A launch that finds the budget
//   empty waits until it refills. The state (BucketState) lives in the shared region, so every process of a
//   container draws on one budget.
// - Tab: a launching thread's running tab on a bucket. The launch fast path (TokenBucket::RunUp) checks the
//   bucket has budget beyond what the thread already owes and adds the launch's cost to the tab, with plain
//   loads and stores in the thread's own memory; the tab is settled (one atomic subtraction from the bucket)
//   when it reaches a batch, when the process's tab epoch moves on (every limiter tick), and when the thread
//   exits. Nothing is taken in advance, so nothing has to be given back: a thread that stops owes what it
//   launched and is charged it later, never credited budget the bucket would have dropped
//   (docs/isolation.md, "Compute limiter").
// - ElasticController: GaiaGPU's elastic policy. Alone, a container may use idle compute up to a ceiling;
//   when others want their share (the GPU is saturated) it gives the excess back step by step, without
//   preempting anything: it only launches less. High priority grows and keeps; low priority yields at once.
// - KernelCostTable: the measured GPU time of each kind of launch (function and launch shape, or graph),
//   from sampled launches timed with the API's own events; the cost charged to the bucket at launch.
// - SampleRing: the sampled launches in flight, handed from launching threads to the measuring thread.
//
//   BucketState b{};                                  // zeroed memory (a fresh region) is valid
//   TokenBucket::Configure(&b, 300000, now);          // 30% of a GPU
//   if (!TokenBucket::TryTake(&b, cost_ns)) { TokenBucket::Refill(&b, now); ... wait WaitNs(&b) ... }
//   Tab t{};                                          // a thread's; the hooks use ThreadTab()
//   if (!TokenBucket::RunUp(&t, &b, epoch, cost_ns)) {
//     TokenBucket::Settle(&t); if (!TokenBucket::Open(&t, &b, epoch, cost_ns)) ... wait, Open with force ...
//   }
//
// API-neutral: no CUDA or OpenCL types; events are opaque 64-bit handles.
// Thread-safety: TokenBucket and ElasticController functions are safe between threads and processes on shared
// state; a Tab belongs to one thread; KernelCostTable allows any number of readers and one writer per
// entry (Record from one thread); SampleRing is multi-producer, single-consumer.
#ifndef TESSERA_HOOK_COMMON_LIMITER_H_
#define TESSERA_HOOK_COMMON_LIMITER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace tessera::hook {

inline constexpr uint32_t kPpm = 1000000;  // parts per million of one GPU: the whole GPU

// The GPU-time budget of one GPU of one container (128 bytes, shared between processes).
struct BucketState {
  std::atomic<int64_t> tokens_ns;  // 0: budget left; may go below zero by the launches in flight
  uint8_t pad0[56];
  std::atomic<uint64_t> last_refill_ns;     // 64: monotonic time of the last refill
  std::atomic<uint64_t> refilled_total_ns;  // 72: all budget ever added (for measuring use)
  std::atomic<uint32_t> rate_ppm;           // 80: current fill rate; kPpm or more = unlimited
  std::atomic<uint32_t> limited;            // 84: 1 when launches are paced on this GPU
  std::atomic<int64_t> capacity_ns;         // 88: the most budget that can be saved up (burst)
  std::atomic<uint64_t> waited_ns;          // 96: total time launches spent waiting for budget
  std::atomic<uint64_t> waits;              // 104: launches that had to wait
  uint8_t reserved[128 - 112];
};
static_assert(sizeof(BucketState) == 128);

// A thread's running tab on one bucket (process memory, never shared: the thread adds to it without atomic
// operations). Zeroed is empty. It points into the bucket's mapping, which must stay mapped while any thread
// may still settle there (the hooks map their region for the life of the process).
struct Tab {
  int64_t owed_ns;      // launched and not yet taken from `bucket`
  int64_t limit_ns;     // settle before owing more than this (a batch)
  BucketState* bucket;  // whose budget the launches use; null: none
  uint32_t epoch;       // the tab epoch it was opened in; settled once the epoch moves on
  uint32_t exit_hook;   // ThreadTab(): 1 once its settling at thread exit is registered
};

// The calling thread's tab (initial-exec TLS: one %fs-relative access, no lookup call or init guard) and the
// process's tab epoch, which the limiter thread advances every tick (AdvanceTabEpoch).
extern __thread Tab t_tab __attribute__((tls_model("initial-exec")));
extern std::atomic<uint32_t> g_tab_epoch;
inline Tab* ThreadTab() {
  return &t_tab;
}
inline uint32_t TabEpoch() {
  return g_tab_epoch.load(std::memory_order_relaxed);
}
inline void AdvanceTabEpoch() {
  // One writer (the limiter thread): a load and a store, no locked operation.
  g_tab_epoch.store(g_tab_epoch.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}
// After fork(), in the child: the forking thread's tab is the parent's to settle; the child starts with none.
inline void ForgetThreadTabInChild() {
  t_tab = Tab{};
}

class TokenBucket {
 public:
  // The budget saved up while idle: this many ns of GPU time at the current rate (and at least kMinBurstNs).
  static constexpr int64_t kBurstWindowNs = 20000000;  // 20 ms
  static constexpr int64_t kMinBurstNs = 4000000;      // 4 ms: twice kResumeNs (below)

  // Sets the rate (kPpm = no limit) and the capacity that goes with it. Keeps the current budget (clamped).
  static void Configure(BucketState* b, uint32_t rate_ppm, uint64_t now_ns);
  // Changes only the rate (the elastic controller's output), adjusting the capacity.
  static void SetRate(BucketState* b, uint32_t rate_ppm);

  // Adds the budget earned since the last refill. Safe to call from every thread and process: one caller
  // wins each interval (compare-and-swap on the refill time).
  static void Refill(BucketState* b, uint64_t now_ns);

  // Without a tab: true when there is budget (then `cost_ns` is taken), false when the caller must
  // refill and wait. Never blocks. One load and one atomic subtraction on the shared bucket.
  static bool TryTake(BucketState* b, int64_t cost_ns) {
    if (b->tokens_ns.load(std::memory_order_relaxed) <= 0) return false;
    b->tokens_ns.fetch_sub(cost_ns, std::memory_order_relaxed);
    return true;
  }
  // Takes budget unconditionally (after a wait, or to correct an estimate).
  static void Take(BucketState* b, int64_t cost_ns) {
    b->tokens_ns.fetch_sub(cost_ns, std::memory_order_relaxed);
  }

  // The launch fast path with a tab: true when `t` is open on `b` in this `epoch`, owing `cost_ns` more stays
  // within its batch, and the bucket holds more than the tab owes (the bucket as if the tab were settled is
  // above zero, as TryTake asks); then the cost is added to the tab. Plain loads and stores, and one load of
  // the shared bucket.
  static bool RunUp(Tab* t, const BucketState* b, uint32_t epoch, int64_t cost_ns) {
    const int64_t owed = t->owed_ns;
    if (t->bucket != b || t->epoch != epoch || owed + cost_ns > t->limit_ns ||
        b->tokens_ns.load(std::memory_order_relaxed) <= owed) {
      return false;
    }
    t->owed_ns = owed + cost_ns;
    return true;
  }
  // A tab owes at most about this many launches...
  static constexpr int64_t kBatchLaunches = 64;
  // ...and never more than this fraction of the bucket's capacity: what the threads of a container owe and
  // have not settled is what they can run ahead of the share together.
  static constexpr int64_t kBatchCapacityDivisor = 32;
  // Takes what `t` owes from its bucket (one atomic subtraction) and empties the tab.
  static void Settle(Tab* t);
  // Opens a settled tab on `b` in `epoch` with this launch on it: true when the bucket has budget (or
  // `force`, after a wait: then the launch is charged whatever the bucket holds). False, with nothing owed,
  // when the bucket is empty: the caller waits for budget and opens with `force`. The batch: kBatchLaunches
  // launches of this cost, at most capacity / kBatchCapacityDivisor, at least this launch.
  static bool Open(Tab* t, BucketState* b, uint32_t epoch, int64_t cost_ns, bool force = false);
  // The launch path of both hooks after RunUp failed, on the calling thread's tab: Settle, Open, and when the
  // bucket is empty WaitForBudget and Open with `force`. Registers the settling of the tab at thread exit.
  static void ChargeLaunch(BucketState* b, int64_t cost_ns);

  // A launch that had to wait resumes once this much budget has built up: the container then runs a burst of
  // about 2 ms instead of one kernel per refill. On a real GPU every switch between two containers' contexts
  // costs GPU time that neither gets: a 10% tenant resuming at every refill forced about a thousand switches a
  // second on an H100 and cost its 90% neighbour 10 points. Half the bucket at most: a waiter that wakes late
  // (a loaded machine) must not find the bucket full and the refill since lost (a 10% tenant whose bucket held
  // only 2 ms got 7.4% beside a 90% one on the fake GPU).
  static constexpr int64_t kResumeNs = 2000000;  // 2 ms
  static int64_t ResumeNs(const BucketState* b) {
    const int64_t half = b->capacity_ns.load(std::memory_order_relaxed) / 2;
    return half < kResumeNs ? half : kResumeNs;
  }

  // How long until the budget reaches `resume_ns` at the current rate (0 when it has; default: positive).
  static uint64_t WaitNs(const BucketState* b, int64_t resume_ns = 1);
  static bool Unlimited(const BucketState* b) { return b->limited.load(std::memory_order_relaxed) == 0; }

  // The launch slow path of both hook libraries: sleeps (reading the real clock) until the budget reaches
  // ResumeNs, in slices of at most 2 ms so that a raised limit takes effect quickly, and counts the wait so
  // the elastic controller sees the demand. The one member that is not pure.
  static void WaitForBudget(BucketState* b);
};

// The elastic controller's state for one GPU of one container (64 bytes, shared between processes).
struct ControllerState {
  std::atomic<uint64_t> last_step_ns;      // 0
  std::atomic<uint64_t> last_refilled_ns;  // 8: bucket.refilled_total_ns at the last step
  std::atomic<int64_t> last_tokens_ns;     // 16: bucket.tokens_ns at the last step
  std::atomic<uint64_t> last_waits;        // 24: bucket.waits at the last step
  std::atomic<uint32_t> share_ppm;         // 32: the configured share
  std::atomic<uint32_t> ceiling_ppm;       // 36: elastic ceiling
  std::atomic<uint32_t> policy;            // 40: ComputePolicy
  std::atomic<uint32_t> priority;          // 44: Priority
  std::atomic<uint32_t> own_util_ppm;      // 48: this container's use over the last step
  std::atomic<int32_t> device_util_ppm;    // 52: the whole GPU's use over the last step (-1 unknown)
  uint8_t reserved[64 - 56];
};
static_assert(sizeof(ControllerState) == 64);

struct ElasticInputs {
  uint32_t share_ppm = 0;    // the container's share
  uint32_t ceiling_ppm = 0;  // the most it may take when the GPU is idle
  bool high_priority = false;
  uint32_t rate_ppm = 0;         // the current rate
  uint32_t own_util_ppm = 0;     // what the container used over the last interval
  int32_t device_util_ppm = -1;  // what the whole GPU did over the last interval (NVML); -1 unknown
  bool wanted_more = false;      // some launch waited for budget in the last interval
  // No process outside the container holds a context on the GPU (NVML's process list): nobody else can want
  // compute, whatever the utilization reads. NVML's utilization is a sampled, lagging figure a few points
  // away from the container's own measure, so without this a lone elastic container saw "others" in the
  // difference and gave its growth back, over and over (an H100 alone at a 90% ceiling averaged 78%).
  bool alone = false;
};

class ElasticController {
 public:
  static constexpr uint64_t kStepNs = 200000000;  // 200 ms: about NVML's utilization sample period
  static constexpr uint32_t kMarginPpm = 30000;   // 3%: below this much idle, the GPU counts as saturated
  static constexpr uint32_t kMinStepPpm = 20000;  // 2%: the smallest give-back step

  // The next rate (pure). Hard policy and unknown device use keep the share.
  static uint32_t NextRate(const ElasticInputs& in);

  // One control step on shared state: at most one caller per kStepNs wins (compare-and-swap on the step
  // time); the winner measures the container's use since the last step from the bucket, computes the next
  // rate and applies it. `device_util_ppm` is the GPU's utilization (NVML), -1 when unknown. Returns true
  // when this caller did the step.
  static bool Step(ControllerState* c, BucketState* b, uint64_t now_ns, int32_t device_util_ppm,
                   bool alone = false);
};

// Measured GPU time per kind of launch, process-local. A kind is a 64-bit key (the hook hashes the function
// and launch shape, or the graph). The estimate is the minimum of the last kWindow samples: queueing behind
// other tenants only ever makes a sample longer, so the minimum is the kernel's own time.
class KernelCostTable {
 public:
  static constexpr int kEntries = 4096;
  static constexpr uint32_t kWindow = 4;
  static constexpr uint32_t kSampleEvery = 64;  // after the first kWindow launches of a kind

  struct Lookup {
    int64_t estimate_ns;  // -1: not measured yet
    bool sample;          // this launch should be timed
  };

  // The launch fast path's look at `key`: true when the kind is known and this launch is not one to time,
  // with the estimate in `c`; the caller then calls Counted(c) once the launch goes ahead. False: the launch
  // takes the slow path, whose Find decides (and counts it), so a launch is counted once either way.
  struct Cursor {
    std::atomic<uint32_t>* launches;
    uint32_t n;
    int64_t estimate_ns;
  };
  bool Peek(uint64_t key, Cursor* c) {
    Entry& e = entries_[Index(key)];
    if (e.key.load(std::memory_order_acquire) != key) return false;
    const uint32_t n = e.launches.load(std::memory_order_relaxed);
    if (n < kWindow || n % kSampleEvery == 0) return false;
    const int64_t est = e.estimate_ns.load(std::memory_order_relaxed);
    *c = {&e.launches, n, est >= 0 ? est : fallback_ns_.load(std::memory_order_relaxed)};
    return true;
  }
  static void Counted(const Cursor& c) { c.launches->store(c.n + 1, std::memory_order_relaxed); }

  // The launch path: the estimate for `key` and whether to time this launch. Lock-free, no allocation.
  Lookup Find(uint64_t key) {
    Entry& e = entries_[Index(key)];
    if (e.key.load(std::memory_order_acquire) != key) {
      // A new kind (or a collision): take the entry over; the estimate starts unknown.
      e.key.store(key, std::memory_order_release);
      e.estimate_ns.store(-1, std::memory_order_relaxed);
      e.launches.store(0, std::memory_order_relaxed);
      e.window_count = 0;
      return {fallback_ns_.load(std::memory_order_relaxed), true};
    }
    // A load and a store, not an atomic increment: threads that race here lose a count, which only moves
    // which launch is sampled; a locked increment would make every launch wait on the memory bus.
    const uint32_t n = e.launches.load(std::memory_order_relaxed);
    e.launches.store(n + 1, std::memory_order_relaxed);
    const int64_t est = e.estimate_ns.load(std::memory_order_relaxed);
    const bool sample = n < kWindow || n % kSampleEvery == 0;
    return {est >= 0 ? est : fallback_ns_.load(std::memory_order_relaxed), sample};
  }

  // Records one measured launch (from the measuring thread).
  void Record(uint64_t key, int64_t measured_ns);
  // The estimate for `key`, -1 when unknown (tests).
  int64_t Estimate(uint64_t key) const;
  void Clear();

 private:
  struct Entry {
    std::atomic<uint64_t> key{0};
    std::atomic<int64_t> estimate_ns{-1};
    std::atomic<uint32_t> launches{0};
    uint32_t window_count = 0;  // samples in the current window (writer only)
    int64_t window_min = 0;     // minimum of the current window (writer only)
  };
  static int Index(uint64_t key) {
    // Fibonacci hashing: the top 12 bits of the key times 2^64 / golden ratio (one multiply, on every
    // launch).
    static_assert(kEntries == 1 << 12);
    return static_cast<int>((key * 0x9e3779b97f4a7c15ull) >> 52);
  }
  Entry entries_[kEntries];
  // Charged for a kind not measured yet: the last measurement of any kind (a kernel is more like another
  // kernel of the same program than like nothing).
  std::atomic<int64_t> fallback_ns_{0};
};

// Sampled launches in flight: (key, start event, end event, device, charged estimate). Launching threads
// Push; the measuring thread Drains what completed. Fixed capacity; Push fails (the launch goes unsampled)
// when full.
class SampleRing {
 public:
  static constexpr int kCapacity = 256;
  struct Sample {
    uint64_t key;
    uint64_t start_event;
    uint64_t end_event;
    int device;
    int64_t charged_ns;  // what the launch was charged (the estimate at launch)
  };
  bool Push(const Sample& s);
  // Calls `fn(sample, context)` for each ready sample; when it returns true the sample is removed.
  template <typename Fn>
  int Drain(Fn fn) {
    int removed = 0;
    for (int i = 0; i < kCapacity; ++i) {
      Cell& c = cells_[i];
      if (c.state.load(std::memory_order_acquire) != kReady) continue;
      if (fn(c.sample)) {
        c.state.store(kFree, std::memory_order_release);
        ++removed;
      }
    }
    if (removed > 0) in_flight_.fetch_sub(removed, std::memory_order_relaxed);
    return removed;
  }
  // Samples pushed and not yet drained. A counter, not a scan of the cells: every sampled launch asks.
  int InFlight() const { return in_flight_.load(std::memory_order_relaxed); }

 private:
  enum : uint32_t { kFree = 0, kWriting = 1, kReady = 2 };
  struct Cell {
    std::atomic<uint32_t> state{kFree};
    Sample sample{};
  };
  Cell cells_[kCapacity];
  std::atomic<uint32_t> next_{0};
  std::atomic<int> in_flight_{0};
};

}  // namespace tessera::hook

#endif  // TESSERA_HOOK_COMMON_LIMITER_H_
