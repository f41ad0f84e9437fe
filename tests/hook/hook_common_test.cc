// src/hook/common on its own: the limiter's policy classes with time passed in (no clock, no sleeping), the
// limits file, and the shared region's crash safety with real processes killed while they hold its locks.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "hook/common/limiter.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/registration.h"

namespace tessera::hook {
namespace {

constexpr uint64_t kMs = 1000000;

TEST(TokenBucketTest, FillsAtTheShareAndPacesLaunches) {
  BucketState b{};
  TokenBucket::Configure(&b, 300000, 1000 * kMs);  // 30%
  EXPECT_FALSE(TokenBucket::Unlimited(&b));
  EXPECT_EQ(b.tokens_ns.load(), 6 * static_cast<int64_t>(kMs));  // 20 ms burst window at 30%
  // Launches take budget until it is gone; then the caller must wait.
  int launched = 0;
  while (TokenBucket::TryTake(&b, 2 * kMs)) ++launched;
  EXPECT_EQ(launched, 3);
  EXPECT_LE(TokenBucket::WaitNs(&b), 10u);  // at zero: a few nanoseconds of refill make it positive
  // Over one simulated second at 30%, kernels of 2 ms get 300 ms of GPU time (+ the burst).
  uint64_t now = 1000 * kMs;
  int64_t used = 0;
  for (int step = 0; step < 1000; ++step) {
    now += kMs;
    TokenBucket::Refill(&b, now);
    while (TokenBucket::TryTake(&b, 2 * kMs)) used += 2 * kMs;
  }
  EXPECT_NEAR(static_cast<double>(used) / 1e9, 0.300, 0.004);
}

TEST(TokenBucketTest, WaitIsTheDeficitAtTheRate) {
  BucketState b{};
  TokenBucket::Configure(&b, 500000, 10 * kMs);
  TokenBucket::Take(&b, b.tokens_ns.load() + 4 * kMs);                       // 4 ms in debt
  EXPECT_NEAR(static_cast<double>(TokenBucket::WaitNs(&b)), 8.0 * kMs, 10);  // at 50%: 8 ms
  // A waiting launch resumes with 2 ms of budget (a burst, not one kernel per refill): 4 + 2 ms at 50%.
  EXPECT_EQ(TokenBucket::ResumeNs(&b), static_cast<int64_t>(2 * kMs));
  EXPECT_NEAR(static_cast<double>(TokenBucket::WaitNs(&b, TokenBucket::ResumeNs(&b))), 12.0 * kMs, 10);
  TokenBucket::Refill(&b, 19 * kMs);
  EXPECT_EQ(TokenBucket::WaitNs(&b), 0u);
  EXPECT_GT(TokenBucket::WaitNs(&b, TokenBucket::ResumeNs(&b)), 0u);  // half a ms of budget: not yet
  TokenBucket::Refill(&b, 22 * kMs);
  EXPECT_EQ(TokenBucket::WaitNs(&b, TokenBucket::ResumeNs(&b)), 0u);
  // Every bucket holds at least twice that (1% of a GPU: 4 ms, not 0.2), so a waiter that wakes late does not
  // find it full with the refill since lost.
  TokenBucket::SetRate(&b, 10000);
  EXPECT_EQ(b.capacity_ns.load(), static_cast<int64_t>(4 * kMs));
  EXPECT_EQ(TokenBucket::ResumeNs(&b), static_cast<int64_t>(2 * kMs));
  TokenBucket::SetRate(&b, kPpm);
  EXPECT_TRUE(TokenBucket::Unlimited(&b));
}

TEST(TokenBucketTest, IdleTimeSavesOnlyABurst) {
  BucketState b{};
  TokenBucket::Configure(&b, 100000, kMs);
  TokenBucket::Refill(&b, 3600000 * kMs);  // an hour idle
  EXPECT_EQ(b.tokens_ns.load(), b.capacity_ns.load());
  EXPECT_EQ(b.capacity_ns.load(), static_cast<int64_t>(4 * kMs));  // 20 ms at 10% is 2: at least 4
}

// The limiter thread's work, simulated: every millisecond the bucket refills and the tab epoch moves on.
struct Ticks {
  BucketState* b;
  uint64_t now;
  uint32_t epoch = 1;
  void Advance(uint64_t ns) {
    const uint64_t next = now + ns;
    if (next / kMs != now / kMs) {
      TokenBucket::Refill(b, next);
      ++epoch;
    }
    now = next;
  }
};

// One thread's launch of `cost` on its tab, as the hooks' launch paths do it (without the wait): true when it
// was charged and may run.
bool Launch(Tab* t, BucketState* b, uint32_t epoch, int64_t cost) {
  if (TokenBucket::RunUp(t, b, epoch, cost)) return true;
  TokenBucket::Settle(t);
  return TokenBucket::Open(t, b, epoch, cost);
}

// Launches put on per-thread tabs and settled in batches must not let a container take more than the bucket
// gives over a window: what a thread owes from before an idle spell is charged, not forgotten, and no thread
// runs up a tab the bucket does not cover; nothing is lost either, whichever thread launches when.
TEST(TabTest, TabsNeverTakeMoreThanTheShareOverAWindow) {
  constexpr int kThreads = 8;
  constexpr int64_t kCost = 10000;  // 10 us kernels
  constexpr uint64_t kStep = 10000;
  BucketState b{};
  TokenBucket::Configure(&b, 300000, kMs);  // 30%: a 6 ms bucket; a batch is at most 6 ms / 32
  Ticks t{&b, kMs};
  Tab tabs[kThreads] = {};
  // For `ns`, every thread that `active(i, now)` names launches up to `per_step` kernels each step, as far as
  // the bucket lets it: one thread's launches after the other's, or (`interleaved`) one launch of each thread
  // in turn, as threads running at once do. Returns the GPU time launched.
  auto run = [&](uint64_t ns, int per_step, auto active, bool interleaved = false) {
    int64_t used = 0;
    for (uint64_t end = t.now + ns; t.now < end; t.Advance(kStep)) {
      for (int i = 0; i < kThreads; ++i) {
        if (!active(i, t.now)) continue;
        for (int n = 0; n < (interleaved ? 1 : per_step) && Launch(&tabs[i], &b, t.epoch, kCost); ++n) {
          used += kCost;
        }
      }
      for (int round = 1; interleaved && round < per_step; ++round) {
        bool any = false;
        for (int i = 0; i < kThreads; ++i) {
          if (active(i, t.now) && Launch(&tabs[i], &b, t.epoch, kCost)) {
            used += kCost;
            any = true;
          }
        }
        if (!any) break;
      }
    }
    return used;
  };
  auto all = [](int, uint64_t) { return true; };
  // Eight threads launch a kernel each per step for 100 us, then pause for a second while the bucket fills
  // up again: they stop owing what they launched.
  EXPECT_EQ(run(10 * kStep, 1, all), kThreads * 10 * kCost);
  int64_t owed = 0;
  for (const Tab& x : tabs) owed += x.owed_ns;
  EXPECT_GT(owed, 4 * kThreads * kCost) << "the threads should stop owing (the case under test)";
  run(1000 * kMs, 1, [](int, uint64_t) { return false; });
  // The burst after the idle spell, launching as fast as allowed: the saved-up burst and the refills less
  // what was owed, plus at most one launch per thread (a launch runs when the bucket is above zero).
  const uint64_t window = 50 * kMs;
  const int64_t burst = run(window, 1000, all);
  const int64_t most = b.capacity_ns.load() + static_cast<int64_t>(window) * 3 / 10 + kThreads * kCost - owed;
  EXPECT_LE(burst, most) << "launches owed from before the idle spell were never charged, or a tab ran past "
                            "the bucket";
  EXPECT_GE(burst, most - kThreads * kCost - static_cast<int64_t>(2 * kMs) * 3 / 10);
  // The same with the threads' launches interleaved: each thread sees the bucket without what the others owe
  // and not yet settled, so together they run ahead by at most a batch each (1/32 of the bucket).
  run(1000 * kMs, 1, [](int, uint64_t) { return false; });
  const int64_t interleaved = run(window, 1000, all, /*interleaved=*/true);
  const int64_t ahead = kThreads * (b.capacity_ns.load() / TokenBucket::kBatchCapacityDivisor + kCost);
  EXPECT_LE(interleaved, b.capacity_ns.load() + static_cast<int64_t>(window) * 3 / 10 + ahead)
      << "threads ran up tabs past the bucket: a tab must be settled at a batch";
  EXPECT_GE(interleaved, b.capacity_ns.load() + static_cast<int64_t>(window) * 3 / 10 - 2 * kCost);
  // Threads taking turns of 100 us, each leaving a tab behind when its turn ends. Over a second they get the
  // share, no more, no less.
  const int64_t turns =
      run(1000 * kMs, 1, [](int i, uint64_t now) { return static_cast<int>(now / 100000 % kThreads) == i; });
  EXPECT_NEAR(static_cast<double>(turns) / 1e9, 0.300, 0.008);
}

// A thread that exits settles its tab (the hooks' launch path registers it): what it launched is charged.
TEST(TabTest, AThreadThatExitsSettlesItsTab) {
  BucketState b{};
  TokenBucket::Configure(&b, 500000, kMs);
  const int64_t full = b.tokens_ns.load();
  std::thread launcher([&] {
    for (int i = 0; i < 3; ++i) TokenBucket::ChargeLaunch(&b, 1000);
    EXPECT_EQ(ThreadTab()->owed_ns, 3000);
    EXPECT_EQ(b.tokens_ns.load(), full) << "three launches stay on the tab (no atomic operation each)";
  });
  launcher.join();
  EXPECT_EQ(b.tokens_ns.load(), full - 3000) << "the exited thread's launches were never charged";
  // A batch: a tab is settled before it owes more than 64 launches (or 1/32 of the bucket).
  Tab tab{};
  ASSERT_TRUE(TokenBucket::Open(&tab, &b, 5, 1000));
  for (int i = 1; i < 64; ++i) ASSERT_TRUE(TokenBucket::RunUp(&tab, &b, 5, 1000));
  EXPECT_FALSE(TokenBucket::RunUp(&tab, &b, 5, 1000)) << "a full batch is settled first";
  Tab older = tab;
  older.owed_ns = 0;
  EXPECT_TRUE(TokenBucket::RunUp(&older, &b, 5, 1000));
  EXPECT_FALSE(TokenBucket::RunUp(&older, &b, 6, 1000)) << "a tab from an older epoch is settled first";
  TokenBucket::Settle(&tab);
  EXPECT_EQ(b.tokens_ns.load(), full - 3000 - 64000);
  EXPECT_EQ(tab.owed_ns, 0);
}

// A tab never runs past the bucket: a launch runs while the bucket holds more than the thread owes (the
// bucket as if settled is above zero, as TryTake asks), and an empty bucket charges nothing until the caller
// waited.
TEST(TabTest, ATabRunsOnlyOnWhatTheBucketHolds) {
  BucketState b{};
  TokenBucket::Configure(&b, 500000, kMs);
  TokenBucket::Take(&b, b.tokens_ns.load() - 4500);  // 4.5 us left
  Tab tab{};
  int launched = 0;
  while (launched < 100 && Launch(&tab, &b, 1, 1000)) ++launched;
  EXPECT_EQ(launched, 5) << "as TryTake: 4.5 us of budget runs five launches of 1 us";
  EXPECT_EQ(b.tokens_ns.load(), -500) << "settled when the bucket ran dry";
  EXPECT_EQ(tab.owed_ns, 0);
  EXPECT_FALSE(TokenBucket::Open(&tab, &b, 1, 1000));
  ASSERT_TRUE(TokenBucket::Open(&tab, &b, 1, 1000, /*force=*/true));  // after the wait
  TokenBucket::Settle(&tab);
  EXPECT_EQ(b.tokens_ns.load(), -1500);
}

ElasticInputs Inputs(uint32_t rate, uint32_t own, int32_t device, bool wanted) {
  ElasticInputs in;
  in.share_ppm = 300000;
  in.ceiling_ppm = 900000;
  in.rate_ppm = rate;
  in.own_util_ppm = own;
  in.device_util_ppm = device;
  in.wanted_more = wanted;
  return in;
}

TEST(ElasticControllerTest, GrowsIntoIdleComputeUpToTheCeiling) {
  uint32_t rate = 300000;
  for (int step = 0; step < 20; ++step)
    rate = ElasticController::NextRate(Inputs(rate, rate, static_cast<int32_t>(rate), true));
  EXPECT_EQ(rate, 900000u);
  // Not wanting more: no growth.
  EXPECT_EQ(ElasticController::NextRate(Inputs(300000, 100000, 100000, false)), 300000u);
}

TEST(ElasticControllerTest, GivesTheExcessBackWhenOthersNeedIt) {
  // Low priority at 90% with another tenant on a saturated GPU: back to the share at once.
  EXPECT_EQ(ElasticController::NextRate(Inputs(900000, 600000, 1000000, true)), 300000u);
  // High priority gives back step by step, never below the share.
  ElasticInputs in = Inputs(900000, 600000, 1000000, true);
  in.high_priority = true;
  uint32_t rate = 900000;
  int steps = 0;
  while (rate > 300000 && steps < 50) {
    in.rate_ppm = rate;
    rate = ElasticController::NextRate(in);
    ++steps;
  }
  EXPECT_EQ(rate, 300000u);
  EXPECT_GT(steps, 1);
}

TEST(ElasticControllerTest, AloneTheUtilizationAboveItsOwnUseIsNotAnotherTenant) {
  // At its 90% ceiling, NVML reading 6 points above: with others possibly on the GPU that is another tenant's
  // use, and low priority goes back to its share; alone (NVML lists no other process) it keeps growing.
  EXPECT_EQ(ElasticController::NextRate(Inputs(900000, 880000, 940000, true)), 300000u);
  uint32_t rate = 300000;
  for (int step = 0; step < 20; ++step) {
    ElasticInputs in = Inputs(rate, rate, static_cast<int32_t>(rate + 60000), true);
    in.alone = true;
    rate = ElasticController::NextRate(in);
  }
  EXPECT_EQ(rate, 900000u);
  // Alone without a utilization figure: the container's own use is all there is.
  ElasticInputs in = Inputs(300000, 300000, -1, true);
  in.alone = true;
  EXPECT_GT(ElasticController::NextRate(in), 300000u);
}

TEST(ElasticControllerTest, HardOrUnknownKeepsTheShare) {
  ElasticInputs in = Inputs(300000, 300000, -1, true);
  EXPECT_EQ(ElasticController::NextRate(in), 300000u);
  in.ceiling_ppm = 300000;
  in.device_util_ppm = 300000;
  EXPECT_EQ(ElasticController::NextRate(in), 300000u);
}

TEST(ElasticControllerTest, StepMeasuresUseFromTheBucket) {
  BucketState b{};
  ControllerState c{};
  c.share_ppm = 300000;
  c.ceiling_ppm = 900000;
  c.policy = 1;
  TokenBucket::Configure(&b, 300000, kMs);
  EXPECT_TRUE(ElasticController::Step(&c, &b, kMs, 300000));       // baseline
  EXPECT_FALSE(ElasticController::Step(&c, &b, 2 * kMs, 300000));  // too soon
  // 200 ms at 30% with every launch waiting: the container used all its budget and wants more.
  uint64_t now = kMs;
  for (int i = 0; i < 200; ++i) {
    now += kMs;
    TokenBucket::Refill(&b, now);
    while (TokenBucket::TryTake(&b, kMs / 2)) {
    }
    b.waits.fetch_add(1);
  }
  EXPECT_TRUE(ElasticController::Step(&c, &b, now, 320000));
  EXPECT_NEAR(c.own_util_ppm.load(), 300000, 40000);
  EXPECT_GT(b.rate_ppm.load(), 300000u) << "alone on an idle GPU: grows";
}

TEST(KernelCostTableTest, EstimatesFromTheMinimumAndFollowsLongerKernels) {
  auto t = std::make_unique<KernelCostTable>();
  KernelCostTable::Lookup l = t->Find(42);
  EXPECT_TRUE(l.sample);
  for (int i = 0; i < 4; ++i) t->Record(42, i == 2 ? 1000 : 1500);  // queueing makes samples longer
  EXPECT_EQ(t->Estimate(42), 1000);
  for (int i = 0; i < 100; ++i) t->Find(42);
  EXPECT_FALSE(t->Find(42).sample);
  t->Record(42, 4000);  // the kind became longer: the next launches are measured again
  EXPECT_TRUE(t->Find(42).sample);
  for (int i = 0; i < 3; ++i) t->Record(42, 4000);
  EXPECT_EQ(t->Estimate(42), 4000);
  EXPECT_EQ(t->Find(7).estimate_ns, 4000) << "an unmeasured kind costs what the last measurement did";
}

// The launch fast path looks a kind up without counting it and counts it once the launch goes ahead; a launch
// it leaves to the slow path is counted there: every launch counted once, so every 64th is timed.
TEST(KernelCostTableTest, FastAndSlowPathsCountEachLaunchOnce) {
  auto t = std::make_unique<KernelCostTable>();
  // The first launch of a kind takes its entry over, the next kWindow are counted 0..3: all timed.
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(t->Find(42).sample) << "the first launches of a kind are timed";
  t->Record(42, 1000);
  int timed = 0;
  for (int i = 4; i < 4 + 640; ++i) {  // counts 4..643
    KernelCostTable::Cursor c;
    if (i % 3 == 0 && t->Peek(42, &c)) {  // a third of the launches take the fast path
      EXPECT_EQ(c.estimate_ns, 1000);
      KernelCostTable::Counted(c);
    } else if (t->Find(42).sample) {
      ++timed;
    }
  }
  EXPECT_EQ(timed, 10) << "one launch in 64 timed, whichever path counted the others";
  KernelCostTable::Cursor c;
  EXPECT_FALSE(t->Peek(7, &c)) << "a kind never seen goes to the slow path";
}

TEST(SampleRingTest, PushAndDrain) {
  auto ring = std::make_unique<SampleRing>();
  for (int i = 0; i < SampleRing::kCapacity; ++i)
    ASSERT_TRUE(ring->Push({static_cast<uint64_t>(i), 0, 0, 0, 0}));
  EXPECT_FALSE(ring->Push({1, 0, 0, 0, 0}));
  EXPECT_EQ(ring->Drain([](const SampleRing::Sample& s) { return s.key % 2 == 0; }),
            SampleRing::kCapacity / 2);
  EXPECT_EQ(ring->InFlight(), SampleRing::kCapacity / 2);
}

TEST(LimitsTest, RoundTripAndClearErrors) {
  Limits l;
  l.generation = 7;
  l.device_count = 2;
  CopyString(l.devices[0].uuid, sizeof(l.devices[0].uuid), "GPU-0000");
  l.devices[0].memory_bytes = 4ull << 30;
  l.devices[0].cores_percent = 30;
  l.devices[0].policy = ComputePolicy::kElastic;
  l.devices[1].index = kAnyDevice;
  l.devices[1].memory_bytes = 1ull << 30;
  char buf[2048];
  ASSERT_GT(FormatLimits(l, buf, sizeof(buf)), 0u);
  Limits back;
  Error error;
  ASSERT_TRUE(ParseLimits(buf, strlen(buf), &back, &error)) << error.text << "\n" << buf;
  EXPECT_EQ(back.generation, 7u);
  const DeviceLimits* d = FindDeviceLimits(back, "GPU-0000", 3);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->cores_percent, 30u);
  EXPECT_EQ(d->ceiling_percent, 90u);
  EXPECT_EQ(FindDeviceLimits(back, "GPU-other", 1)->memory_bytes, 1ull << 30);
  const char* bad = "tessera-limits 1\ngeneration 1\ngpu index=0 memory=lots\n";
  EXPECT_FALSE(ParseLimits(bad, strlen(bad), &back, &error));
  EXPECT_NE(std::string(error.text).find("line 3"), std::string::npos) << error.text;
  const char* future = "tessera-limits 9\n";
  EXPECT_FALSE(ParseLimits(future, strlen(future), &back, &error));
}

// The agent's lines name a GPU by UUID and by its place in the container's list: the place applies only to a
// device with no UUID of its own (docs/hook-abi.md), never to another GPU that happens to sit there.
TEST(LimitsTest, AnIndexBesideAUuidAppliesOnlyToADeviceWithoutOne) {
  Limits l;
  l.generation = 1;
  l.device_count = 1;
  CopyString(l.devices[0].uuid, sizeof(l.devices[0].uuid), "GPU-aaaa");
  l.devices[0].index = 0;
  l.devices[0].memory_bytes = 1ull << 30;
  char buf[1024];
  ASSERT_GT(FormatLimits(l, buf, sizeof(buf)), 0u);
  EXPECT_NE(std::string(buf).find("uuid=GPU-aaaa index=0"), std::string::npos) << buf;
  Limits back;
  Error error;
  ASSERT_TRUE(ParseLimits(buf, strlen(buf), &back, &error)) << error.text;
  EXPECT_NE(FindDeviceLimits(back, "GPU-aaaa", 5), nullptr) << "by its UUID, wherever it sits";
  EXPECT_EQ(FindDeviceLimits(back, "GPU-bbbb", 0), nullptr) << "another GPU at that place is not it";
  EXPECT_NE(FindDeviceLimits(back, nullptr, 0), nullptr) << "a device without a UUID at that place is it";
  EXPECT_NE(FindDeviceLimits(back, "", 0), nullptr);
  EXPECT_EQ(FindDeviceLimits(back, nullptr, 1), nullptr);
}

// tenants= (the agent's count of the GPU's containers) is written only when known, read back, and bounded.
TEST(LimitsTest, TenantsAreWrittenWhenKnownAndBounded) {
  Limits l;
  l.generation = 1;
  l.device_count = 2;
  l.devices[0].index = 0;
  l.devices[0].tenants = 3;
  l.devices[1].index = 1;
  char buf[1024];
  ASSERT_GT(FormatLimits(l, buf, sizeof(buf)), 0u);
  EXPECT_NE(std::string(buf).find("index=0 memory=unlimited cores=100 policy=hard ceiling=100 priority=low "
                                  "tenants=3\n"),
            std::string::npos)
      << buf;
  EXPECT_EQ(std::string(buf).find("tenants=0"), std::string::npos) << buf;
  Limits back;
  Error error;
  ASSERT_TRUE(ParseLimits(buf, strlen(buf), &back, &error)) << error.text;
  EXPECT_EQ(back.devices[0].tenants, 3u);
  EXPECT_EQ(back.devices[1].tenants, 0u);
  for (const char* bad : {"0", "1001", "two", "-1", "18446744073709551617"}) {
    const std::string text = std::string("tessera-limits 1\ngeneration 1\ngpu index=0 memory=1 cores=50 tenants=") +
                             bad + "\n";
    EXPECT_FALSE(ParseLimits(text.c_str(), text.size(), &back, &error)) << bad;
    EXPECT_NE(std::string(error.text).find("tenants must be 1..1000"), std::string::npos) << error.text;
  }
}

// No memory limit is written `unlimited` and read back as none; `memory=0` and a key given twice (a trailing
// memory=0 used to win) are errors that say what to do; the environment refuses 0 bytes the same way.
TEST(LimitsTest, ZeroAndDuplicateKeysAreRefusedUnlimitedIsExplicit) {
  Limits l;
  l.generation = 1;
  l.device_count = 1;
  l.devices[0].index = kAnyDevice;
  char buf[1024];
  ASSERT_GT(FormatLimits(l, buf, sizeof(buf)), 0u);
  EXPECT_NE(std::string(buf).find("memory=unlimited"), std::string::npos) << buf;
  Limits back;
  Error error;
  ASSERT_TRUE(ParseLimits(buf, strlen(buf), &back, &error)) << error.text;
  EXPECT_EQ(back.devices[0].memory_bytes, 0u);
  const char* zero = "tessera-limits 1\ngeneration 1\ngpu index=* memory=0 cores=50\n";
  EXPECT_FALSE(ParseLimits(zero, strlen(zero), &back, &error));
  EXPECT_NE(std::string(error.text).find("unlimited"), std::string::npos) << error.text;
  const char* twice = "tessera-limits 1\ngeneration 1\ngpu index=* memory=1048576 cores=50 memory=0\n";
  EXPECT_FALSE(ParseLimits(twice, strlen(twice), &back, &error));
  EXPECT_NE(std::string(error.text).find("memory= is given twice"), std::string::npos) << error.text;
  const char* cores_twice = "tessera-limits 1\ngeneration 1\ngpu index=* memory=1 cores=50 cores=100\n";
  EXPECT_FALSE(ParseLimits(cores_twice, strlen(cores_twice), &back, &error));
  for (const char* value : {"0", "0MiB", "0.0000000001GiB"}) {
    static const char* v;
    v = value;
    bool configured = false;
    EXPECT_FALSE(LimitsFromEnvironment(
        [](const char* name) -> const char* { return strcmp(name, "TESSERA_GPU_MEMORY_LIMIT") == 0 ? v : nullptr; },
        &back, &configured, &error))
        << value;
    EXPECT_NE(std::string(error.text).find("zero bytes"), std::string::npos) << error.text;
  }
}

// The agent's answer carries the caller's host pid (what NVML lists), and the hook reads it.
TEST(RegistrationTest, OkCarriesTheHostPid) {
  AgentMessage m;
  m.kind = AgentMessageKind::kOk;
  m.generation = 4;
  m.host_pid = 81234;
  char line[256];
  ASSERT_GT(FormatAgentMessage(m, line, sizeof(line)), 0u);
  EXPECT_STREQ(line, "TESSERA 1 OK generation=4 host_pid=81234\n");
  AgentMessage back;
  Error error;
  ASSERT_TRUE(ParseAgentMessage(line, strlen(line), &back, &error)) << error.text;
  EXPECT_EQ(back.host_pid, 81234u);
  const char* bad = "TESSERA 1 OK generation=4 host_pid=x\n";
  EXPECT_FALSE(ParseAgentMessage(bad, strlen(bad), &back, &error));
}

class RegionTest : public ::testing::Test {
 protected:
  RegionTest() {
    char tmpl[] = "/tmp/tessera-region-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    path_ = dir_ + "/region";
  }
  ~RegionTest() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::string dir_;
  std::string path_;
};

// A process killed while it holds a device lock leaves it to the next locker, who repairs the totals; a
// killed process's charges are reclaimed.
TEST_F(RegionTest, KilledLockHolderAndKilledChargerLeaveNothing) {
  SharedRegion region;
  Error error;
  ASSERT_TRUE(region.Open(path_.c_str(), &error) && region.Attach(&error)) << error.text;
  const int dev = region.FindOrAddDevice("GPU-test", &error);
  ASSERT_GE(dev, 0);
  DeviceLimits limits;
  limits.memory_bytes = 1000;
  region.SetDeviceLimits(dev, limits, 1);
  for (int round = 0; round < 3; ++round) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    const pid_t pid = fork();
    if (pid == 0) {
      region.ForgetSlot();
      Error e;
      if (!region.Attach(&e) || region.TryCharge(dev, 600) != ChargeResult::kOk) _exit(3);
      if (round != 0) pthread_mutex_lock(&region.device(dev)->lock);  // and die holding the lock
      if (write(ready[1], "x", 1) != 1) _exit(4);
      pause();
      _exit(0);
    }
    char c;
    ASSERT_EQ(read(ready[0], &c, 1), 1);
    EXPECT_EQ(region.Used(dev), 600u);
    if (round == 0) {
      EXPECT_EQ(region.TryCharge(dev, 600), ChargeResult::kOverLimit);
    }
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    close(ready[0]);
    close(ready[1]);
    EXPECT_EQ(region.ReclaimDeadSlots(), 1);
    ASSERT_EQ(region.TryCharge(dev, 1000), ChargeResult::kOk) << "round " << round;
    EXPECT_TRUE(region.CheckConsistent(dev));
    region.Uncharge(dev, 1000);
    EXPECT_EQ(region.Used(dev), 0u);
  }
  region.Detach();
  region.Close();
}

