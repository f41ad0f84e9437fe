// libtessera-cuda.so in real processes against the fake driver: memory limits on every allocation path,
// reached through dlsym and both cuGetProcAddress signatures; out of memory as an error, never a kill; what
// cuMemGetInfo, cuDeviceTotalMem and NVML report; concurrent processes charging one quota; SIGKILL at random
// points; limits rewritten at run time; compute shares of two tenants on the simulated GPU.
#include <gtest/gtest.h>
#include <signal.h>
#include <time.h>

#include <random>

#include "hook/common/limiter.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/hook_process.h"
#include "run_delay.h"

namespace tessera::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kLimit = 256 * kMiB;
constexpr uint64_t kContext = 16 * kMiB;  // FAKECUDA_CONTEXT_BYTES in the sandbox

std::string N(uint64_t v) {
  return std::to_string(v);
}

uint64_t Now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The container's use as the shared region records it (after reclaiming dead processes' slots).
uint64_t RegionUsed(const std::string& path, uint64_t* peak = nullptr, bool* consistent = nullptr) {
  hook::SharedRegion region;
  hook::Error error;
  if (!region.Open(path.c_str(), &error)) {
    ADD_FAILURE() << error.text;
    return UINT64_MAX;
  }
  region.ReclaimDeadSlots();
  const int dev = region.device_count() > 0 ? 0 : -1;
  const uint64_t used = dev >= 0 ? region.Used(dev) : 0;
  if (peak != nullptr) *peak = dev >= 0 ? region.device(dev)->peak_bytes.load() : 0;
  if (consistent != nullptr) *consistent = dev < 0 || region.CheckConsistent(dev);
  region.Close();
  return used;
}

