// libtessera-cuda.so against the fake driver, issue 12 and the hook side of issue 14: memory no allocation
// call names (contexts, modules, libraries, limits) charged exactly under concurrency; a process without NVML
// still charged for its context; NVML's process list showing only the container; a global-mode capture
// surviving the limiter thread; zero limits and planted regions refused; region locks never waited on forever.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <set>
#include <thread>

#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "hook/common/session.h"
#include "hook/hook_process.h"

namespace tessera::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kContext = 16 * kMiB;  // FAKECUDA_CONTEXT_BYTES in the sandbox
constexpr uint64_t kModule = 4 * kMiB;    // FAKECUDA_MODULE_BYTES (default)

std::string N(uint64_t v) {
  return std::to_string(v);
}

uint64_t RegionUsed(const std::string& path, uint64_t* peak = nullptr) {
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
  region.Close();
  return used;
}

// Kills a probe that is still running after `seconds` (a hang is a failure, not a stuck test run).
class Watchdog {
 public:
  Watchdog(pid_t pid, int seconds)
      : thread_([this, pid, seconds] {
          for (int i = 0; i < seconds * 10 && !done_.load(); ++i) usleep(100000);
          if (!done_.load()) {
            fired_.store(true);
            kill(pid, SIGKILL);
          }
        }) {}
  ~Watchdog() {
    done_.store(true);
    thread_.join();
  }
  bool fired() const { return fired_.load(); }

 private:
  std::atomic<bool> done_{false};
  std::atomic<bool> fired_{false};
  std::thread thread_;
};

// 16 processes of one container start at once under one limit: every one initialises (context and a
// module), and together they allocate the limit less their contexts and modules, within one block, every run.
TEST(FootprintTest, SixteenProcessesStartingTogetherShareTheLimitExactly) {
  constexpr int kProcesses = 16;
  constexpr uint64_t kLimit = 512 * kMiB;
  constexpr uint64_t kBlock = 4 * kMiB;
  for (int run = 0; run < 20; ++run) {
    SCOPED_TRACE("run " + std::to_string(run));
    HookSandbox box;
    box.env["TESSERA_GPU_MEMORY_LIMIT"] = "512MiB";
    std::vector<Probe> probes;
    for (int i = 0; i < kProcesses; ++i) {
      probes.push_back(box.Start({i % 2 == 0 ? "dlsym" : "proc12", "init", "ctx", "module", "ready", "fill",
                                  N(kBlock), "ready"}));
    }
    for (auto& p : probes) ASSERT_TRUE(p.WaitFor("ready")) << p.buffer;
    for (auto& p : probes) p.Continue();
    for (auto& p : probes) ASSERT_TRUE(p.WaitFor("ready")) << p.buffer;
    uint64_t peak = 0;
    const uint64_t used = RegionUsed(box.Path("region"), &peak);
    FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
    const uint64_t device_used = gpu.UsedBytes();
    uint64_t filled = 0;
    std::string outs;
    for (auto& p : probes) {
      p.Continue();
      const ProbeResult r = p.Finish();
      outs += r.out;
      ASSERT_TRUE(r.Exited0()) << r.out;
      EXPECT_EQ(r.Field("ctx", 1), "0") << "every process initialises\n" << r.out;
      EXPECT_EQ(r.Field("module", 1), "0") << r.out;
      filled += r.Num("fill", 2);
    }
    const uint64_t footprints = kProcesses * (kContext + kModule);
    EXPECT_EQ(used, device_used) << "the charge is what the driver holds";
    EXPECT_LE(used, kLimit);
    EXPECT_LE(peak, kLimit);
    EXPECT_LE(filled + footprints, kLimit) << outs;
    EXPECT_GT(filled + footprints + kBlock, kLimit) << "the limit less contexts and modules, within a block\n"
                                                    << outs;
  }
}

