// libtessera-opencl.so under real OpenCL programs on PoCL's CPU device. Each test runs cl_tenant processes
// with the library preloaded and checks what the OpenCL runtime told them: memory limits and their errors,
// reported memory, one quota per container across processes, and device-time shares (the SharedGPU seed's
// Figures 2 and 3).
//
// The share tests pin every tenant to one CPU, so PoCL's CPU device is one device the tenants contend for,
// and measure each tenant's share as the device time of its own kernels (their profiling events) per wall
// time. The machine may be busy with other work: that only makes kernels longer, it does not change the share
// of device time a paced tenant is allowed. What the machine took of the device (the pinned CPU's time spent
// on other processes, foreign_cpu.h) is taken off what a tenant must reach, never off what a hard share may
// not exceed (the elastic tenant's yield is the one bound that depends on it, and says how); on a quiet
// machine it is a few hundredths.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "foreign_cpu.h"
#include "hook/common/limits.h"
#include "hook/common/region.h"
#include "tenant_runner.h"

namespace tessera::cltest {
namespace {

constexpr int kAllocationFailure = -4;  // CL_MEM_OBJECT_ALLOCATION_FAILURE
constexpr int kOutOfResources = -5;     // CL_OUT_OF_RESOURCES
constexpr double kTolerance = 0.05;     // ±5 points of a GPU

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/tessera-opencl-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The CPU every share-test tenant is pinned to: the first one this process may use.
std::string SharedCpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) return std::to_string(i);
    }
  }
  return "0";
}

Report RunTenant(const std::vector<std::string>& args, const std::map<std::string, std::string>& env,
                 bool preload = true) {
  Tenant t;
  EXPECT_TRUE(t.Start(args, env, preload));
  return t.Wait();
}

class OpenClHookTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::filesystem::create_directories(PoclCacheDir());
    // An OpenCL platform must be there (CI installs PoCL); the first run also fills PoCL's kernel cache, so
    // that no share test waits for the compiler.
    Report r = RunTenant({"spin", "0.2", "--kernel-ms", "1"}, {}, false);
    ASSERT_EQ(r.exit_code, 0)
        << "cl_tenant cannot run OpenCL here (install pocl-opencl-icd: scripts/setup):\n"
        << r.output;
  }
  TempDir dir_;
};

// --- Memory -----------------------------------------------------------------------------------------------

TEST_F(OpenClHookTest, ReportedMemoryIsTheLimit) {
  Report real = RunTenant({"info"}, {}, false);
  ASSERT_EQ(real.exit_code, 0) << real.output;
  const double real_total = real.Number("global_mem_size");
  ASSERT_GT(real_total, 64.0 * 1024 * 1024);

  Report limited =
      RunTenant({"info"}, {{"TESSERA_GPU_MEMORY_LIMIT", "48MiB"}, {"TESSERA_REGION", dir_.File("r")}});
  ASSERT_EQ(limited.exit_code, 0) << limited.output;
  EXPECT_EQ(limited.Get("global_mem_size"), std::to_string(48u << 20));
  EXPECT_EQ(limited.Get("max_mem_alloc_size"), std::to_string(48u << 20));

  // No limits configured: the library passes everything through.
  Report untouched = RunTenant({"info"}, {});
  EXPECT_EQ(untouched.Get("global_mem_size"), real.Get("global_mem_size"));
  EXPECT_EQ(untouched.Get("max_mem_alloc_size"), real.Get("max_mem_alloc_size"));
}

