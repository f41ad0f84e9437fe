#include "hook/common/limiter.h"

#include <pthread.h>

#include "hook/common/base.h"

namespace tessera::hook {

__thread Tab t_tab __attribute__((tls_model("initial-exec")));
std::atomic<uint32_t> g_tab_epoch{1};  // not 0: a zeroed tab is never current

namespace {

int64_t CapacityFor(uint32_t rate_ppm) {
  const int64_t c = TokenBucket::kBurstWindowNs * static_cast<int64_t>(rate_ppm) / kPpm;
  return c < TokenBucket::kMinBurstNs ? TokenBucket::kMinBurstNs : c;
}

// A thread that exits settles its tab (the key's destructor runs while the thread's TLS is still there).
pthread_once_t g_exit_key_once = PTHREAD_ONCE_INIT;
pthread_key_t g_exit_key;
bool g_exit_key_ok = false;

void SettleAtThreadExit(void* tab) {
  TokenBucket::Settle(static_cast<Tab*>(tab));
}

void CreateExitKey() {
  g_exit_key_ok = pthread_key_create(&g_exit_key, &SettleAtThreadExit) == 0;
}

}  // namespace

void TokenBucket::Settle(Tab* t) {
  if (t->bucket != nullptr && t->owed_ns != 0)
    t->bucket->tokens_ns.fetch_sub(t->owed_ns, std::memory_order_relaxed);
  t->owed_ns = 0;
  t->bucket = nullptr;
}

bool TokenBucket::Open(Tab* t, BucketState* b, uint32_t epoch, int64_t cost_ns, bool force) {
  if (t->bucket != nullptr) Settle(t);
  if (cost_ns < 0) cost_ns = 0;
  if (!force && b->tokens_ns.load(std::memory_order_relaxed) <= 0) return false;
  const int64_t most = b->capacity_ns.load(std::memory_order_relaxed) / kBatchCapacityDivisor;
  const int64_t batch = cost_ns > most / kBatchLaunches ? most : cost_ns * kBatchLaunches;
  t->bucket = b;
  t->epoch = epoch;
  t->limit_ns = batch > cost_ns ? batch : cost_ns;
  t->owed_ns = cost_ns;
  return true;
}

void TokenBucket::ChargeLaunch(BucketState* b, int64_t cost_ns) {
  Tab* t = ThreadTab();
  if (t->exit_hook == 0) {
    t->exit_hook = 1;
    pthread_once(&g_exit_key_once, &CreateExitKey);
    if (g_exit_key_ok) pthread_setspecific(g_exit_key, t);
  }
  const uint32_t epoch = TabEpoch();
  if (RunUp(t, b, epoch, cost_ns)) return;
  Settle(t);
  if (Open(t, b, epoch, cost_ns)) return;
  WaitForBudget(b);
  Open(t, b, TabEpoch(), cost_ns, /*force=*/true);
}

void TokenBucket::Configure(BucketState* b, uint32_t rate_ppm, uint64_t now_ns) {
  SetRate(b, rate_ppm);
  uint64_t expected = 0;
  // A fresh bucket starts full and counts from now.
  if (b->last_refill_ns.compare_exchange_strong(expected, now_ns)) {
    b->tokens_ns.store(b->capacity_ns.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

void TokenBucket::SetRate(BucketState* b, uint32_t rate_ppm) {
  const bool limited = rate_ppm < kPpm;
  b->rate_ppm.store(limited ? rate_ppm : kPpm, std::memory_order_relaxed);
  b->capacity_ns.store(CapacityFor(limited ? rate_ppm : kPpm), std::memory_order_relaxed);
  b->limited.store(limited ? 1 : 0, std::memory_order_release);
}

void TokenBucket::Refill(BucketState* b, uint64_t now_ns) {
  uint64_t last = b->last_refill_ns.load(std::memory_order_relaxed);
  if (now_ns <= last) return;
  if (!b->last_refill_ns.compare_exchange_strong(last, now_ns, std::memory_order_acq_rel)) return;
  const uint32_t rate = b->rate_ppm.load(std::memory_order_relaxed);
  const uint64_t elapsed = now_ns - last;
  // elapsed * rate / 1e6 without overflow for any realistic gap (clamped to 1000 s).
  const uint64_t capped = elapsed > 1000000000000ull ? 1000000000000ull : elapsed;
  const int64_t add = static_cast<int64_t>(static_cast<Uint128>(capped) * rate / kPpm);
  const int64_t cap = b->capacity_ns.load(std::memory_order_relaxed);
  int64_t tokens = b->tokens_ns.load(std::memory_order_relaxed);
  for (;;) {
    int64_t next = tokens + add;
    if (next > cap) next = tokens > cap ? tokens : cap;
    if (b->tokens_ns.compare_exchange_weak(tokens, next, std::memory_order_relaxed)) {
      b->refilled_total_ns.fetch_add(static_cast<uint64_t>(next - tokens), std::memory_order_relaxed);
      return;
    }
  }
}

uint64_t TokenBucket::WaitNs(const BucketState* b, int64_t resume_ns) {
  const int64_t tokens = b->tokens_ns.load(std::memory_order_relaxed);
  if (resume_ns < 1) resume_ns = 1;
  if (tokens >= resume_ns) return 0;
  const uint32_t rate = b->rate_ppm.load(std::memory_order_relaxed);
  if (rate == 0) return 1000000;  // nothing refills: poll every millisecond for a new rate
  const uint64_t deficit = static_cast<uint64_t>(resume_ns - tokens);
  return static_cast<uint64_t>(static_cast<Uint128>(deficit) * kPpm / rate) + 1;
}

uint32_t ElasticController::NextRate(const ElasticInputs& in) {
  const uint32_t share = in.share_ppm;
  const uint32_t ceiling = in.ceiling_ppm < share ? share : in.ceiling_ppm;
  if ((in.device_util_ppm < 0 && !in.alone) || ceiling == share) return share;
  const uint32_t device = in.device_util_ppm < 0                             ? 0
                          : in.device_util_ppm > static_cast<int32_t>(kPpm) ? kPpm
                                                                             : static_cast<uint32_t>(in.device_util_ppm);
  const uint32_t own = in.own_util_ppm > kPpm ? kPpm : in.own_util_ppm;
  const uint32_t others = in.alone || device <= own ? 0 : device - own;
  const uint32_t used = own + others > kPpm ? kPpm : own + others;
  const uint32_t idle = kPpm - used;
  // What the container could take without taking from anyone: up to the ceiling, never others' use.
  uint32_t room = kPpm - others;
  if (room > ceiling) room = ceiling;
  if (!in.high_priority && others > kMarginPpm) room = share;  // low priority: extra only when alone
  if (room < share) room = share;
  uint32_t rate = in.rate_ppm < share ? share : in.rate_ppm;
  if (idle <= kMarginPpm) {
    // Saturated: others may be waiting. Give back what is above the share, step by step (never preempting:
    // only the launch rate drops). Low priority gives it all back at once.
    if (rate > share) {
      if (!in.high_priority) {
        rate = share;
      } else {
        uint32_t step = (rate - share) / 2;
        if (step < kMinStepPpm) step = kMinStepPpm;
        rate = rate - share > step ? rate - step : share;
      }
    }
  } else if (in.wanted_more && rate < room) {
    // Idle compute and a container that wants more: take half of what is idle each step.
    uint32_t grow = idle / 2;
    if (grow < kMinStepPpm) grow = kMinStepPpm;
    rate = rate + grow > room ? room : rate + grow;
  }
  if (rate > room) rate = room;
  return rate;
}

bool ElasticController::Step(ControllerState* c, BucketState* b, uint64_t now_ns, int32_t device_util_ppm,
                             bool alone) {
  uint64_t last = c->last_step_ns.load(std::memory_order_relaxed);
  if (last != 0 && now_ns - last < kStepNs) return false;
  if (!c->last_step_ns.compare_exchange_strong(last, now_ns, std::memory_order_acq_rel)) return false;
  const uint64_t refilled = b->refilled_total_ns.load(std::memory_order_relaxed);
  const int64_t tokens = b->tokens_ns.load(std::memory_order_relaxed);
  const uint64_t waits = b->waits.load(std::memory_order_relaxed);
  const uint64_t prev_refilled = c->last_refilled_ns.exchange(refilled, std::memory_order_relaxed);
  const int64_t prev_tokens = c->last_tokens_ns.exchange(tokens, std::memory_order_relaxed);
  const uint64_t prev_waits = c->last_waits.exchange(waits, std::memory_order_relaxed);
  if (last == 0) return true;  // the first step only takes the baseline
  // Budget used in the interval: what was added minus what is left over.
  const int64_t consumed = static_cast<int64_t>(refilled - prev_refilled) - (tokens - prev_tokens);
  const uint64_t interval = now_ns - last;
  int64_t own = consumed <= 0 ? 0 : static_cast<int64_t>(static_cast<Uint128>(consumed) * kPpm / interval);
  if (own > static_cast<int64_t>(kPpm)) own = kPpm;
  c->own_util_ppm.store(static_cast<uint32_t>(own), std::memory_order_relaxed);
  c->device_util_ppm.store(device_util_ppm, std::memory_order_relaxed);
  if (c->policy.load(std::memory_order_relaxed) != 1) return true;  // hard: nothing to decide
  ElasticInputs in;
  in.share_ppm = c->share_ppm.load(std::memory_order_relaxed);
  in.ceiling_ppm = c->ceiling_ppm.load(std::memory_order_relaxed);
  in.high_priority = c->priority.load(std::memory_order_relaxed) == 1;
  in.rate_ppm = b->rate_ppm.load(std::memory_order_relaxed);
  in.own_util_ppm = static_cast<uint32_t>(own);
  in.device_util_ppm = device_util_ppm;
  in.wanted_more = waits != prev_waits;
  in.alone = alone;
  TokenBucket::SetRate(b, NextRate(in));
  return true;
}

void KernelCostTable::Record(uint64_t key, int64_t measured_ns) {
  if (measured_ns < 0) return;
  fallback_ns_.store(measured_ns, std::memory_order_relaxed);
  Entry& e = entries_[Index(key)];
  if (e.key.load(std::memory_order_acquire) != key) return;  // taken over by another kind meanwhile
  const int64_t est = e.estimate_ns.load(std::memory_order_relaxed);
  if (est >= 0 && e.window_count == 0 && measured_ns > est + est / 4) {
    // A kind that became longer (same function and shape, more work): measure the next launches of this kind
    // again and take the new window's minimum, instead of charging the stale estimate for kSampleEvery
    // launches.
    e.launches.store(0, std::memory_order_relaxed);
  }
  if (e.window_count == 0 || measured_ns < e.window_min) e.window_min = measured_ns;
  ++e.window_count;
  // Until a window is complete, the running minimum is the best estimate; afterwards the minimum of the last
  // full window, and a lower sample takes effect at once.
  if (est < 0 || measured_ns < est) e.estimate_ns.store(e.window_min, std::memory_order_relaxed);
  if (e.window_count >= kWindow) {
    e.estimate_ns.store(e.window_min, std::memory_order_relaxed);
    e.window_count = 0;
  }
}

int64_t KernelCostTable::Estimate(uint64_t key) const {
  const Entry& e = entries_[Index(key)];
  if (e.key.load(std::memory_order_acquire) != key) return -1;
  return e.estimate_ns.load(std::memory_order_relaxed);
}

void KernelCostTable::Clear() {
  for (Entry& e : entries_) {
    e.key.store(0, std::memory_order_relaxed);
    e.estimate_ns.store(-1, std::memory_order_relaxed);
    e.launches.store(0, std::memory_order_relaxed);
    e.window_count = 0;
    e.window_min = 0;
  }
  fallback_ns_.store(0, std::memory_order_relaxed);
}

bool SampleRing::Push(const Sample& s) {
  const uint32_t start = next_.fetch_add(1, std::memory_order_relaxed);
  for (int i = 0; i < kCapacity; ++i) {
    Cell& c = cells_[(start + static_cast<uint32_t>(i)) % kCapacity];
    uint32_t expected = kFree;
    if (c.state.compare_exchange_strong(expected, kWriting, std::memory_order_acquire)) {
      c.sample = s;
      in_flight_.fetch_add(1, std::memory_order_relaxed);  // before Drain can see the cell
      c.state.store(kReady, std::memory_order_release);
      return true;
    }
  }
  return false;
}

void TokenBucket::WaitForBudget(BucketState* b) {
  bool counted = false;
  uint64_t started = 0;
  for (;;) {
    const uint64_t now = MonotonicNs();
    Refill(b, now);
    const uint64_t wait = WaitNs(b, ResumeNs(b));
    if (wait == 0 || Unlimited(b)) break;
    if (!counted) {
      b->waits.fetch_add(1, std::memory_order_relaxed);
      started = now;
      counted = true;
    }
    SleepNs(wait < 2000000 ? wait : 2000000);
  }
  if (counted) b->waited_ns.fetch_add(MonotonicNs() - started, std::memory_order_relaxed);
}

}  // namespace tessera::hook