// Modules and libraries take memory in the context: charged when loaded, given back when unloaded, refused
// past the limit; so do cuCtxSetLimit's heap and the context itself.
TEST(FootprintTest, ModulesLibrariesAndLimitsAreCharged) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const ProbeResult r = box.Run({"proc12", "init", "ctx", "meminfo", "module", "meminfo", "library", "meminfo",
                                 "library", "unload", "meminfo", "heap", N(8 * kMiB), "meminfo"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  const uint64_t limit = 256 * kMiB;
  EXPECT_EQ(r.Num("meminfo", 2, 0), limit - kContext) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 1), limit - kContext - kModule) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 2), limit - kContext - 2 * kModule) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 3), limit - kContext - 2 * kModule) << "an unloaded library is given back\n"
                                                                    << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 4), limit - kContext - 2 * kModule - 8 * kMiB) << r.out;

  HookSandbox tight;
  tight.env["TESSERA_GPU_MEMORY_LIMIT"] = N(kContext + 2 * kModule);
  const ProbeResult t = tight.Run({"dlsym", "init", "ctx", "module", "module", "module", "meminfo"});
  ASSERT_TRUE(t.Exited0()) << t.out;
  EXPECT_EQ(t.Field("module", 1, 0), "0");
  EXPECT_EQ(t.Field("module", 1, 1), "0");
  EXPECT_EQ(t.Field("module", 1, 2), "2") << "a module past the limit is refused\n" << t.out;
  EXPECT_EQ(t.Num("meminfo", 2), 0u) << t.out;
  FakeGpuView gpu(tight.Path("fakegpu.state"), tight.dir());
  EXPECT_LE(gpu.PeakBytes(), kContext + 3 * kModule);
}

// A context the container has no room for is refused before the driver makes it, once a process of the
// container has measured a context's size: the device never holds more than the limit, not even for the
// moment between creating the context and measuring it (the first context of a container is still measured
// after it is made: there is nothing to go by before).
TEST(FootprintTest, AContextWithoutRoomIsRefusedBeforeTheDeviceHoldsIt) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const uint64_t limit = 256 * kMiB;
  Probe full = box.Start({"dlsym", "init", "ctx", "fill", N(kMiB), "ready"});
  ASSERT_TRUE(full.WaitFor("ready"));
  const ProbeResult late = box.Run({"proc12", "init", "ctx"});
  EXPECT_EQ(late.Field("ctx", 1), "2") << late.out;  // CUDA_ERROR_OUT_OF_MEMORY
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  EXPECT_LE(gpu.PeakBytes(), limit) << "the device held the refused context";
  full.Continue();
  EXPECT_TRUE(full.Finish().Exited0());
  // With room again, a context is made and charged exactly.
  const ProbeResult again = box.Run({"dlsym", "init", "ctx", "meminfo"});
  EXPECT_EQ(again.Field("ctx", 1), "0") << again.out;
  EXPECT_EQ(again.Num("meminfo", 2), limit - kContext) << again.out;
}

// Kernels loaded lazily at their first launch (CUDA_MODULE_LOADING=LAZY, the default) grow the context with
// no call to hook: the limiter thread's true-up charges them (within its period; polled here).
TEST(FootprintTest, LazilyLoadedKernelsAreCharged) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  box.env["FAKECUDA_LAZY_BYTES"] = "2MiB";
  const uint64_t limit = 256 * kMiB;
  const uint64_t expected = limit - kContext - kModule - 2 * kMiB;
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "launch", "1", "0", "waitfree", N(expected), "10000"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Num("waitfree", 1), expected) << r.out;
}

// A process whose NVML is missing is still charged for its context: the size another process of the
// container measured, else the documented estimate.
TEST(FootprintTest, ProcessWithoutNvmlStillHasItsContextCharged) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "1GiB";
  const uint64_t limit = 1024 * kMiB;
  const ProbeResult measured = box.Run({"dlsym", "init", "ctx", "meminfo"});
  ASSERT_TRUE(measured.Exited0()) << measured.out;
  EXPECT_EQ(measured.Num("meminfo", 2), limit - kContext);
  const ProbeResult blind =
      box.Run({"dlsym", "init", "ctx", "meminfo"}, {{"TESSERA_REAL_LIBNVML", box.Path("no-libnvidia-ml.so.1")}});
  ASSERT_TRUE(blind.Exited0()) << blind.out;
  EXPECT_EQ(blind.Num("meminfo", 2), limit - kContext) << "the size measured by another process\n" << blind.out;

  HookSandbox fresh;
  fresh.env["TESSERA_GPU_MEMORY_LIMIT"] = "1GiB";
  fresh.env["TESSERA_REAL_LIBNVML"] = fresh.Path("no-libnvidia-ml.so.1");
  const ProbeResult first = fresh.Run({"proc11", "init", "ctx", "meminfo", "fill", N(16 * kMiB)});
  ASSERT_TRUE(first.Exited0()) << first.out;
  EXPECT_EQ(first.Num("meminfo", 2), limit - 256 * kMiB) << "the estimate, 256 MiB\n" << first.out;
  EXPECT_EQ(first.Num("fill", 2), limit - 256 * kMiB);
}