TEST_F(OpenClHookTest, FillStopsAtTheLimitWithAllocationFailureAndNothingLeaks) {
  Report r =
      RunTenant({"fill", "16"}, {{"TESSERA_GPU_MEMORY_LIMIT", "100MiB"}, {"TESSERA_REGION", dir_.File("r")}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.Get("allocated"), "6");  // 6 x 16 MiB fit in 100 MiB, the 7th does not
  EXPECT_EQ(r.Get("error"), std::to_string(kAllocationFailure));
  EXPECT_EQ(r.Get("allocated_again"), "6");  // after releasing all, the whole limit is free again
  EXPECT_EQ(r.Get("error_again"), std::to_string(kAllocationFailure));

  // Without the library, PoCL would have given far more.
  Report real = RunTenant({"fill", "16"}, {}, false);
  EXPECT_GT(std::stoi(real.Get("allocated")), 6);
}

TEST_F(OpenClHookTest, ReferenceCountsSubBuffersImagesAndSvm) {
  const std::string region = dir_.File("r");
  Report r =
      RunTenant({"lifecycle", "8"}, {{"TESSERA_GPU_MEMORY_LIMIT", "32MiB"}, {"TESSERA_REGION", region}});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.Get("ok"), "1") << r.output;
  for (const auto& [rule, value] : r.kv) EXPECT_NE(value, "0") << "broken rule: " << rule;

  // The container's ledger is back to zero and consistent after the process is gone.
  hook::SharedRegion shared;
  hook::Error error;
  ASSERT_TRUE(shared.Open(region.c_str(), &error)) << error.text;
  ASSERT_GE(shared.device_count(), 1);
  for (int d = 0; d < shared.device_count(); ++d) {
    EXPECT_EQ(shared.Used(d), 0u);
    EXPECT_TRUE(shared.CheckConsistent(d));
  }
  shared.Close();
}

TEST_F(OpenClHookTest, TwoProcessesOfOneContainerShareOneQuota) {
  const std::map<std::string, std::string> container{{"TESSERA_GPU_MEMORY_LIMIT", "64MiB"},
                                                     {"TESSERA_REGION", dir_.File("container-a")}};
  Tenant holder;
  ASSERT_TRUE(holder.Start({"hold", "40"}, container));
  ASSERT_EQ(holder.ReadLineStartingWith("held="), "held=1");

  Report second = RunTenant({"try", "40"}, container);  // 40 + 40 > 64
  EXPECT_EQ(second.Get("created"), "0");
  EXPECT_EQ(second.Get("error"), std::to_string(kAllocationFailure));
  Report small = RunTenant({"try", "20"}, container);  // 40 + 20 <= 64
  EXPECT_EQ(small.Get("created"), "1");

  // Another container (its own region) has its own quota.
  Report other =
      RunTenant({"try", "40"}, {{"TESSERA_GPU_MEMORY_LIMIT", "64MiB"}, {"TESSERA_REGION", dir_.File("b")}});
  EXPECT_EQ(other.Get("created"), "1");

  // When the holder releases and exits, its 40 MiB are free again.
  holder.CloseStdin();
  EXPECT_EQ(holder.Wait().exit_code, 0);
  Report after = RunTenant({"try", "40"}, container);
  EXPECT_EQ(after.Get("created"), "1");
}

TEST_F(OpenClHookTest, AKilledProcessesChargesAreReclaimed) {
  const std::map<std::string, std::string> container{{"TESSERA_GPU_MEMORY_LIMIT", "64MiB"},
                                                     {"TESSERA_REGION", dir_.File("r")}};
  Tenant holder;
  ASSERT_TRUE(holder.Start({"hold", "40"}, container));
  ASSERT_EQ(holder.ReadLineStartingWith("held="), "held=1");
  kill(holder.pid(), SIGKILL);
  holder.Wait();
  Report after = RunTenant({"try", "40"}, container);
  EXPECT_EQ(after.Get("created"), "1") << after.output;
}

TEST_F(OpenClHookTest, UnreadableLimitsFileFailsClosed) {
  // Limits were configured but cannot be read: device use is refused (the first refusal the program meets is
  // its command queue), never silently unlimited.
  Report r = RunTenant({"try", "1"}, {{"TESSERA_LIMITS_FILE", dir_.File("missing-limits")}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("code=" + std::to_string(kOutOfResources)), std::string::npos) << r.output;
}

// A zero memory limit is refused (never "no limit" by accident), from the environment and the limits file.
TEST_F(OpenClHookTest, ZeroMemoryLimitFailsClosed) {
  Report r =
      RunTenant({"try", "1"}, {{"TESSERA_GPU_MEMORY_LIMIT", "0GiB"}, {"TESSERA_REGION", dir_.File("r")}});
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("code=" + std::to_string(kOutOfResources)), std::string::npos) << r.output;
  const std::string file = dir_.File("limits");
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fputs("tessera-limits 1\ngeneration 1\ngpu index=* memory=33554432 cores=100 memory=0\n", f);
  fclose(f);
  Report dup = RunTenant({"try", "1"}, {{"TESSERA_LIMITS_FILE", file}, {"TESSERA_REGION", dir_.File("r")}});
  EXPECT_EQ(dup.exit_code, 1) << dup.output;
}