class HookMemoryTest : public ::testing::TestWithParam<std::string> {
 protected:
  HookMemoryTest() { box_.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB"; }
  HookSandbox box_;
};

// Every path that takes device memory is charged exactly: what is left after the context fits, one byte more
// does not, and everything comes back on free.
TEST_P(HookMemoryTest, EveryAllocationPathIsChargedAndReleased) {
  const std::string via = GetParam();
  const uint64_t room = kLimit - kContext;
  const std::vector<std::vector<std::string>> paths = {
      {"alloc", N(room)}, {"managed", N(room)}, {"vmm", N(room)},
      {"async", N(room)}, {"pool", N(room)},    {"graphalloc", N(room)},
  };
  for (const auto& take : paths) {
    std::vector<std::string> args{via, "init", "ctx", "meminfo"};
    args.insert(args.end(), take.begin(), take.end());
    for (const char* more : {"alloc", "managed", "vmm", "async", "pool", "graphalloc"}) {
      args.push_back(more);
      args.push_back("1");
    }
    args.insert(args.end(), {"meminfo", "freeall", "meminfo", "alloc", N(room), "freeall"});
    const ProbeResult r = box_.Run(args);
    ASSERT_TRUE(r.Exited0()) << r.out;
    SCOPED_TRACE(take[0] + "\n" + r.out);
    EXPECT_EQ(r.Field("meminfo", 2, 0), N(room));  // the context is charged
    EXPECT_EQ(r.Field(take[0], 1, 0), "0");
    for (const char* more : {"alloc", "managed", "vmm", "async", "pool", "graphalloc"}) {
      EXPECT_EQ(r.Field(more, 1, take[0] == more ? 1 : 0), "2")
          << more << ": one more byte must be OUT_OF_MEMORY";
    }
    EXPECT_EQ(r.Field("meminfo", 2, 1), "0");
    EXPECT_EQ(r.Field("freeall", 1, 0), "0");
    EXPECT_EQ(r.Field("meminfo", 2, 2), N(room)) << "everything given back";
    EXPECT_EQ(r.Field("alloc", 1, take[0] == "alloc" ? 2 : 1), "0");
  }
}

// Arrays, mipmapped arrays, pitched and legacy 32-bit allocations are charged and released; host memory is
// not.
TEST_P(HookMemoryTest, ArraysPitchAndLegacyPathsAreChargedHostIsNot) {
  const ProbeResult r =
      box_.Run({GetParam(), "init",    "ctx",   "meminfo", "array",   "1024",    "1024",        "meminfo",
                "array3d",  "256",     "256",   "16",      "meminfo", "mipmap",  "1024",        "1024",
                "4",        "heap",    "0",     "meminfo", "pitch",   "1000",    "1000",        "meminfo",
                "alloc32",  N(8 * kMiB),
                "meminfo",  "array32", "512",   "512",     "heap",    "0",       "meminfo",     "host",
                N(2 * kLimit), "heap", "0", "meminfo", "freeall", "heap", "0", "meminfo", "array", "16384", "16384"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  const uint64_t start = r.Num("meminfo", 2, 0);
  EXPECT_EQ(start, kLimit - kContext);
  EXPECT_LE(r.Num("meminfo", 2, 1), start - 4 * kMiB) << r.out;                   // 1024x1024 floats
  EXPECT_LE(r.Num("meminfo", 2, 2), r.Num("meminfo", 2, 1) - 4 * kMiB) << r.out;  // 256x256x16 floats
  EXPECT_LE(r.Num("meminfo", 2, 3), r.Num("meminfo", 2, 2) - 5 * kMiB) << r.out;  // 4 + 1 + 0.25 + ...
  EXPECT_EQ(r.Num("meminfo", 2, 4), r.Num("meminfo", 2, 3) - r.Num("pitch", 2)) << r.out;  // pitch x height
  EXPECT_EQ(r.Num("meminfo", 2, 5), r.Num("meminfo", 2, 4) - 8 * kMiB) << r.out;           // cuMemAlloc (v1)
  EXPECT_LE(r.Num("meminfo", 2, 6), r.Num("meminfo", 2, 5) - kMiB) << r.out;  // cuArrayCreate (v1)
  EXPECT_EQ(r.Field("host", 1), "0") << "host memory is not device memory";
  // What the driver holds beyond the arrays' estimates is charged by the footprint true-up, about four times a
  // second, whenever the limiter thread's tick lands; `heap 0` (cuCtxSetLimit, no change on the fake) trues up
  // at once. One after the mipmap makes the exact differences above independent of where a tick lands (under
  // ASan on a loaded machine one landed between the pitch and the legacy allocation, and the difference
  // counted the arrays' excess); after freeall the excess is given back at once too.
  EXPECT_EQ(r.Num("meminfo", 2, 7), r.Num("meminfo", 2, 6)) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 8), start) << r.out;
  EXPECT_EQ(r.Field("array", 1, 1), "2") << "a 1 GiB array is over the 256 MiB limit";
}

// The hook's charge for an array is an upper bound of what the driver takes (docs/isolation.md, "Arrays"), so
// filling a limit with arrays never puts more on the device than the limit. The fake takes what cuda.h gives
// an array (elements of the format's size x channels; a mipmapped array the sum of its levels). Against the
// old fake (4 bytes a component, a mipmapped array twice its level 0) both fills below put more on the device
// than the limit: the mipmaps about 330 MiB, the 8-bit arrays about 960 MiB, under 256 MiB.
TEST_P(HookMemoryTest, ArrayFillsUnderALimitNeverExceedItOnTheDevice) {
  const ProbeResult r =
      box_.Run({GetParam(), "init",    "ctx",     "texfill", "1024", "1024", "11", "32",
                "1",        "freeall", "texfill", "4096",    "4096", "0",    "1",  "1",
                "freeall",  "texfill", "300",     "200",     "5",    "16",   "4",  "freeall"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  // Each fill went on until the limit refused it (OUT_OF_MEMORY), after many arrays.
  EXPECT_EQ(r.Field("texfill", 1, 0), "2") << r.out;
  EXPECT_GE(r.Num("texfill", 2, 0), 20u) << r.out;  // 1024x1024 floats, 11 levels: 5.75 MiB each
  EXPECT_EQ(r.Field("texfill", 1, 1), "2") << r.out;
  EXPECT_GE(r.Num("texfill", 2, 1), 10u) << r.out;  // 4096x4096 8-bit: 16 MiB each
  EXPECT_EQ(r.Field("texfill", 1, 2), "2") << r.out;
  EXPECT_GE(r.Num("texfill", 2, 2), 100u) << r.out;  // 300x200 half x4, 5 levels: 1 MiB each
  FakeGpuView gpu(box_.Path("fakegpu.state"), box_.dir());
  EXPECT_LE(gpu.PeakBytes(), kLimit) << "the device held more than the container's limit";
}

// Out of memory is an error the program handles: it goes on, allocates what fits, and exits normally.
TEST_P(HookMemoryTest, OutOfMemoryIsAnErrorNotAKill) {
  const ProbeResult r = box_.Run({GetParam(), "init", "ctx", "alloc", N(kLimit), "alloc", N(kMiB), "fill",
                                  N(kMiB), "freeall", "exit", "7"});
  EXPECT_TRUE(WIFEXITED(r.status)) << r.out;
  EXPECT_EQ(WEXITSTATUS(r.status), 7);
  EXPECT_EQ(r.Field("alloc", 1, 0), "2");
  EXPECT_EQ(r.Field("alloc", 1, 1), "0");
  EXPECT_EQ(r.Field("fill", 1), "2");
  EXPECT_EQ(r.Num("fill", 2) + kMiB, kLimit - kContext);
}

// cuMemGetInfo (both widths), cuDeviceTotalMem and NVML's memory info (both versions) show the limit and the
// container's use, not the GPU's.
TEST_P(HookMemoryTest, MemoryInfoAndNvmlReportTheLimit) {
  const ProbeResult r = box_.Run(
      {GetParam(), "init", "ctx", "alloc", N(100 * kMiB), "meminfo", "meminfo32", "totalmem", "nvml"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  const uint64_t used = kContext + 100 * kMiB;
  EXPECT_EQ(r.Num("meminfo", 2), kLimit - used);
  EXPECT_EQ(r.Num("meminfo", 3), kLimit);
  EXPECT_EQ(r.Num("meminfo32", 2), kLimit - used);
  EXPECT_EQ(r.Num("meminfo32", 3), kLimit);
  EXPECT_EQ(r.Num("totalmem", 2), kLimit);
  EXPECT_EQ(r.Field("nvml", 1), "0");
  EXPECT_EQ(r.Num("nvml", 2), kLimit);
  EXPECT_EQ(r.Num("nvml", 3), used);
  EXPECT_EQ(r.Num("nvml", 4), kLimit);
  EXPECT_EQ(r.Num("nvml", 5), used);
}

INSTANTIATE_TEST_SUITE_P(Via, HookMemoryTest, ::testing::Values("dlsym", "proc11", "proc12"));

// Without limits the hook passes everything through: the whole fake GPU is visible.
TEST(HookTest, NoLimitsMeansUntouched) {
  HookSandbox box;
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "totalmem", "alloc", N(4096 * kMiB)});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Num("totalmem", 2), 16384 * kMiB);
  EXPECT_EQ(r.Field("alloc", 1), "0");
}

// Limits that cannot be read fail closed, with one line saying why.
TEST(HookTest, UnreadableLimitsFailClosed) {
  HookSandbox box;
  box.env["TESSERA_LIMITS_FILE"] = box.Path("missing-limits");
  const ProbeResult r = box.Run({"dlsym", "init"});
  EXPECT_EQ(r.Field("init", 1), "800") << r.out;  // CUDA_ERROR_NOT_PERMITTED
  HookSandbox box2;
  box2.env["TESSERA_GPU_MEMORY_LIMIT"] = "lots";
  const ProbeResult r2 = box2.Run({"dlsym", "init"});
  EXPECT_EQ(r2.Field("init", 1), "800") << r2.out;
}

// Processes of one container charge one quota concurrently: together they never pass the limit, by a byte,
// in the hook's books or on the (fake) device.
TEST(HookTest, ConcurrentProcessesNeverExceedTheLimit) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "512MiB";
  const uint64_t limit = 512 * kMiB;
  std::vector<Probe> probes;
  const char* steps[] = {"1048576", "3145728", "5000000", "7340033",
                         "262144",  "9999999", "2097152", "4194304"};
  for (int i = 0; i < 8; ++i) {
    probes.push_back(box.Start({i % 3 == 0   ? "dlsym"
                                : i % 3 == 1 ? "proc11"
                                             : "proc12",
                                "init", "ctx", "ready", "fill", steps[i], "churn", "0.5", "8000000", "heap", "0",
                                "fill", "65536", "meminfo", "ready"}));
  }
  // The churn makes arrays, whose driver footprint the limiter thread trues up a quarter-second tick later;
  // `heap 0` trues it up at once, so that no tick lands between the last fills and the count below.
  for (auto& p : probes) ASSERT_TRUE(p.WaitFor("ready"));
  for (auto& p : probes) p.Continue();  // all fill at once
  for (auto& p : probes) ASSERT_TRUE(p.WaitFor("ready"));
  uint64_t peak = 0;
  bool consistent = false;
  const uint64_t used = RegionUsed(box.Path("region"), &peak, &consistent);
  EXPECT_TRUE(consistent);
  EXPECT_LE(used, limit);
  std::string outs;
  for (auto& p : probes) outs += p.buffer;
  EXPECT_GE(used, limit - 8 * 65536) << "the last fills should leave almost nothing free\n" << outs;
  EXPECT_LE(peak, limit) << "the container went over its limit";
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  EXPECT_LE(gpu.PeakBytes(), limit) << "the device held more than the limit";
  for (auto& p : probes) {
    p.Continue();
    EXPECT_TRUE(p.Finish().Exited0());
  }
  EXPECT_EQ(RegionUsed(box.Path("region")), 0u);
}

// The limiter thread's true-ups run at any moment, also in the middle of another thread's call. Two races
// that let the container hold more than its limit (found by the test above, about once in a hundred runs
// under load), each made certain here by the fake driver's fault injection; both tests fail without the
// rule they check (shown in the commit that added them).

// A pool's figure may drop before its memory is back on the device (the fake releases at a synchronization
// over two seconds here). A charge lowered on that figure gives other processes room the device does not
// have: only the thread whose call released lowers the charge, after the call returns. (Before that rule,
// the limiter thread lowered it in the middle of the release; its next tick took the memory for footprint,
// which hid the gap after a quarter second and over-charged the container once the memory was back.)
TEST(HookTest, APoolKeepsItsChargeUntilItsReleaseReturns) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  Probe releasing = box.Start({"dlsym", "init", "ctx", "async", N(64 * kMiB), "ready", "freeall", "ready"},
                              {{"FAKECUDA_SLOW_RELEASE_MS", "2000"}});
  ASSERT_TRUE(releasing.WaitFor("ready"));
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  releasing.Continue();  // cuMemFreeAsync keeps the memory in the pool; cuCtxSynchronize releases it
  // Charged (read first: charges only rise during the release) never below what the device holds.
  uint64_t uncharged = 0;
  for (const uint64_t end = Now() + 1500000000ull; Now() < end;) {
    const uint64_t charged = RegionUsed(box.Path("region"));
    const uint64_t held = gpu.UsedBytes();
    if (held > charged && held - charged > uncharged) uncharged = held - charged;
    usleep(10000);
  }
  EXPECT_EQ(uncharged, 0u) << "the device held memory the container was not charged for";
  ASSERT_TRUE(releasing.WaitFor("ready"));
  EXPECT_EQ(RegionUsed(box.Path("region")), gpu.UsedBytes()) << "once the memory is back";
  releasing.Continue();
  EXPECT_TRUE(releasing.Finish().Exited0());
}