// NVML inside the container (nvidia-smi): the process list (v1 and v3) shows this container's processes only.
TEST(FootprintTest, NvmlProcessListShowsOnlyTheContainer) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "1GiB";
  Probe other = box.Start({"dlsym", "init", "ctx", "alloc", N(64 * kMiB), "ready"},
                          {{"TESSERA_REGION", box.Path("other-region")}});
  Probe mine = box.Start({"dlsym", "init", "ctx", "alloc", N(32 * kMiB), "ready"});
  ASSERT_TRUE(other.WaitFor("ready"));
  ASSERT_TRUE(mine.WaitFor("ready"));
  const ProbeResult r = box.Run({"proc12", "init", "ctx", "nvmlprocs", "nvml"});
  other.Continue();
  mine.Continue();
  other.Finish();
  mine.Finish();
  ASSERT_TRUE(r.Exited0()) << r.out;
  // "nvmlprocs rc need count pid:used... | rc count pid:used..."
  EXPECT_EQ(r.Field("nvmlprocs", 1), "0") << r.out;
  EXPECT_EQ(r.Field("nvmlprocs", 2), "2") << "the count asked with no buffer is the container's\n" << r.out;
  EXPECT_EQ(r.Field("nvmlprocs", 3), "2") << r.out;
  const std::string line = r.out.substr(r.out.find("nvmlprocs"));
  EXPECT_NE(line.find(std::to_string(mine.pid) + ":" + N(kContext + 32 * kMiB)), std::string::npos) << line;
  EXPECT_EQ(line.find(" " + std::to_string(other.pid) + ":"), std::string::npos)
      << "another container's process is listed\n" << line;
  EXPECT_NE(line.find("| 0 2 "), std::string::npos) << "v3 lists the same two\n" << line;
  EXPECT_EQ(r.Num("nvml", 3), 2 * kContext + 32 * kMiB) << "used is the container's\n" << r.out;
}

// The limiter thread measures launches with cuEventQuery; during another thread's global-mode capture (as
// PyTorch and vLLM capture CUDA graphs) that would invalidate the capture, unless it relaxed its own mode.
TEST(FootprintTest, GlobalModeCaptureSurvivesTheLimiterThread) {
  HookSandbox box;
  box.env["TESSERA_GPU_CORES"] = "50";
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "capture", "100000000", "80"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Field("capture", 1), "0") << r.out;
  EXPECT_EQ(r.Field("capture", 2), "0") << "the capture was invalidated (901)\n" << r.out;
}

// A stream-ordered pool that keeps what is freed (PyTorch's cudaMallocAsync backend sets the release threshold
// to UINT64_MAX) keeps it charged: no other allocation of the container gets it, until the pool is trimmed.
// With the default threshold the memory is released, and uncharged, at the next synchronization.
TEST(FootprintTest, PoolThatKeepsFreedMemoryKeepsItCharged) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const uint64_t limit = 256 * kMiB;
  const ProbeResult r = box.Run({"proc12", "init", "ctx", "poolkeep", "pool", N(64 * kMiB), "async", N(32 * kMiB),
                                 "meminfo", "freeall", "meminfo", "alloc", N(200 * kMiB), "pool", N(64 * kMiB),
                                 "meminfo", "freeall", "trim", "0", "meminfo", "alloc", N(200 * kMiB)});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Field("poolkeep", 1), "0") << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 0), limit - kContext - 96 * kMiB) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 1), limit - kContext - 96 * kMiB) << "freed, but kept by the pools\n" << r.out;
  EXPECT_EQ(r.Field("alloc", 1, 0), "2") << "the pools' kept memory is not the container's to take\n" << r.out;
  EXPECT_EQ(r.Field("pool", 1, 1), "0") << "the pool reuses what it keeps\n" << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 2), limit - kContext - 96 * kMiB) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 3), limit - kContext) << "trimmed: given back\n" << r.out;
  EXPECT_EQ(r.Field("alloc", 1, 1), "0") << r.out;
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  EXPECT_LE(gpu.PeakBytes(), limit);

  HookSandbox released;
  released.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const ProbeResult d = released.Run({"dlsym", "init", "ctx", "async", N(64 * kMiB), "freeall", "meminfo"});
  ASSERT_TRUE(d.Exited0()) << d.out;
  EXPECT_EQ(d.Num("meminfo", 2), limit - kContext) << "threshold 0: released at the synchronization\n" << d.out;
}