// A region whose GPU lock names a live thread that never lets go (a tenant stopped inside it, or a planted
// file): the library gives up after its lock timeout, and the program still runs to its end and exits.
TEST_F(OpenClHookTest, JammedRegionLockDoesNotHangTheProgram) {
  const std::map<std::string, std::string> env = {{"TESSERA_GPU_MEMORY_LIMIT", "64MiB"},
                                                  {"TESSERA_REGION", dir_.File("r")},
                                                  {"TESSERA_REGION_LOCK_TIMEOUT_MS", "200"}};
  Report first = RunTenant({"fill", "16"}, env);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  {
    hook::SharedRegion region;
    hook::Error error;
    ASSERT_TRUE(region.Open(dir_.File("r").c_str(), &error)) << error.text;
    ASSERT_GE(region.device_count(), 1);
    const int live = static_cast<int>(getpid());  // this test: alive, and never unlocks
    memcpy(&region.device(0)->lock, &live, sizeof(live));
    region.Close();
  }
  Tenant t;
  ASSERT_TRUE(t.Start({"fill", "16"}, env));
  std::atomic<bool> done{false};
  std::atomic<bool> killed{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 600 && !done.load(); ++i) usleep(100000);
    if (!done.load()) {
      killed.store(true);
      kill(t.pid(), SIGKILL);
    }
  });
  Report r = t.Wait();
  done.store(true);
  watchdog.join();
  EXPECT_FALSE(killed.load()) << "the program hung on the jammed lock";
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.Get("allocated"), "0") << "nothing can be charged without the lock\n" << r.output;
}

TEST_F(OpenClHookTest, LimitsFileNamesTheDeviceByIndex) {
  hook::Limits limits;
  limits.generation = 1;
  limits.device_count = 1;
  limits.devices[0].index = 0;
  limits.devices[0].memory_bytes = 24ull << 20;
  limits.devices[0].ceiling_percent = 100;
  hook::Error error;
  const std::string file = dir_.File("limits");
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  Report r = RunTenant({"info"}, {{"TESSERA_LIMITS_FILE", file}, {"TESSERA_REGION", dir_.File("r")}});
  EXPECT_EQ(r.Get("global_mem_size"), std::to_string(24u << 20)) << r.output;
}