// NVML's figure for a process is as old as the moment it was taken (NVML answers 200 ms late here). Memory
// freed and uncharged since is not footprint: the limiter thread compares the figure with the charges only
// when no charge moved while it read both.
TEST(HookTest, MemoryFreedWhileNvmlIsReadIsNotChargedAgain) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "128MiB";
  Probe p = box.Start({"dlsym", "init", "ctx", "fill", N(kMiB), "freeslowly", "10", "ready"},
                      {{"FAKECUDA_SLOW_NVML_MS", "200"}});
  ASSERT_TRUE(p.WaitFor("ready"));
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  EXPECT_EQ(RegionUsed(box.Path("region")), gpu.UsedBytes()) << "charged memory the device no longer holds";
  p.Continue();
  EXPECT_TRUE(p.Finish().Exited0());
}

// Processes SIGKILLed at random points while allocating and freeing on every path leave no charge and no lock
// behind: a new process gets the whole quota, promptly.
TEST(HookTest, SigkillAtRandomPointsLeaksNothingAndDeadlocksNothing) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  std::mt19937 rng(12345);
  for (int round = 0; round < 6; ++round) {
    std::vector<Probe> probes;
    for (int i = 0; i < 4; ++i) {
      probes.push_back(box.Start({i % 2 == 0 ? "dlsym" : "proc12", "init", "ctx", "churn", "30", "6000000"}));
    }
    // Each is churning once it has said how its context went (a late one may find the quota full: its
    // allocations then fail, and it churns on); the kill lands at a random point of the churn.
    for (auto& p : probes) ASSERT_TRUE(p.WaitForText("ctx ")) << p.buffer;
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 150));
    for (auto& p : probes) kill(p.pid, SIGKILL);
    for (auto& p : probes) EXPECT_TRUE(WIFSIGNALED(p.Finish().status));
  }
  bool consistent = false;
  EXPECT_EQ(RegionUsed(box.Path("region"), nullptr, &consistent), 0u);
  EXPECT_TRUE(consistent);
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "fill", N(kMiB)});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Num("fill", 2), kLimit - kContext);
}

