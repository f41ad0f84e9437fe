// Simulator speed: one policy, one seed, the default Alibaba trace scaled to 130%, as `tessera simulate` runs
// it, next to the same replay without the evaluation cache (every node evaluated for every pod, as the FGD
// study's simulator does), measured in the same run.
//
//   build/bin/sim_bench [--traces DIR] [--policy tessera] [--seed 42]
//   build/bin/sim_bench --quick       # CI: examples/sim (in the repository), several policies and seeds
//
// Target (issue 13, "Placement that generalises"): load and replay under 1 s (an earlier issue asked
// for 5 s); the FGD study's simulator needs about 10
// minutes per run on 2 vCPUs. The full run exits 1 when the target is missed.
//
// Checks, in every mode (exit 1 on a wrong answer; quick mode judges no time): with and without the cache,
// the replay makes the same decisions (every arrival's allocated GPU and fragmentation alike, not only the
// count placed); no arrival allocates more than the cluster's GPUs or less than the one before (pods never
// leave); every arrival is recorded.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/files.h"
#include "core/strings.h"
#include "sim/metrics.h"
#include "sim/replay.h"
#include "sim/workload.h"

namespace {

using namespace tessera;  // NOLINT

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Why the run with the cache (`fast`) and the one without (`slow`) cannot both be right; "" when they agree
// and each is a possible replay.
std::string Problem(const sim::RunResult& fast, const sim::RunResult& slow) {
  for (const sim::RunResult* r : {&fast, &slow}) {
    if (r->events.size() != r->pods) return "an arrival is not recorded";
    if (r->placed > r->pods) return "more pods placed than arrived";
    int64_t used = 0;
    for (const sim::Event& e : r->events) {
      if (e.used_milli < used) return "an arrival freed GPU (pods never leave)";
      if (e.used_milli > r->capacity_milli) return "more GPU allocated than the cluster has";
      used = e.used_milli;
    }
  }
  if (fast.placed != slow.placed) {
    return StrCat(fast.placed, " pods placed with the cache, ", slow.placed, " without");
  }
  for (size_t i = 0; i < fast.events.size(); ++i) {
    const sim::Event& a = fast.events[i];
    const sim::Event& b = slow.events[i];
    if (a.arrived_milli != b.arrived_milli || a.used_milli != b.used_milli ||
        std::fabs(a.frag_milli - b.frag_milli) > 1e-6 * std::max(1.0, std::fabs(b.frag_milli))) {
      return StrCat("arrival ", i, ": ", a.used_milli, " thousandths allocated with the cache, ",
                    b.used_milli, " without");
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  std::string traces = std::string(TESSERA_SOURCE_DIR) + "/../shared/traces/alibaba-gpu-v2023";
  std::string policy = "tessera";
  uint64_t seed = 42;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--traces=", 9) == 0) traces = argv[i] + 9;
    if (std::strncmp(argv[i], "--policy=", 9) == 0) policy = argv[i] + 9;
    if (std::strncmp(argv[i], "--seed=", 7) == 0) seed = std::strtoull(argv[i] + 7, nullptr, 10);
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "sim_bench [--traces=DIR] [--policy=tessera] [--seed=42]: time one replay of the default trace\n"
          "  (../shared/traces/alibaba-gpu-v2023) at 130%%, with the evaluation cache and without it.\n"
          "  Target: load and replay under 1 s; the full run exits 1 when it is missed.\n"
          "sim_bench --quick: CI mode, on examples/sim (in the repository): tessera, fgd, bestfit, dotprod\n"
          "  and packing (the policies the cache serves), seeds 42-45; times are printed, never judged.\n"
          "Every run checks the answers (exit 1 on a wrong one): with and without the cache, every\n"
          "arrival's allocated GPU and fragmentation are the same; no arrival allocates more than the\n"
          "cluster's GPUs or less than the one before; every arrival is recorded.\n");
      return 0;
    }
  }
  std::string nodes_file = traces + "/openb_node_list_gpu_node.csv";
  std::string pods_file = traces + "/openb_pod_list_default.csv";
  std::vector<std::string> policies = {policy};
  std::vector<uint64_t> seeds = {seed};
  if (quick) {
    nodes_file = std::string(TESSERA_SOURCE_DIR) + "/examples/sim/nodes.csv";
    pods_file = std::string(TESSERA_SOURCE_DIR) + "/examples/sim/pods.csv";
    policies = {"tessera", "fgd", "bestfit", "dotprod", "packing"};  // the cached (deterministic) ones
    seeds = {42, 43, 44, 45};
  }
  const auto load_start = std::chrono::steady_clock::now();
  absl::StatusOr<std::string> nodes = ReadTextFile(nodes_file);
  absl::StatusOr<std::string> pods = ReadTextFile(pods_file);
  if (!nodes.ok() || !pods.ok()) {
    std::fprintf(stderr, "sim_bench: %s (give --traces=DIR)\n",
                 std::string((!nodes.ok() ? nodes.status() : pods.status()).message()).c_str());
    return 2;
  }
  absl::StatusOr<core::Cluster> cluster = sim::LoadCluster(*nodes, nodes_file);
  absl::StatusOr<std::vector<core::PodRequest>> workload = sim::LoadPods(*pods, pods_file);
  if (!cluster.ok() || !workload.ok()) {
    std::fprintf(stderr, "sim_bench: %s\n",
                 std::string((!cluster.ok() ? cluster.status() : workload.status()).message()).c_str());
    return 2;
  }
  sim::ReplayInput input = sim::ReplayInput::Make(*std::move(cluster), *std::move(workload));
  const double load = Seconds(load_start);