// The node agent's line names the node's GPU by UUID and its place in the container's list. PoCL's device has
// no UUID: at that place, it is that GPU, limited by the line and accounted under its UUID in the region
// (where the agent keeps the container's quota for it).
TEST_F(OpenClHookTest, ADeviceWithoutAUuidIsTheGpuTheAgentsLineNamesAtItsPlace) {
  hook::Limits limits;
  limits.generation = 1;
  limits.device_count = 1;
  hook::CopyString(limits.devices[0].uuid, sizeof(limits.devices[0].uuid),
                   "GPU-92276658-1e27-41c0-8a6a-63ec24ede6a4");
  limits.devices[0].index = 0;
  limits.devices[0].memory_bytes = 24ull << 20;
  hook::Error error;
  const std::string file = dir_.File("limits");
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  const std::string region = dir_.File("r");
  Report r = RunTenant({"fill", "4"}, {{"TESSERA_LIMITS_FILE", file}, {"TESSERA_REGION", region}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.Get("allocated"), "6") << "4 MiB buffers up to the 24 MiB limit\n" << r.output;
  hook::SharedRegion shared;
  ASSERT_TRUE(shared.Open(region.c_str(), &error)) << error.text;
  EXPECT_GE(shared.FindDevice("GPU-92276658-1e27-41c0-8a6a-63ec24ede6a4"), 0) << "the quota is the GPU's";
  EXPECT_LT(shared.FindDevice("opencl-0"), 0);
  shared.Close();

  // At another place the line is not this device's: a CPU device the file does not name is left alone.
  limits.devices[0].index = 1;
  limits.generation = 2;
  ASSERT_TRUE(hook::WriteLimitsFile(file.c_str(), limits, &error)) << error.text;
  Report other = RunTenant({"info"}, {{"TESSERA_LIMITS_FILE", file}, {"TESSERA_REGION", dir_.File("r2")}});
  ASSERT_EQ(other.exit_code, 0) << other.output;
  EXPECT_NE(other.Get("global_mem_size"), std::to_string(24u << 20)) << other.output;
}

// --- Compute shares (the seed's Figure 2) -----------------------------------------------------------------

// The mean share of the windows that start in [from_ms, to_ms).
// The time those windows cover (cl_tenant's windows are 250 ms): the span to read the machine's part over.
struct Span {
  double from_ms = 0;
  double to_ms = 0;
};
constexpr double kWindowMs = 250;

double MeanShare(const Report& r, double from_ms, double to_ms, Span* covered = nullptr) {
  double sum = 0;
  int n = 0;
  Span c{std::numeric_limits<double>::infinity(), 0};
  for (const auto& [ms, share] : r.Windows()) {
    if (ms >= from_ms && ms < to_ms) {
      sum += share;
      ++n;
      c.from_ms = std::min(c.from_ms, ms);
      c.to_ms = std::max(c.to_ms, ms + kWindowMs);
    }
  }
  if (covered != nullptr) *covered = n == 0 ? Span{} : c;
  return n == 0 ? std::nan("") : sum / n;
}

struct TenantSpec {
  int cores;
  std::string region;
};

// A spin tenant's report and the part of PoCL's device the machine took over the span its `share=` covers
// (from 0.5 s after its start to its end).
struct Measured {
  Report report;
  double foreign = 0;
};

std::vector<Measured> RunConcurrently(const std::vector<TenantSpec>& specs, const std::string& seconds,
                                      bool ext = false) {
  ForeignCpu foreign(std::stoi(SharedCpu()));
  std::vector<std::unique_ptr<Tenant>> tenants;
  for (const TenantSpec& s : specs) {
    auto t = std::make_unique<Tenant>();
    std::vector<std::string> args{"spin", seconds, "--cpu", SharedCpu(), "--kernel-ms", "5"};
    if (ext) args.push_back("--ext");
    EXPECT_TRUE(
        t->Start(args, {{"TESSERA_GPU_CORES", std::to_string(s.cores)}, {"TESSERA_REGION", s.region}}));
    foreign.AddTenant(t->pid());
    tenants.push_back(std::move(t));
  }
  std::vector<Measured> out;
  for (auto& t : tenants) {
    Measured m{t->Wait(), 0};
    const double begin = m.report.Number("begin_ms");
    m.foreign = foreign.Fraction(begin + 500, begin + std::stod(seconds) * 1e3);
    out.push_back(std::move(m));
  }
  return out;
}

void ExpectShares(const std::vector<Measured>& runs, const std::vector<int>& cores) {
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_EQ(runs[i].report.exit_code, 0) << runs[i].report.output;
    const double share = runs[i].report.Number("share");
    const double target = cores[i] / 100.0;
    std::printf("tenant %zu: target %.2f measured %.4f (device taken by other processes %.4f)\n", i, target,
                share, runs[i].foreign);
    EXPECT_LE(share, target + kTolerance) << "tenant " << i;
    EXPECT_GE(share, target - kTolerance - runs[i].foreign) << "tenant " << i;
  }
}

// The tenant under the library (exclusive: 100) and the same program without it, side by side on the one CPU
// device over the same 3 s: the mean share of each over the windows both ran whole.
struct SideBySide {
  double hooked = 0;
  double plain = 0;
};

SideBySide ExclusiveBesidePlain(const std::string& region) {
  const std::vector<std::string> args{
      "spin", "60", "--cpu", SharedCpu(), "--kernel-ms", "5", "--until-stdin-closes"};
  Tenant plain;
  Tenant hooked;
  EXPECT_TRUE(plain.Start(args, {}, false));
  EXPECT_TRUE(hooked.Start(args, {{"TESSERA_GPU_CORES", "100"}, {"TESSERA_REGION", region}}));
  // Both calibrated and launching: the windows from here on are the ones compared.
  EXPECT_NE(plain.ReadLineStartingWith("iters="), "");
  EXPECT_NE(hooked.ReadLineStartingWith("iters="), "");
  const double from = MonotonicMs() + 250;
  usleep(3250000);
  const double to = MonotonicMs() - 250;  // windows that start before this one ended before both stop
  const Report rp = plain.Wait();         // closes stdin: it stops
  const Report rh = hooked.Wait();
  EXPECT_EQ(rp.exit_code, 0) << rp.output;
  EXPECT_EQ(rh.exit_code, 0) << rh.output;
  return {MeanShare(rh, from, to), MeanShare(rp, from, to)};
}