// The node agent rewrites the limits file (write, rename, higher generation); running processes apply it.
TEST(HookTest, LimitsFileChangesApplyAtRunTime) {
  HookSandbox box;
  const std::string file = box.Path("limits");
  hook::Limits limits;
  limits.generation = 1;
  limits.device_count = 1;
  limits.devices[0].index = hook::kAnyDevice;
  limits.devices[0].memory_bytes = 128 * kMiB;
  hook::Error error;
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  box.env["TESSERA_LIMITS_FILE"] = file;
  box.env["TESSERA_HOOK_LOG"] = "info";
  box.merge_stderr = true;  // to wait for the hook's "applied limits generation" line
  Probe p =
      box.Start({"proc12", "init", "ctx", "totalmem", "alloc", N(200 * kMiB), "ready", "retryalloc",
                 N(200 * kMiB), "10000", "totalmem", "ready", "retryalloc", N(kMiB), "200", "exit", "0"});
  ASSERT_TRUE(p.WaitFor("ready"));
  limits.generation = 2;
  limits.devices[0].memory_bytes = 512 * kMiB;
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  p.Continue();
  ASSERT_TRUE(p.WaitFor("ready"));
  // Lowered below what is in use: nothing is taken away, new allocations fail.
  limits.generation = 3;
  limits.devices[0].memory_bytes = 64 * kMiB;
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  ASSERT_TRUE(p.WaitForText("applied limits generation 3"));
  p.Continue();
  const ProbeResult r = p.Finish();
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Num("totalmem", 2, 0), 128 * kMiB);
  EXPECT_EQ(r.Field("alloc", 1), "2");
  EXPECT_EQ(r.Field("retryalloc", 1, 0), "0") << r.out;
  EXPECT_EQ(r.Num("totalmem", 2, 1), 512 * kMiB);
  EXPECT_EQ(r.Field("retryalloc", 1, 1), "2") << r.out;
}

