// Simulator speed: one policy, one seed, the default Alibaba trace scaled to 130%, as `tessera simulate` runs
// it, next to the same replay without the evaluation cache (every node evaluated for every pod, as the FGD
// study's simulator does), measured in the same run.
//
//   build/bin/sim_bench [--traces DIR] [--policy tessera] [--seed 42]
//
// Target (issue "Simulator and placement quality"): under 5 s; the FGD study's simulator needs about 10
// minutes per run on 2 vCPUs.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/files.h"
#include "sim/metrics.h"
#include "sim/replay.h"
#include "sim/workload.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;  // NOLINT
  std::string traces = std::string(TESSERA_SOURCE_DIR) + "/../shared/traces/alibaba-gpu-v2023";
  std::string policy = "tessera";
  uint64_t seed = 42;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--traces=", 9) == 0) traces = argv[i] + 9;
    if (std::strncmp(argv[i], "--policy=", 9) == 0) policy = argv[i] + 9;
    if (std::strncmp(argv[i], "--seed=", 7) == 0) seed = std::strtoull(argv[i] + 7, nullptr, 10);
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "sim_bench [--traces=DIR] [--policy=tessera] [--seed=42]: time one replay of the default trace\n");
      return 0;
    }
  }
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> nodes = ReadTextFile(traces + "/openb_node_list_gpu_node.csv");
  absl::StatusOr<std::string> pods = ReadTextFile(traces + "/openb_pod_list_default.csv");
  if (!nodes.ok() || !pods.ok()) {
    std::fprintf(stderr, "sim_bench: %s (give --traces=DIR)\n",
                 std::string((!nodes.ok() ? nodes.status() : pods.status()).message()).c_str());
    return 2;
  }
  sim::ReplayInput input =
      sim::ReplayInput::Make(*sim::LoadCluster(*nodes, "nodes"), *sim::LoadPods(*pods, "pods"));
  const double load = Seconds(load_start);

  auto timed = [&](const sim::ReplayOptions& options, double* seconds) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<sim::RunResult> r = sim::Replay(input, policy, seed, 1.3, nullptr, options);
    *seconds = Seconds(start);
    return r;
  };
  double cached = 0;
  double uncached = 0;
  absl::StatusOr<sim::RunResult> fast = timed({}, &cached);
  absl::StatusOr<sim::RunResult> slow = timed({.evaluation_cache = false}, &uncached);
  if (!fast.ok() || !slow.ok()) {
    std::fprintf(stderr, "sim_bench: %s\n",
                 std::string((!fast.ok() ? fast.status() : slow.status()).message()).c_str());
    return 1;
  }
  const sim::Curve c = sim::BinRun(*fast, 130);
  std::printf("default trace, %s, seed %llu: %zu pods arrived, %zu placed, %.2f%% unallocated at 100%%\n",
              policy.c_str(), static_cast<unsigned long long>(seed), fast->pods, fast->placed,
              100 - c.allocated_pct[100]);
  std::printf("  load and prepare:                 %6.2f s\n", load);
  std::printf("  replay:                           %6.2f s  (target < 5 s: %s)\n", cached,
              load + cached < 5 ? "met" : "NOT met");
  std::printf("  replay without evaluation cache:  %6.2f s  (baseline, same run; ratio %.1fx)\n", uncached,
              uncached / cached);
  std::printf("  same decisions either way:        %s\n", fast->placed == slow->placed ? "yes" : "NO");
  std::printf("  FGD study's simulator, ~600 s per run on 2 vCPUs (as reported): ratio %.0fx\n",
              600 / (load + cached));
  return fast->placed == slow->placed ? 0 : 1;
}