TEST_F(OpenClHookTest, OneTenantWithTheWholeDevice) {
  // Exclusive mode is not paced: the tenant gets what the device gives any program. What the device gives
  // depends on the machine (on a loaded one PoCL's threads wait for a CPU between kernels), so the target is
  // what the same program without the library gets beside it, on the same device in the same windows.
  // Measured one after the other instead, the baseline's 0.944 met the tenant's 0.786 at load 5-12 (the
  // machine was busier for the second), and at load 20-30 the time waited for a CPU (summed over PoCL's
  // threads) read 1.0 and took the bound to nothing. Side by side at load 20-30 on 2 cores: 0.86 beside 0.88,
  // 0.88 beside 0.89, 0.86 beside 0.85; the library pacing the tenant at 80 instead read 0.79 beside 0.94, at
  // 60 0.52 beside 0.95 (deliberate breaks). A window in which even the program without the library did not
  // get the whole device (below 0.9) is run again, up to five times; a window the machine gave whole decides
  // at once.
  constexpr double kWholeDevice = 0.9;
  SideBySide s;
  for (int attempt = 1; attempt <= 5; ++attempt) {
    s = ExclusiveBesidePlain(dir_.File("a" + std::to_string(attempt)));
    std::printf("attempt %d: exclusive tenant %.4f, same program without the library beside it %.4f\n",
                attempt, s.hooked, s.plain);
    if (s.hooked >= s.plain - kTolerance || s.plain >= kWholeDevice) break;
  }
  EXPECT_GE(s.hooked, s.plain - kTolerance);
}

TEST_F(OpenClHookTest, TwoTenantsHalfEach) {
  std::vector<Measured> r = RunConcurrently({{50, dir_.File("a")}, {50, dir_.File("b")}}, "3");
  ExpectShares(r, {50, 50});
}

TEST_F(OpenClHookTest, FourTenantsAQuarterEach) {
  std::vector<Measured> r = RunConcurrently(
      {{25, dir_.File("a")}, {25, dir_.File("b")}, {25, dir_.File("c")}, {25, dir_.File("d")}}, "3");
  ExpectShares(r, {25, 25, 25, 25});
}

TEST_F(OpenClHookTest, TwoProcessesOfOneContainerShareOneBudget) {
  // Two processes, one container at 50: together they hold 50, each about 25.
  std::vector<Measured> r = RunConcurrently({{50, dir_.File("same")}, {50, dir_.File("same")}}, "3");
  ASSERT_EQ(r.size(), 2u);
  const double total = r[0].report.Number("share") + r[1].report.Number("share");
  const double foreign = std::max(r[0].foreign, r[1].foreign);
  std::printf("one container, two processes: %.4f + %.4f = %.4f (target 0.50; device taken by others %.4f)\n",
              r[0].report.Number("share"), r[1].report.Number("share"), total, foreign);
  EXPECT_LE(total, 0.50 + kTolerance);
  EXPECT_GE(total, 0.50 - kTolerance - foreign);
}

// --- Priority (the seed's Figure 3) ------------------------------------------------------------------------

void WriteLimits(const std::string& path, uint64_t generation, uint32_t cores, hook::Priority priority,
                 hook::ComputePolicy policy = hook::ComputePolicy::kHard, uint32_t ceiling = 100,
                 uint32_t tenants = 0) {
  hook::Limits limits;
  limits.devices[0].tenants = tenants;
  limits.generation = generation;
  limits.device_count = 1;
  limits.devices[0].index = hook::kAnyDevice;
  limits.devices[0].cores_percent = cores;
  limits.devices[0].ceiling_percent = ceiling;
  limits.devices[0].priority = priority;
  limits.devices[0].policy = policy;
  hook::Error error;
  ASSERT_TRUE(hook::WriteLimitsFile(path.c_str(), limits, &error)) << error.text;
}

// The seed's Figure 3 with the test playing the node agent: low-priority A runs alone for `alone_us`; then
// the agent rewrites A's limits (generation 2, `write_a`) and high-priority B starts once A says it applied
// them, for `b_seconds`; A stops 200 ms after B. What other processes took of the device is sampled
// throughout (`foreign`, for the spans the test measures over).
struct LowThenHigh {
  Report a;
  Report b;
  double b_arrives = 0;  // when the agent rewrote A's limits
  std::unique_ptr<ForeignCpu> foreign;
};

