// libtessera-opencl.so under real OpenCL programs on PoCL's CPU device. Each test runs cl_tenant processes
// with the library preloaded and checks what the OpenCL runtime told them: memory limits and their errors,
// reported memory, one quota per container across processes, and device-time shares (the SharedGPU seed's
// Figures 2 and 3).
//
// The share tests pin every tenant to one CPU, so PoCL's CPU device is one device the tenants contend for,
// and measure each tenant's share as the device time of its own kernels (their profiling events) per wall
// time. The machine may be busy with other work: that only makes kernels longer, it does not change the share
// of device time a paced tenant is allowed.
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

// --- Compute shares (the seed's Figure 2) -----------------------------------------------------------------

struct TenantSpec {
  int cores;
  std::string region;
};

std::vector<Report> RunConcurrently(const std::vector<TenantSpec>& specs, const std::string& seconds,
                                    bool ext = false) {
  std::vector<std::unique_ptr<Tenant>> tenants;
  for (const TenantSpec& s : specs) {
    auto t = std::make_unique<Tenant>();
    std::vector<std::string> args{"spin", seconds, "--cpu", SharedCpu(), "--kernel-ms", "5"};
    if (ext) args.push_back("--ext");
    EXPECT_TRUE(
        t->Start(args, {{"TESSERA_GPU_CORES", std::to_string(s.cores)}, {"TESSERA_REGION", s.region}}));
    tenants.push_back(std::move(t));
  }
  std::vector<Report> reports;
  for (auto& t : tenants) reports.push_back(t->Wait());
  return reports;
}

void ExpectShares(const std::vector<Report>& reports, const std::vector<int>& cores, double low_slack = 0) {
  for (size_t i = 0; i < reports.size(); ++i) {
    ASSERT_EQ(reports[i].exit_code, 0) << reports[i].output;
    const double share = reports[i].Number("share");
    const double target = cores[i] / 100.0;
    std::printf("tenant %zu: target %.2f measured %.4f\n", i, target, share);
    EXPECT_NEAR(share, target, kTolerance + (share < target ? low_slack : 0)) << "tenant " << i;
  }
}

TEST_F(OpenClHookTest, OneTenantWithTheWholeDevice) {
  std::vector<Report> r = RunConcurrently({{100, dir_.File("a")}}, "2.5");
  ExpectShares(r, {100});
}

TEST_F(OpenClHookTest, TwoTenantsHalfEach) {
  std::vector<Report> r = RunConcurrently({{50, dir_.File("a")}, {50, dir_.File("b")}}, "3");
  ExpectShares(r, {50, 50});
}

TEST_F(OpenClHookTest, FourTenantsAQuarterEach) {
  std::vector<Report> r = RunConcurrently(
      {{25, dir_.File("a")}, {25, dir_.File("b")}, {25, dir_.File("c")}, {25, dir_.File("d")}}, "3");
  ExpectShares(r, {25, 25, 25, 25});
}

TEST_F(OpenClHookTest, TwoProcessesOfOneContainerShareOneBudget) {
  // Two processes, one container at 50: together they hold 50, each about 25.
  std::vector<Report> r = RunConcurrently({{50, dir_.File("same")}, {50, dir_.File("same")}}, "3");
  ASSERT_EQ(r.size(), 2u);
  const double total = r[0].Number("share") + r[1].Number("share");
  std::printf("one container, two processes: %.4f + %.4f = %.4f (target 0.50)\n", r[0].Number("share"),
              r[1].Number("share"), total);
  EXPECT_NEAR(total, 0.50, kTolerance);
}

}  // namespace
}  // namespace tessera::cltest
