// Placement speed: one pod's filter and score over a large cluster, and each Gaia tree operation.
//
//   build/bin/placement_bench                 # the default: 5,000 nodes x 8 GPUs, half full
//   build/bin/placement_bench --nodes=1000    # another size
//
// Targets (issue "Foundation and placement core"): one pod's filter and score over 5,000 nodes x 8 GPUs, half
// full, under 2 ms on one core; each tree operation in microseconds.
//
// Baselines, measured in the same run:
//   - filter and score: the way HAMi's and gpushare's extenders do it, recomputing every node's per-GPU use
//     from the pods on it at each call (given already decoded, which flatters it) and keying devices by UUID
//     string in a map;
//   - tree operations: exhaustive search of the best m-GPU subset by its farthest link, which is what the
//   tree
//     spares.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/cost_tree.h"
#include "core/placement/placer.h"
#include "core/strings.h"
#include "core/topology.h"

namespace tessera::bench {
namespace {

using namespace tessera::core;  // NOLINT: a benchmark of the core

int g_nodes = 5000;
constexpr int kGpusPerNode = 8;
constexpr int64_t kGpuMiB = 81920;

// The two-socket 8-GPU box of tests/testdata/topo/two-socket-8gpu.txt: PIX pairs, PHB quads, SYS across.
LinkMatrix EightGpuTopology() {
  LinkMatrix m(8);
  for (int a = 0; a < 8; ++a) {
    for (int b = a + 1; b < 8; ++b) {
      LinkKind k = (a / 4 != b / 4) ? LinkKind::kSys : (a / 2 != b / 2) ? LinkKind::kPhb : LinkKind::kPix;
      m.Set(a, b, Link::Of(k));
    }
  }
  return m;
}

// What a baseline extender keeps: the decoded pods of each node, devices named by UUID.
struct NaivePod {
  std::string uuid;
  int cores;
  int64_t memory;
};
struct NaiveNode {
  std::string name;
  std::vector<std::string> uuids;
  std::vector<NaivePod> pods;
};

struct World {
  Cluster cluster;
  std::vector<NaiveNode> naive;
  double utilization = 0;
};

World& TheWorld() {
  static World* world = [] {
    auto* w = new World;
    Rng rng(2026);
    int64_t used = 0;
    int pod = 0;
    for (int n = 0; n < g_nodes; ++n) {
      NodeInfo info;
      info.name = NodeName(StrCat("node-", n));
      NaiveNode naive;
      naive.name = info.name.value();
      for (int g = 0; g < kGpusPerNode; ++g) {
        info.gpus.push_back({GpuUuid(StrCat("GPU-", n, "-", g)), g, "A100-SXM4-80GB", MiB(kGpuMiB), g / 4});
        naive.uuids.push_back(info.gpus.back().uuid.value());
      }
      info.links = EightGpuTopology();
      (void)w->cluster.AddNode(info);
      // Half full: 30% of GPUs held whole, 40% shared by 1-3 tenants, 30% free.
      for (int g = 0; g < kGpusPerNode; ++g) {
        const uint32_t kind = rng.Uniform(10);
        std::vector<int> shares;
        if (kind < 3) {
          shares.push_back(1000);
        } else if (kind < 7) {
          int left = 200 + static_cast<int>(rng.Uniform(700));
          const int tenants = 1 + static_cast<int>(rng.Uniform(3));
          for (int t = 0; t < tenants && left > 0; ++t) {
            int s = t + 1 == tenants ? left : std::max(10, left / 2);
            shares.push_back(s);
            left -= s;
          }
        }
        for (int s : shares) {
          PodRequest r;
          r.uid = PodUid(StrCat("p", pod++));
          const MiB mem = s == 1000 ? MiB(kGpuMiB) : ProportionalMemory(MilliGpu(s), MiB(kGpuMiB));
          Placement p;
          p.node = info.name;
          p.containers.push_back(
              {"main", {{g, info.gpus[static_cast<size_t>(g)].uuid, MilliGpu(s), mem}}, -1, ""});
          (void)w->cluster.Commit(r, p);
          naive.pods.push_back({info.gpus[static_cast<size_t>(g)].uuid.value(), s, mem.value()});
          used += s;
        }
      }
      w->naive.push_back(std::move(naive));
    }
    w->utilization = static_cast<double>(used) / (1000.0 * g_nodes * kGpusPerNode);
    return w;
  }();
  return *world;
}

PodRequest ShareRequest() {
  PodRequest r;
  r.uid = PodUid("bench");
  r.name = "bench";
  VGpuDemand d;
  d.cores = MilliGpu(300);
  d.memory = {MemorySpec::Kind::kMiB, 8192};
  r.containers.push_back({"main", {d}});
  return r;
}

PodRequest WholeRequest(int n) {
  PodRequest r;
  r.uid = PodUid("bench");
  r.name = "bench";
  r.containers.push_back(
      {"main", std::vector<VGpuDemand>(static_cast<size_t>(n), VGpuDemand{kWholeGpu, {}})});
  return r;
}

// A workload for the policies that weigh fragmentation: the share sizes and shapes of a GPU cluster's trace.
std::vector<PodRequest> Workload() {
  std::vector<PodRequest> pods;
  Rng rng(7);
  const int shares[] = {810, 470, 650, 320, 460, 230, 1000, 1000, 1000, 1000};
  for (int i = 0; i < 2000; ++i) {
    PodRequest p;
    p.uid = PodUid(StrCat("w", i));
    p.cpu = MilliCpu(2000 * (1 + static_cast<int64_t>(rng.Uniform(8))));
    p.memory = MiB(8192 * (1 + static_cast<int64_t>(rng.Uniform(8))));
    if (rng.Uniform(8) != 0) p.containers.push_back({"main", {{MilliGpu(shares[rng.Uniform(10)]), {}}}});
    pods.push_back(std::move(p));
  }
  return pods;
}

void PlaceBench(benchmark::State& state, const std::string& policy_name, const PodRequest& request) {
  World& w = TheWorld();
  static const PolicyContext context = MakePolicyContext(w.cluster, Workload());
  std::unique_ptr<Policy> policy = *MakePolicy(policy_name, context);
  Placer placer(*policy);
  Rng rng(1);
  for (auto _ : state) {
    absl::StatusOr<Placement> p = placer.Place(w.cluster, request, rng);
    benchmark::DoNotOptimize(p);
  }
  state.counters["nodes"] = static_cast<double>(w.cluster.node_count());
}

// The baseline: per call, rebuild each node's per-device use from its pods, then filter and binpack-score.
void NaiveBench(benchmark::State& state) {
  World& w = TheWorld();
  const int need_cores = 300;
  const int64_t need_mem = 8192;
  for (auto _ : state) {
    const NaiveNode* best = nullptr;
    double best_score = -1;
    for (const NaiveNode& node : w.naive) {
      std::map<std::string, std::pair<int, int64_t>> use;
      for (const std::string& u : node.uuids) use[u] = {0, 0};
      for (const NaivePod& p : node.pods) {
        auto& d = use[p.uuid];
        d.first += p.cores;
        d.second += p.memory;
      }
      bool fits = false;
      int64_t used_cores = 0;
      for (const auto& [uuid, d] : use) {
        used_cores += d.first;
        if (1000 - d.first >= need_cores && kGpuMiB - d.second >= need_mem) fits = true;
      }
      if (!fits) continue;
      const double score = static_cast<double>(used_cores + need_cores) / (1000.0 * kGpusPerNode);
      if (score > best_score) {
        best_score = score;
        best = &node;
      }
    }
    benchmark::DoNotOptimize(best);
  }
}

// --- Gaia tree operations ---------------------------------------------------------------------------------

struct TreeWorld {
  AccessCostTree tree = *AccessCostTree::Build(EightGpuTopology());
  std::vector<MilliGpu> free = {MilliGpu(0),    kWholeGpu, MilliGpu(400), kWholeGpu,
                                MilliGpu(1000), kWholeGpu, MilliGpu(700), kWholeGpu};
};

TreeWorld& Tree() {
  static TreeWorld t;
  return t;
}

void TreeBuild(benchmark::State& state) {
  const LinkMatrix m = EightGpuTopology();
  for (auto _ : state) benchmark::DoNotOptimize(AccessCostTree::Build(m));
}
void TreeFragment(benchmark::State& state) {
  Rng rng(1);
  for (auto _ : state) {
    benchmark::DoNotOptimize(Tree().tree.ScheduleFragment(Tree().free, GpuMask::All(8), MilliGpu(300), rng));
  }
}
void TreeSingular(benchmark::State& state) {
  Rng rng(1);
  for (auto _ : state)
    benchmark::DoNotOptimize(Tree().tree.ScheduleSingular(Tree().free, GpuMask::All(8), rng));
}
void TreeLink(benchmark::State& state) {
  Rng rng(1);
  const int m = static_cast<int>(state.range(0));
  for (auto _ : state)
    benchmark::DoNotOptimize(Tree().tree.ScheduleLink(Tree().free, GpuMask::All(8), m, rng));
}
// Baseline: every m-subset of the free GPUs, the one whose farthest pair is nearest.
void ExhaustiveLink(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const LinkMatrix links = EightGpuTopology();
  for (auto _ : state) {
    int best_cost = 1 << 30;
    uint32_t best = 0;
    for (uint32_t s = 0; s < (1u << 8); ++s) {
      if (std::popcount(s) != m) continue;
      bool ok = true;
      int worst = 0;
      for (int a = 0; a < 8 && ok; ++a) {
        if (!(s >> a & 1U)) continue;
        if (Tree().free[static_cast<size_t>(a)] < kWholeGpu) ok = false;
        for (int b = a + 1; b < 8 && ok; ++b) {
          if (s >> b & 1U) worst = std::max(worst, links.at(a, b).Cost());
        }
      }
      if (ok && worst < best_cost) {
        best_cost = worst;
        best = s;
      }
    }
    benchmark::DoNotOptimize(best);
  }
}

// Collects each benchmark's mean real time (ns per iteration) while printing the usual table.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs) {
      if (r.run_type == Run::RT_Iteration && r.iterations > 0) {
        ns_[r.benchmark_name()] = r.GetAdjustedRealTime() * ToNs(r.time_unit);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  double ns(const std::string& name) const {
    auto it = ns_.find(name);
    return it == ns_.end() ? 0 : it->second;
  }

 private:
  static double ToNs(benchmark::TimeUnit u) {
    switch (u) {
      case benchmark::kNanosecond:
        return 1;
      case benchmark::kMicrosecond:
        return 1e3;
      case benchmark::kMillisecond:
        return 1e6;
      case benchmark::kSecond:
        return 1e9;
    }
    return 1;
  }
  std::map<std::string, double> ns_;
};

}  // namespace
}  // namespace tessera::bench