void RunLowThenHigh(const std::string& dir, const std::function<void(const std::string&, uint64_t)>& write_a,
                    const std::function<void(const std::string&)>& write_b, useconds_t alone_us,
                    const std::string& b_seconds, LowThenHigh* out) {
  std::filesystem::create_directories(dir);
  const std::string a_limits = dir + "/a-limits";
  const std::string b_limits = dir + "/b-limits";
  write_a(a_limits, 1);
  write_b(b_limits);
  const std::string cpu = SharedCpu();
  out->foreign = std::make_unique<ForeignCpu>(std::stoi(cpu));
  Tenant a;
  ASSERT_TRUE(a.Start(
      {"spin", "30", "--cpu", cpu, "--kernel-ms", "5", "--until-stdin-closes"},
      {{"TESSERA_LIMITS_FILE", a_limits}, {"TESSERA_REGION", dir + "/a"}, {"TESSERA_HOOK_LOG", "info"}}));
  out->foreign->AddTenant(a.pid());
  ASSERT_NE(a.ReadLineStartingWith("iters="), "");
  usleep(alone_us);  // A alone: the windows its share before B is measured over
  out->b_arrives = MonotonicMs();
  write_a(a_limits, 2);
  ASSERT_NE(a.ReadLineContaining("applied limits generation 2"), "");
  Tenant b;
  ASSERT_TRUE(b.Start({"spin", b_seconds, "--cpu", cpu, "--kernel-ms", "5"},
                      {{"TESSERA_LIMITS_FILE", b_limits}, {"TESSERA_REGION", dir + "/b"}}));
  out->foreign->AddTenant(b.pid());
  out->b = b.Wait();
  usleep(200000);
  out->a = a.Wait();  // closes A's stdin: A stops
  ASSERT_EQ(out->a.exit_code, 0) << out->a.output;
  ASSERT_EQ(out->b.exit_code, 0) << out->b.output;
}

// The seed's experiment: low-priority A holds 40 of the GPU; high-priority B asks for 70, more than the 60
// left, so A is compressed by equations (1) and (2) to 30 (the scheduler's decision, written live into A's
// limits file by the node agent). A's share drops as soon as B starts.
TEST_F(OpenClHookTest, HighPriorityTenantArrivingMidRunCompressesTheLowPriorityOne) {
  LowThenHigh run;
  RunLowThenHigh(
      dir_.File("run"),
      [](const std::string& path, uint64_t generation) {
        WriteLimits(path, generation, generation == 1 ? 40 : 30, hook::Priority::kLow);
      },
      [](const std::string& path) { WriteLimits(path, 1, 70, hook::Priority::kHigh); }, 1500000, "2.5", &run);
  if (HasFatalFailure()) return;
  const Report& ra = run.a;
  const Report& rb = run.b;
  const double a_begin = ra.Number("begin_ms");
  const double b_begin = rb.Number("begin_ms");
  Span before;
  Span with_b;
  const double a_before = MeanShare(ra, a_begin + 500, run.b_arrives - 250, &before);
  // A applied the rewrite before B started; B's first 250 ms include its own start-up.
  const double a_after = MeanShare(ra, b_begin + 250, b_begin + 2250, &with_b);
  const double b_share = rb.Number("share");
  const double lost_before = run.foreign->Fraction(before.from_ms, before.to_ms);
  const double lost_with_b = run.foreign->Fraction(with_b.from_ms, with_b.to_ms);
  const double lost_b = run.foreign->Fraction(b_begin + 500, b_begin + 2500);  // B's share= span
  std::printf(
      "A before B: %.4f (target 0.40); A with B: %.4f (target 0.30); B: %.4f (target 0.70); device "
      "taken by other processes %.4f, %.4f, %.4f\n",
      a_before, a_after, b_share, lost_before, lost_with_b, lost_b);
  // Both are hard shares: the hook never lets either above its share, however busy the machine.
  EXPECT_LE(a_before, 0.40 + kTolerance);
  EXPECT_GE(a_before, 0.40 - kTolerance - lost_before);
  EXPECT_LE(a_after, 0.30 + kTolerance);
  EXPECT_GE(a_after, 0.30 - kTolerance - lost_with_b);
  EXPECT_LE(b_share, 0.70 + kTolerance);
  EXPECT_GE(b_share, 0.70 - kTolerance - lost_b);
}