// Graph memory: an allocation node takes nothing until a launch maps it; it stays in the device's graph pool
// after it is freed, charged, until cuDeviceGraphMemTrim. A launch that would pass the limit is refused. The
// generic cuGraphAddNode is covered the same way.
TEST(FootprintTest, GraphMemoryIsChargedAtLaunchAndFreedAtTrim) {
  const uint64_t limit = 256 * kMiB;
  for (const char* add : {"graphmem", "graphnode"}) {
    HookSandbox box;
    box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
    const ProbeResult r = box.Run({"proc12", "init", "ctx", add, N(64 * kMiB), "meminfo", "graphlaunch", "meminfo",
                                   "graphfree", "meminfo", "graphtrim", "meminfo", add, N(250 * kMiB),
                                   "graphlaunch", "meminfo"});
    ASSERT_TRUE(r.Exited0()) << r.out;
    SCOPED_TRACE(std::string(add) + "\n" + r.out);
    EXPECT_EQ(r.Field(add, 1), "0");
    EXPECT_EQ(r.Num("meminfo", 2, 0), limit - kContext) << "not charged when added";
    EXPECT_EQ(r.Field("graphlaunch", 1, 0), "0");
    EXPECT_EQ(r.Num("meminfo", 2, 1), limit - kContext - 64 * kMiB) << "charged when launched";
    EXPECT_EQ(r.Num("meminfo", 2, 2), limit - kContext - 64 * kMiB) << "freed into the graph pool: still held";
    EXPECT_EQ(r.Num("meminfo", 2, 3), limit - kContext) << "trimmed: given back";
    EXPECT_EQ(r.Field("graphlaunch", 1, 1), "2") << "a launch past the limit is refused";
    EXPECT_EQ(r.Num("meminfo", 2, 4), limit - kContext);
    FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
    EXPECT_LE(gpu.PeakBytes(), limit);
  }
}

// cuMemAllocAsync into a capture (PyTorch's CUDA graphs with the cudaMallocAsync backend) allocates nothing
// then: it becomes an allocation node, charged when the graph is launched.
TEST(FootprintTest, AllocationCapturedIntoAGraphIsChargedAtLaunch) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const uint64_t limit = 256 * kMiB;
  const ProbeResult r = box.Run({"proc12", "init", "ctx", "capturealloc", N(64 * kMiB), "meminfo", "graphlaunch",
                                 "meminfo", "graphfree", "graphtrim", "meminfo"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Field("capturealloc", 1), "0") << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 0), limit - kContext) << "nothing allocated while capturing\n" << r.out;
  EXPECT_EQ(r.Field("graphlaunch", 1), "0") << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 1), limit - kContext - 64 * kMiB) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 2), limit - kContext) << r.out;
}

// Pageable memory prefetched onto the GPU (HMM) is charged, refused past the limit, and given back when
// prefetched to the host; managed memory is not charged twice.
TEST(FootprintTest, PrefetchIsCharged) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const uint64_t limit = 256 * kMiB;
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "prefetch", N(32 * kMiB), "meminfo", "prefetchback",
                                 "meminfo", "prefetch", N(300 * kMiB), "meminfo"});
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Field("prefetch", 1, 0), "0") << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 0), limit - kContext - 32 * kMiB) << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 1), limit - kContext) << r.out;
  EXPECT_EQ(r.Field("prefetch", 1, 1), "2") << "past the limit\n" << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 2), limit - kContext) << r.out;
  FakeGpuView gpu(box.Path("fakegpu.state"), box.dir());
  EXPECT_LE(gpu.PeakBytes(), limit);
}