  int failures = 0;
  double worst = 0;
  for (const std::string& p : policies) {
    for (uint64_t s : seeds) {
      auto timed = [&](const sim::ReplayOptions& options, double* seconds) {
        const auto start = std::chrono::steady_clock::now();
        absl::StatusOr<sim::RunResult> r = sim::Replay(input, p, s, 1.3, nullptr, options);
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
      worst = std::max(worst, cached);
      const std::string problem = Problem(*fast, *slow);
      const sim::Curve c = sim::BinRun(*fast, 130);
      std::printf("%s, %s, seed %llu: %zu pods arrived, %zu placed, %.2f%% unallocated at 100%%\n",
                  quick ? "examples/sim" : "default trace", p.c_str(), static_cast<unsigned long long>(s),
                  fast->pods, fast->placed, 100 - c.allocated_pct[100]);
      std::printf("  load and prepare:                 %6.2f s\n", load);
      if (quick) {
        std::printf("  replay:                           %6.3f s\n", cached);
      } else {
        std::printf("  replay:                           %6.2f s  (target < 1 s: %s)\n", cached,
                    load + cached < 1 ? "met" : "NOT met");
      }
      std::printf("  replay without evaluation cache:  %6.3f s  (baseline, same run; ratio %.1fx)\n",
                  uncached, uncached / cached);
      std::printf("  same decisions either way, possible replay: %s\n",
                  problem.empty() ? "yes" : ("NO: " + problem).c_str());
      if (!quick) {
        std::printf("  FGD study's simulator, ~600 s per run on 2 vCPUs (as reported): ratio %.0fx\n",
                    600 / (load + cached));
      }
      if (!problem.empty()) ++failures;
    }
  }
  if (failures > 0) {
    std::fprintf(stderr, "sim_bench: %d run(s) FAILED the checks: a wrong answer, whatever the times\n",
                 failures);
    return 1;
  }
  if (!quick && load + worst >= 1) {
    std::fprintf(stderr, "sim_bench: target missed: load and replay %.2f s, target < 1 s\n", load + worst);
    return 1;
  }
  return 0;
}