// What the hook has charged the container's bucket so far (ns of GPU time): what it started with (full), plus
// what it was refilled, minus what is left.
int64_t ChargedNs(const std::string& region_path) {
  hook::SharedRegion region;
  hook::Error error;
  if (!region.Open(region_path.c_str(), &error) || region.device_count() < 1) {
    region.Close();
    return -1;
  }
  const hook::BucketState& b = region.device(0)->bucket;
  const int64_t charged =
      b.capacity_ns.load() + static_cast<int64_t>(b.refilled_total_ns.load()) - b.tokens_ns.load();
  region.Close();
  return charged;
}

// Every launch path is paced: kernels worth 200 ms at a 25% share take at least what the bucket allows. The
// floor is what the throttle guarantees, whatever the machine's load (limiter.h): the bucket holds at most
// its capacity C (20 ms of GPU time at the rate, at least 4 ms) and earns the rate; a launch goes only while
// the bucket holds budget, and each is charged its estimate, which is exact once the hook has measured one
// launch of the kind (the fake GPU's kernels take exactly what they say). A refill adds what was earned since
// the one before, then caps at C: the first refill after the run starts may add what was earned before it, so
// the launches that went before that refill (at most C and one launch) come on top of C. So the last of N
// launches of `cost` goes no sooner than ((N - 2) * cost - 2 * C) / rate after the first, and ends `cost`
// later: 746 ms (781 ms measured unloaded, 773 ms once at load 20, below a floor counting C once; 620 ms for
// ten graphs of ten kernels). The probe waits, after one launch of the kind, until the hook has charged its
// measurement: a kind not measured yet is charged the last measurement of any kind, nothing before the first.
// The old test only slept 50 ms after a 1 ms kernel of the same kind, and beside the rest of the suite at
// load 14-25 on 2 cores the `launch` and `coop` paths ran their 100 kernels in 0.20 s (nothing charged: the
// limiter thread, which measures launches, had not yet measured one) and the `ex` path finished in 0.69 s
// against its 0.7 s floor. Deliberate break: run at 50% against the floor for 25% and every path fails
// (0.38-0.39 s).
TEST(HookTest, EveryLaunchPathIsThrottled) {
  constexpr uint32_t kCores = 25;
  constexpr int64_t kKernelNs = 2000000;
  constexpr int kKernels = 100;
  for (const char* path : {"launch", "ex", "coop", "graph"}) {
    HookSandbox box;
    box.env["TESSERA_GPU_CORES"] = std::to_string(kCores);
    Probe p = box.Start(
        {"proc12", "init", "ctx", path, "1", N(kKernelNs), "ready", path, N(kKernels), N(kKernelNs)});
    ASSERT_TRUE(p.WaitFor("ready")) << path << ": " << p.Finish().out;
    // A graph of the probe is 10 kernels, launched as one (at least once).
    const bool graph = std::string(path) == "graph";
    const int64_t warmup = graph ? 10 * kKernelNs : kKernelNs;
    // The limiter thread measures launches every millisecond it gets a CPU; generous, not a speed target.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (ChargedNs(box.Path("region")) < warmup && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const int64_t charged = ChargedNs(box.Path("region"));
    p.Continue();
    const ProbeResult r = p.Finish();
    ASSERT_GE(charged, warmup) << path
                               << ": the hook never charged its measurement of the first launch (120 s)";
    ASSERT_TRUE(r.Exited0()) << r.out;
    EXPECT_EQ(r.Field(path, 1, 1), "0");
    const int64_t launches = graph ? kKernels / 10 : kKernels;
    const int64_t cost = graph ? 10 * kKernelNs : kKernelNs;
    const int64_t rate_ppm = static_cast<int64_t>(hook::kPpm) * kCores / 100;
    const int64_t capacity =
        std::max(hook::TokenBucket::kBurstWindowNs * rate_ppm / hook::kPpm, hook::TokenBucket::kMinBurstNs);
    const uint64_t floor = static_cast<uint64_t>(
        ((launches - 2) * cost - 2 * capacity) * static_cast<int64_t>(hook::kPpm) / rate_ppm + cost);
    printf("%s: %d kernels of 2 ms at %u%% took %.3f s (the throttle allows no less than %.3f s)\n", path,
           kKernels, kCores, static_cast<double>(r.Num(path, 2, 1)) / 1e9, static_cast<double>(floor) / 1e9);
    EXPECT_GE(r.Num(path, 2, 1), floor) << path << " was not throttled: " << r.out;
  }
}