// Elastic and low priority: alone on the device (the agent's limits file says tenants=1), A grows into the
// idle time up to its ceiling; when high-priority B arrives the agent rewrites both files with tenants=2, and
// A is back at its share while B gets its own. Before the agent's count, A never grew (0.298, 0.299, 0.299
// alone), and the test accepted anything from 0.25 to 0.95: it now fails when A does not grow.
struct ElasticBesideHighPriority {
  double a_alone = 0;
  double a_with_b = 0;
  double b_share = 0;
  // The machine's part of the device over each of those (ForeignCpu).
  double lost_alone = 0;
  double lost_with_b = 0;
  double lost_b = 0;
};

void RunElasticBesideHighPriority(const std::string& dir, ElasticBesideHighPriority* out) {
  LowThenHigh run;
  // A alone for 2 s, growing; B's arrival tells A there are two containers on the device.
  RunLowThenHigh(
      dir,
      [](const std::string& path, uint64_t generation) {
        WriteLimits(path, generation, 30, hook::Priority::kLow, hook::ComputePolicy::kElastic, 90,
                    /*tenants=*/generation == 1 ? 1 : 2);
      },
      [](const std::string& path) {
        WriteLimits(path, 1, 60, hook::Priority::kHigh, hook::ComputePolicy::kHard, 100, /*tenants=*/2);
      },
      2000000, "2", &run);
  if (::testing::Test::HasFatalFailure()) return;
  // Growth takes a few 200 ms steps; the window starts after them and ends before A read tenants=2.
  const double a_begin = run.a.Number("begin_ms");
  const double b_begin = run.b.Number("begin_ms");
  Span alone;
  Span with_b;
  out->a_alone = MeanShare(run.a, a_begin + 800, run.b_arrives - kWindowMs, &alone);
  out->a_with_b = MeanShare(run.a, b_begin + 250, b_begin + 1750, &with_b);
  out->b_share = run.b.Number("share");
  out->lost_alone = run.foreign->Fraction(alone.from_ms, alone.to_ms);
  out->lost_with_b = run.foreign->Fraction(with_b.from_ms, with_b.to_ms);
  out->lost_b = run.foreign->Fraction(b_begin + 500, b_begin + 2000);  // B's share= span
}

TEST_F(OpenClHookTest, ElasticLowPriorityTenantYieldsToHighPriority) {
  // A reads B through its own kernels' slowdown (there is no NVML for PoCL). Device time other processes take
  // makes that reading noisy: a step in which A's kernels happened to run undisturbed reads as an idle
  // device, and A grows for that step (a 0.556 window beside B at 14 busy loops, while B kept its 0.60). So
  // A's yield is judged on a run in which the machine took at most kQuiet of the device beside B (that part
  // allowed above A's share), run again up to five times; on a machine busier than that in every run it is
  // not judged, and the test says so. With the yield removed from the controller A reads 0.43 beside B.
  constexpr double kQuiet = 0.10;
  ElasticBesideHighPriority r;
  for (int attempt = 1; attempt <= 5; ++attempt) {
    RunElasticBesideHighPriority(dir_.File("attempt" + std::to_string(attempt)), &r);
    if (HasFatalFailure()) return;
    std::printf(
        "attempt %d: elastic A alone %.4f (share 0.30, ceiling 0.90), A with B %.4f, B %.4f (target "
        "0.60); device taken by other processes %.4f, %.4f, %.4f\n",
        attempt, r.a_alone, r.a_with_b, r.b_share, r.lost_alone, r.lost_with_b, r.lost_b);
    if (r.lost_with_b <= kQuiet) break;
  }
  EXPECT_GE(r.a_alone, 0.60 - r.lost_alone) << "alone, the elastic tenant grows into the idle device time";
  EXPECT_LE(r.a_alone, 0.90 + kTolerance);
  if (r.lost_with_b <= kQuiet) {
    EXPECT_LE(r.a_with_b, 0.30 + kTolerance + r.lost_with_b) << "A gives way to high-priority B";
  } else {
    std::printf("A's yield not judged: other processes took %.4f of the device beside B in five runs\n",
                r.lost_with_b);
    EXPECT_LE(r.a_with_b, 0.90 + kTolerance);
  }
  EXPECT_GE(r.a_with_b, 0.30 - kTolerance - r.lost_with_b);
  EXPECT_LE(r.b_share, 0.60 + kTolerance);
  EXPECT_GE(r.b_share, 0.60 - kTolerance - r.lost_b);
}

}  // namespace
}  // namespace tessera::cltest