// Hundreds of processes attach, charge and exit at once; none waits on another for long, nothing leaks.
TEST_F(RegionTest, HundredsOfProcessesAtOnce) {
  SharedRegion region;
  Error error;
  ASSERT_TRUE(region.Open(path_.c_str(), &error)) << error.text;
  const int dev = region.FindOrAddDevice("GPU-test", &error);
  DeviceLimits limits;
  limits.memory_bytes = 100 * 300;
  region.SetDeviceLimits(dev, limits, 1);
  std::vector<pid_t> pids;
  for (int i = 0; i < 300; ++i) {
    const pid_t pid = fork();
    if (pid == 0) {
      SharedRegion r;
      Error e;
      if (!r.Open(path_.c_str(), &e) || !r.Attach(&e)) _exit(3);
      if (r.TryCharge(dev, 100) != ChargeResult::kOk) _exit(4);
      if (i % 2 == 0) r.Detach();  // half exit cleanly, half just die holding their charge
      _exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << WEXITSTATUS(status);
  }
  region.ReclaimDeadSlots();
  EXPECT_EQ(region.Used(dev), 0u);
  EXPECT_TRUE(region.CheckConsistent(dev));
  region.Close();
}

// A process exits (Detach, from the library's destructor) while its limiter thread still charges and
// uncharges: nothing lands in the slot being freed, nothing is written outside it, and a charge after the
// exit is refused with kDetached. Before charges read the slot under the device lock, a charge racing the
// exit stayed in the freed slot and the total never came back to zero.
TEST_F(RegionTest, ChargesRacingAnExitLeaveNothingBehind) {
  SharedRegion observer;
  Error error;
  ASSERT_TRUE(observer.Open(path_.c_str(), &error)) << error.text;
  const int dev = observer.FindOrAddDevice("GPU-test", &error);
  for (int round = 0; round < 200; ++round) {
    SharedRegion region;
    ASSERT_TRUE(region.Open(path_.c_str(), &error) && region.Attach(&error)) << error.text;
    std::atomic<bool> stop{false};
    std::atomic<int> rounds{0};
    std::thread limiter([&] {
      while (!stop.load()) {
        region.ForceCharge(dev, 4096);
        region.Uncharge(dev, 4096);
        rounds.fetch_add(1);
      }
    });
    while (rounds.load() < 1 + round % 7) sched_yield();
    region.Detach();
    EXPECT_EQ(region.TryCharge(dev, 1), ChargeResult::kDetached);
    stop.store(true);
    limiter.join();
    ASSERT_EQ(observer.Used(dev), 0u) << "round " << round;
    ASSERT_TRUE(observer.CheckConsistent(dev)) << "round " << round;
    region.Close();
  }
  observer.Close();
}

TEST_F(RegionTest, ForeignFileIsRefusedWithAClearMessage) {
  FILE* f = fopen(path_.c_str(), "w");
  fputs("not a region", f);
  fclose(f);
  SharedRegion region;
  Error error;
  EXPECT_FALSE(region.Open(path_.c_str(), &error));
  EXPECT_FALSE(error.empty());
  EXPECT_NE(std::string(error.text).find(path_), std::string::npos) << error.text;
}

}  // namespace
}  // namespace tessera::hook