// Share of the simulated GPU's time that `pid` used in [from, to).
double Share(const FakeGpuView& gpu, pid_t pid, uint64_t from, uint64_t to) {
  return 100.0 * static_cast<double>(gpu.BusyNs(static_cast<unsigned>(pid), from, to)) /
         static_cast<double>(to - from);
}

void SleepUntil(uint64_t at) {
  const uint64_t now = Now();
  if (at > now) std::this_thread::sleep_for(std::chrono::nanoseconds(at - now));
}

// A window of the run and the points of it that each tenant spent waiting for a CPU (run_delay.h): the tenant
// could not use that part of the GPU, whatever its share.
struct Starved {
  uint64_t from = 0;
  uint64_t to = 0;
  std::vector<double> points;
};

// Samples what each of `pids` waited for a CPU from `from` (called at or before it) every 20 ms until `to`.
// The window is from the first sample to the last one taken by `to`, and the share is to be measured over the
// same window: on a loaded machine this thread wakes late too, and a share over [from, to) beside waits
// counted from a late first sample misses what the tenant waited in between (one way the 30% tenant could
// measure 26.14 against 28 - 1.82, as it did beside the rest of the suite at load 20-28 on 2 cores).
// `except` names a thread left out (RunDelayNs).
Starved StarvedWindow(const std::vector<pid_t>& pids, uint64_t from, uint64_t to,
                      const std::string& except = "") {
  SleepUntil(from);
  auto sample = [&] {
    std::vector<uint64_t> v;
    for (pid_t p : pids) v.push_back(RunDelayNs(p, except));
    return v;
  };
  Starved w;
  w.from = Now();
  const std::vector<uint64_t> before = sample();
  w.to = w.from;
  std::vector<uint64_t> after = before;
  for (;;) {
    SleepUntil(std::min<uint64_t>(Now() + 20000000ull, to));
    const uint64_t t = Now();
    if (t > to && w.to > w.from) break;  // woke late: the window ends at the last sample in time
    after = sample();
    w.to = t;
    if (t >= to) break;
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    w.points.push_back(after[i] > before[i] ? 100.0 * static_cast<double>(after[i] - before[i]) /
                                                  static_cast<double>(w.to - w.from)
                                            : 0.0);
  }
  return w;
}