int main(int argc, char** argv) {
  using namespace tessera::bench;  // NOLINT
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--nodes=", 8) == 0) g_nodes = std::max(1, std::atoi(argv[i] + 8));
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "placement_bench: time one pod's filter and score over a cluster, and each Gaia tree operation,\n"
          "each next to a baseline measured in the same run.\n"
          "  --nodes=N     cluster size (default 5000 nodes of 8 GPUs, half full)\n"
          "  any Google Benchmark flag, e.g. --benchmark_filter=Place --benchmark_min_time=2\n");
      return 0;
    }
  }
  benchmark::Initialize(&argc, argv);
  std::printf("Building a cluster of %d nodes x %d GPUs...\n", g_nodes, kGpusPerNode);
  const double utilization = TheWorld().utilization;
  std::printf("%d nodes, %d GPUs, %.0f%% of GPU compute in use\n\n", g_nodes, g_nodes * kGpusPerNode,
              100 * utilization);

  const tessera::core::PodRequest share = ShareRequest();
  const tessera::core::PodRequest two = WholeRequest(2);
  const tessera::core::PodRequest four = WholeRequest(4);
  benchmark::RegisterBenchmark("Place/binpack/share-30pct-8GiB", PlaceBench, std::string("binpack"), share)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Place/gaia/share-30pct-8GiB", PlaceBench, std::string("gaia"), share)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Place/tessera/share-30pct-8GiB", PlaceBench, std::string("tessera"), share)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Place/fgd/share-30pct-8GiB", PlaceBench, std::string("fgd"), share)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Place/gaia/whole-2", PlaceBench, std::string("gaia"), two)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Place/gaia/whole-4", PlaceBench, std::string("gaia"), four)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Baseline/recompute-per-call/share-30pct-8GiB", NaiveBench)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("Tree/build-8", TreeBuild);
  benchmark::RegisterBenchmark("Tree/fragment", TreeFragment);
  benchmark::RegisterBenchmark("Tree/singular", TreeSingular);
  benchmark::RegisterBenchmark("Tree/link", TreeLink)->Arg(2)->Arg(4);
  benchmark::RegisterBenchmark("Baseline/exhaustive-subsets", ExhaustiveLink)->Arg(2)->Arg(4);

  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);

  const double place = collector.ns("Place/binpack/share-30pct-8GiB");
  const double naive = collector.ns("Baseline/recompute-per-call/share-30pct-8GiB");
  std::printf("\nSummary (%d nodes x %d GPUs, %.0f%% in use, one core):\n", g_nodes, kGpusPerNode,
              100 * utilization);
  if (place > 0) {
    std::printf("  filter+score one pod (binpack, 30%% + 8 GiB): %.3f ms; target < 2 ms: %s\n", place / 1e6,
                place < 2e6 ? "met" : "NOT met");
    if (naive > 0)
      std::printf("  baseline (recompute per call): %.3f ms; ratio baseline/tessera = %.1fx\n", naive / 1e6,
                  naive / place);
  }
  for (const char* name : {"Place/gaia/share-30pct-8GiB", "Place/gaia/whole-2", "Place/gaia/whole-4",
                           "Place/tessera/share-30pct-8GiB", "Place/fgd/share-30pct-8GiB"}) {
    if (collector.ns(name) > 0) std::printf("  %-40s %.3f ms\n", name, collector.ns(name) / 1e6);
  }
  const double tessera = collector.ns("Place/tessera/share-30pct-8GiB");
  const double fgd = collector.ns("Place/fgd/share-30pct-8GiB");
  if (tessera > 0 && fgd > 0) {
    std::printf(
        "  tessera policy against FGD, the measure it extends (uncached): ratio tessera/fgd = %.2fx\n",
        tessera / fgd);
  }
  for (const char* m : {"2", "4"}) {
    const double tree = collector.ns(std::string("Tree/link/") + m);
    const double exhaustive = collector.ns(std::string("Baseline/exhaustive-subsets/") + m);
    if (tree > 0 && exhaustive > 0) {
      std::printf("  Gaia Link of %s GPUs: %.2f us; exhaustive subsets: %.2f us; ratio = %.1fx\n", m,
                  tree / 1e3, exhaustive / 1e3, exhaustive / tree);
    }
  }
  for (const char* op : {"Tree/build-8", "Tree/fragment", "Tree/singular"}) {
    if (collector.ns(op) > 0) std::printf("  %-40s %.2f us\n", op, collector.ns(op) / 1e3);
  }
  benchmark::Shutdown();
  return 0;
}