// Launches into a capture do not run then, so they are not paced: a _ptsz launch on stream 0 is checked
// against the thread's per-thread default stream (the one being captured), not the legacy stream.
TEST(FootprintTest, PtszLaunchesIntoACaptureAreNotPaced) {
  HookSandbox box;
  box.env["TESSERA_GPU_CORES"] = "20";
  Probe p = box.Start({"dlsym", "init", "ctx", "launchptsz", "8", "2000000", "sleep", "100", "ready", "captureptsz",
                       "100", "10000000", "ready"});
  ASSERT_TRUE(p.WaitFor("ready")) << p.buffer;  // the kernel's cost is measured: 2 ms at 20%
  const auto waits = [&] {
    hook::SharedRegion region;
    hook::Error error;
    EXPECT_TRUE(region.Open(box.Path("region").c_str(), &error)) << error.text;
    const uint64_t w = region.device(0)->bucket.waits.load();
    region.Close();
    return w;
  };
  const uint64_t before = waits();
  p.Continue();
  ASSERT_TRUE(p.WaitFor("ready")) << p.buffer;
  const uint64_t after = waits();
  p.Continue();
  const ProbeResult r = p.Finish();
  ASSERT_TRUE(r.Exited0()) << r.out;
  EXPECT_EQ(r.Field("captureptsz", 1), "0") << r.out;
  EXPECT_EQ(after, before) << "captured launches (1 s of kernels at 20%) were paced\n" << r.out;
}

// A forked child (a DataLoader worker) starts with nothing charged: its own slot, its own footprint (what it
// loads), nothing of the parent's counted twice; its charges go when it exits.
TEST(FootprintTest, ForkedChildIsChargedForItsOwnFootprintOnly) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  const uint64_t limit = 256 * kMiB;
  const ProbeResult r = box.Run({"dlsym", "init", "ctx", "module", "alloc", N(32 * kMiB), "meminfo", "fork",
                                 "module", "meminfo", "alloc", N(8 * kMiB), "meminfo", "parent", "alloc",
                                 N(limit - kContext - kModule - 32 * kMiB)});
  ASSERT_TRUE(r.Exited0()) << r.out;
  const uint64_t parent = kContext + kModule + 32 * kMiB;
  EXPECT_EQ(r.Num("meminfo", 2, 0), limit - parent) << r.out;
  EXPECT_EQ(r.Field("fork", 1), "0") << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 1), limit - parent - kModule) << "the child's module, once\n" << r.out;
  EXPECT_EQ(r.Num("meminfo", 2, 2), limit - parent - kModule - 8 * kMiB) << r.out;
  // The whole rest of the limit: the exited child's charges are reclaimed before an allocation is refused.
  EXPECT_EQ(r.Field("alloc", 1, 2), "0") << "the exited child's charges are reclaimed\n" << r.out;
}

// A zero memory limit never means "unlimited" by accident: refused with a message, from the environment and
// from the limits file (a memory= given twice is refused as well).
TEST(FootprintTest, ZeroMemoryLimitIsRefused) {
  for (const char* value : {"0", "0GiB", "0.0000000001GiB"}) {
    HookSandbox box;
    box.env["TESSERA_GPU_MEMORY_LIMIT"] = value;
    const ProbeResult r = box.Run({"dlsym", "init", "ctx", "alloc", N(kMiB)});
    EXPECT_EQ(r.Field("init", 1), "800") << value << ": " << r.out;
  }
  HookSandbox box;
  for (const char* gpu : {"gpu index=* memory=0 cores=100", "gpu index=* memory=1048576 cores=100 memory=0"}) {
    const std::string file = box.Path("limits");
    FILE* f = fopen(file.c_str(), "w");
    ASSERT_NE(f, nullptr);
    fprintf(f, "tessera-limits 1\ngeneration 1\n%s\n", gpu);
    fclose(f);
    const ProbeResult r = box.Run({"dlsym", "init"}, {{"TESSERA_LIMITS_FILE", file}});
    EXPECT_EQ(r.Field("init", 1), "800") << gpu << ": " << r.out;
  }
  HookSandbox unlimited;
  unlimited.env["TESSERA_GPU_MEMORY_LIMIT"] = "unlimited";
  unlimited.env["TESSERA_GPU_CORES"] = "50";
  const ProbeResult u = unlimited.Run({"dlsym", "init", "ctx", "alloc", N(8192 * kMiB)});
  EXPECT_EQ(u.Field("alloc", 1), "0") << "'unlimited' says so explicitly\n" << u.out;
}