// Two containers (two regions) with hard shares of 30% and 60%, both wanting the whole GPU: each gets its share
// within 2 points, measured on the fake GPU's timeline. (At exactly 100% subscribed, any moment a tenant is not
// scheduled on a loaded CPU is GPU time it cannot get back, so 30/70 undershoots here by a few points; it never
// goes over.)
TEST(HookTest, TwoTenantsReachTheirHardShares) {
  HookSandbox box;
  Probe a = box.Start({"dlsym", "init", "ctx", "spin", "4", "2000000"},
                      {{"TESSERA_GPU_CORES", "30"}, {"TESSERA_REGION", box.Path("region-a")}});
  Probe b = box.Start({"dlsym", "init", "ctx", "spin", "4", "2000000"},
                      {{"TESSERA_GPU_CORES", "60"}, {"TESSERA_REGION", box.Path("region-b")}});
  // Both spinning (the probe prints "ctx 0" just before): start-up slowed by a loaded machine is not in the
  // window.
  ASSERT_TRUE(a.WaitFor("ctx 0")) << a.Finish().out;
  ASSERT_TRUE(b.WaitFor("ctx 0")) << b.Finish().out;
  const uint64_t from = Now() + 1000000000ull;  // skip the saved-up burst
  const uint64_t to = from + 2500000000ull;
  // The hook's limiter thread is left out: it wakes every millisecond and waits for a CPU at each wake (20
  // points at load 5), but a hard share does not wait for it (a launch that waits for budget refills the
  // bucket itself). Counted, the 30% tenant paced at 15 passed at load 5 (14.71 against 28 - 20.83).
  const Starved w = StarvedWindow({a.pid, b.pid}, from, to, "tessera-limit");
  const std::vector<double>& starved = w.points;
  ProbeResult ra = a.Finish();
  ProbeResult rb = b.Finish();
  ASSERT_TRUE(ra.Exited0() && rb.Exited0()) << ra.out << rb.out;
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  const double sa = Share(gpu, a.pid, w.from, w.to);
  const double sb = Share(gpu, b.pid, w.from, w.to);
  printf(
      "hard shares on the fake GPU: %.2f%% (limit 30), %.2f%% (limit 60); waited for a CPU %.2f and %.2f "
      "points\n",
      sa, sb, starved[0], starved[1]);
  EXPECT_LE(sa, 32.0) << "30% tenant";
  EXPECT_LE(sb, 62.0) << "60% tenant";
  EXPECT_GE(sa, 28.0 - starved[0]) << "30% tenant";
  EXPECT_GE(sb, 58.0 - starved[1]) << "60% tenant";
}

// Eight threads of one process launching short kernels at once: each runs its launches up on its own tab,
// settled with the bucket in batches, and the process still gets its share, not the share plus what the
// threads owe (20 us kernels: a batch is about 9 of them, 1/32 of the 30% bucket). The share is the kernel
// time the threads completed over the wall time, as the probe counts it (the fake GPU's timeline books each
// thread's kernels under the thread's id). Unhooked the same threads keep the fake GPU 99% busy.
TEST(HookTest, ManyThreadsHoldTheShare) {
  HookSandbox box;
  box.env["TESSERA_GPU_CORES"] = "30";
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "spinthreads", "8", "3", "20000"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  const double share =
      100.0 * static_cast<double>(r.Num("spinthreads", 2)) / static_cast<double>(r.Num("spinthreads", 3));
  printf("8 threads at 30%% on the fake GPU: %.2f%% over 3 s (the saved-up burst included)\n", share);
  EXPECT_LE(share, 31.0) << "the threads together took more than the share: " << r.out;
  EXPECT_GE(share, 20.0) << r.out;
}

