// Device-time shares of OpenCL tenants under libtessera-opencl.so, on PoCL's CPU device (one CPU shared by
// every tenant): the SharedGPU seed's Figure 2 (1, 2 and 4 tenants with shares 100, 50/50 and 25x4) and a
// mixed case, each against the same tenants without the library (the baseline, where they split the device
// as the OS happens to schedule them).
//
//   build/bench/opencl_shares_bench [seconds per run, default 4]
//
// Prints one line per tenant: target, measured share with the library, and without it.
#include <sched.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "tenant_runner.h"

namespace {

using tessera::cltest::Report;
using tessera::cltest::Tenant;

std::string FirstCpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) return std::to_string(i);
    }
  }
  return "0";
}

std::vector<double> RunShares(const std::vector<int>& cores, const std::string& seconds, bool preload,
                              const std::string& dir) {
  std::vector<std::unique_ptr<Tenant>> tenants;
  for (size_t i = 0; i < cores.size(); ++i) {
    auto t = std::make_unique<Tenant>();
    const std::string region = dir + "/region-" + std::to_string(i) + (preload ? "-hooked" : "-plain");
    if (!t->Start({"spin", seconds, "--cpu", FirstCpu(), "--kernel-ms", "5"},
                  {{"TESSERA_GPU_CORES", std::to_string(cores[i])}, {"TESSERA_REGION", region}}, preload)) {
      std::fprintf(stderr, "cannot start %s\n", tessera::cltest::TenantPath().c_str());
      std::exit(1);
    }
    tenants.push_back(std::move(t));
  }
  std::vector<double> shares;
  for (auto& t : tenants) {
    const Report r = t->Wait();
    if (r.exit_code != 0) {
      std::fprintf(stderr, "tenant failed:\n%s\n", r.output.c_str());
      std::exit(1);
    }
    shares.push_back(r.Number("share"));
  }
  return shares;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h")) {
    std::printf("usage: opencl_shares_bench [seconds per run (default 4)]\n");
    return 0;
  }
  const std::string seconds = argc > 1 ? argv[1] : "4";
  char tmpl[] = "/tmp/tessera-opencl-bench-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  std::filesystem::create_directories(tessera::cltest::PoclCacheDir());
  setenv("POCL_CACHE_DIR", tessera::cltest::PoclCacheDir().c_str(), 1);
  const std::vector<std::pair<std::string, std::vector<int>>> scenarios{
      {"1 tenant (exclusive)", {100}},
      {"2 tenants 50/50", {50, 50}},
      {"4 tenants 25x4", {25, 25, 25, 25}},
      {"3 tenants 60/30/10", {60, 30, 10}},
  };
  std::printf("# device-time share per tenant on PoCL's CPU device, %s s per run, tenants pinned to CPU %s\n",
              seconds.c_str(), FirstCpu().c_str());
  std::printf("%-22s %6s %8s %10s %10s\n", "scenario", "tenant", "target", "tessera", "no-limit");
  double worst = 0;
  for (const auto& [name, cores] : scenarios) {
    const std::vector<double> hooked = RunShares(cores, seconds, true, dir);
    const std::vector<double> plain = RunShares(cores, seconds, false, dir);
    for (size_t i = 0; i < cores.size(); ++i) {
      const double target = cores[i] / 100.0;
      worst = std::max(worst, std::fabs(hooked[i] - target));
      std::printf("%-22s %6zu %8.2f %10.4f %10.4f\n", name.c_str(), i, target, hooked[i], plain[i]);
    }
  }
  std::printf("# largest distance from a target with tessera: %.1f points\n", worst * 100);
  std::filesystem::remove_all(dir);
  return 0;
}