// A region whose lock word names a live thread that never lets go (a tenant holding it, or a planted file):
// the hook gives up after its lock timeout with a message, and neither starts nor exits hanging.
TEST(FootprintTest, RegionLockHeldForeverDoesNotHangTheHook) {
  HookSandbox box;
  box.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  box.env["TESSERA_REGION_LOCK_TIMEOUT_MS"] = "200";
  // Create the region and its GPU entry, as a process of the container would, then jam the locks.
  const ProbeResult setup = box.Run({"dlsym", "init", "ctx"});
  ASSERT_TRUE(setup.Exited0()) << setup.out;
  {
    hook::SharedRegion region;
    hook::Error error;
    ASSERT_TRUE(region.Open(box.Path("region").c_str(), &error)) << error.text;
    ASSERT_EQ(region.device_count(), 1);
    const int live = static_cast<int>(getpid());  // this test process: alive, and never unlocks
    memcpy(&region.device(0)->lock, &live, sizeof(live));
    region.Close();
  }
  Probe p = box.Start({"dlsym", "init", "ctx", "alloc", N(kMiB), "meminfo"});
  ProbeResult r;
  bool fired = false;
  {
    Watchdog dog(p.pid, 60);
    r = p.Finish();
    fired = dog.fired();
  }
  EXPECT_FALSE(fired) << "the hook hung on the jammed lock";
  EXPECT_TRUE(r.Exited0()) << r.out;
  EXPECT_NE(r.Field("alloc", 1), "0") << "nothing is charged without the lock, so nothing is allocated\n"
                                      << r.out;

  // The table lock too, with no GPU entry yet: the hook starts, refuses the GPU, and exits.
  HookSandbox box2;
  box2.env["TESSERA_GPU_MEMORY_LIMIT"] = "256MiB";
  box2.env["TESSERA_REGION_LOCK_TIMEOUT_MS"] = "200";
  {
    hook::SharedRegion region;
    hook::Error error;
    ASSERT_TRUE(region.Open(box2.Path("region").c_str(), &error)) << error.text;
    hook::RegionHeader* h = reinterpret_cast<hook::RegionHeader*>(region.device(0)) - 1;
    const int live = static_cast<int>(getpid());
    memcpy(&h->table_lock, &live, sizeof(live));
    region.Close();
  }
  Probe q = box2.Start({"dlsym", "init", "ctx", "alloc", N(kMiB)});
  ProbeResult rq;
  {
    Watchdog dog(q.pid, 60);
    rq = q.Finish();
    fired = dog.fired();
  }
  EXPECT_FALSE(fired) << "the hook hung on the jammed table lock";
  EXPECT_EQ(rq.Field("ctx", 1), "800") << "the GPU has no entry in the region: refused\n" << rq.out;
}

// The default region lives in a directory only its owner can have made: made 0700 when missing, refused
// with a message when someone else's, writable by others, or a symbolic link.
TEST(FootprintTest, DefaultRegionDirectoryMustBePrivate) {
  char tmpl[] = "/tmp/tessera-region-dir-test-XXXXXX";
  const std::string base = mkdtemp(tmpl);
  static std::string runtime;
  runtime = base;
  auto lookup = [](const char* name) -> const char* {
    return strcmp(name, "XDG_RUNTIME_DIR") == 0 ? runtime.c_str() : nullptr;
  };
  char path[hook::kPathSize];
  hook::Error error;
  ASSERT_TRUE(hook::DefaultRegionPath(lookup, path, sizeof(path), &error)) << error.text;
  EXPECT_EQ(std::string(path), base + "/tessera/region");
  struct stat st;
  ASSERT_EQ(stat((base + "/tessera").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  chmod((base + "/tessera").c_str(), 0777);
  EXPECT_FALSE(hook::DefaultRegionPath(lookup, path, sizeof(path), &error));
  EXPECT_NE(std::string(error.text).find("not a private directory"), std::string::npos) << error.text;
  rmdir((base + "/tessera").c_str());
  mkdir((base + "/elsewhere").c_str(), 0700);
  ASSERT_EQ(symlink((base + "/elsewhere").c_str(), (base + "/tessera").c_str()), 0);
  EXPECT_FALSE(hook::DefaultRegionPath(lookup, path, sizeof(path), &error));
  EXPECT_NE(std::string(error.text).find("symbolic link"), std::string::npos) << error.text;
  unlink((base + "/tessera").c_str());
  rmdir((base + "/elsewhere").c_str());
  rmdir(base.c_str());
}

}  // namespace
}  // namespace tessera::testing