// Elastic (GaiaGPU): alone, a 30% container grows toward its ceiling; when a hard 60% tenant arrives it gives
// the excess back and the newcomer gets its share.
TEST(HookTest, ElasticGrowsAloneAndGivesBack) {
  HookSandbox box;
  Probe a =
      box.Start({"dlsym", "init", "ctx", "spin", "7", "2000000"}, {{"TESSERA_GPU_CORES", "30"},
                                                                   {"TESSERA_COMPUTE_POLICY", "elastic"},
                                                                   {"TESSERA_REGION", box.Path("region-a")}});
  const uint64_t t0 = Now();
  const Starved w_alone = StarvedWindow({a.pid}, t0 + 2000000000ull, t0 + 3400000000ull);
  const double starved_alone = w_alone.points[0];
  SleepUntil(t0 + 3500000000ull);
  Probe b = box.Start({"dlsym", "init", "ctx", "spin", "3.5", "2000000"},
                      {{"TESSERA_GPU_CORES", "60"}, {"TESSERA_REGION", box.Path("region-b")}});
  const uint64_t t1 = Now();
  const Starved w = StarvedWindow({a.pid, b.pid}, t1 + 1500000000ull, t1 + 3300000000ull);
  const std::vector<double>& starved = w.points;
  ProbeResult rb = b.Finish();
  ProbeResult ra = a.Finish();
  ASSERT_TRUE(ra.Exited0() && rb.Exited0()) << ra.out << rb.out;
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  const double alone = Share(gpu, a.pid, w_alone.from, w_alone.to);
  const double shared_a = Share(gpu, a.pid, w.from, w.to);
  const double shared_b = Share(gpu, b.pid, w.from, w.to);
  printf(
      "elastic: alone %.2f%%; shared %.2f%% (elastic 30) and %.2f%% (hard 60); waited for a CPU %.2f, %.2f "
      "and %.2f points\n",
      alone, shared_a, shared_b, starved_alone, starved[0], starved[1]);
  EXPECT_GT(alone, 60.0 - starved_alone) << "alone, the elastic tenant should use idle compute";
  EXPECT_LE(alone, 92.0) << "but not more than its 90% ceiling";
  EXPECT_LE(shared_b, 63.0) << "the newcomer gets its share";
  EXPECT_GE(shared_b, 57.0 - starved[1]) << "the newcomer gets its share";
  EXPECT_LE(shared_a, 42.0) << "the elastic tenant gave the excess back";
  EXPECT_GE(shared_a, 27.0 - starved[0]) << "and keeps its own share";
}

// Alone, an elastic container grows to its ceiling even when NVML's utilization reads above its own measure (a
// real GPU's does, by a few points and noisily): NVML's process list shows nobody else on the GPU, so the
// difference is not another tenant. Before, the difference counted as others' use and a low-priority container
// fell back to its share (an H100 alone at a 90% ceiling averaged 78%; here it stayed at 30%).
TEST(HookTest, ElasticAloneGrowsThoughUtilizationReadsAboveItsOwnUse) {
  HookSandbox box;
  box.env["FAKECUDA_NVML_UTIL_EXTRA"] = "6";
  Probe a = box.Start({"dlsym", "init", "ctx", "spin", "3.5", "2000000"},
                      {{"TESSERA_GPU_CORES", "30"}, {"TESSERA_COMPUTE_POLICY", "elastic"}});
  ASSERT_TRUE(a.WaitFor("ctx 0")) << a.Finish().out;  // spinning from here: start-up is not in the window
  const uint64_t t0 = Now();
  // What it waited for a CPU comes off the lower bound, as in ElasticGrowsAloneAndGivesBack: beside the rest
  // of the suite at load 14-25 on 2 cores it measured 41-75% in 6 runs of 13, with nothing to say why.
  const Starved w = StarvedWindow({a.pid}, t0 + 1500000000ull, t0 + 3300000000ull);
  ProbeResult ra = a.Finish();
  ASSERT_TRUE(ra.Exited0()) << ra.out;
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  const double alone = Share(gpu, a.pid, w.from, w.to);
  printf("elastic alone, utilization reading 6 points above: %.2f%% (waited for a CPU %.2f points)\n", alone,
         w.points[0]);
  EXPECT_GT(alone, 75.0 - w.points[0]) << "alone, the elastic tenant should grow toward its 90% ceiling";
  EXPECT_LE(alone, 92.0);
}

}  // namespace
}  // namespace tessera::testing
