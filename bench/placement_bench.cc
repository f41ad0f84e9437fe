// Placement speed: one pod's filter and score over a large cluster, and each Gaia tree operation.
//
//   build/bin/placement_bench                 # the default: 5,000 nodes x 8 GPUs, half full
//   build/bin/placement_bench --nodes=1000    # another size
//   build/bin/placement_bench --quick         # CI: 200 nodes, 10 ms per benchmark, the checks below
//
// Targets (issue "Foundation and placement core"): one pod's filter and score over 5,000 nodes x 8 GPUs, half
// full, under 2 ms on one core (the full run exits 1 when missed); each tree operation in microseconds.
//
// Checks, in every mode (exit 1 on a wrong answer; quick mode judges no time): the baseline and the Placer
// agree on which nodes fit the timed pod; every policy's placement of the timed pods lands on GPUs with room;
// the evaluation cache changes no decision over a sequence of pods; Gaia's Link finds a subset as near as the
// exhaustive search's, and Fragment the best-fitting GPU.
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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/cost_tree.h"
#include "core/placement/evaluation_cache.h"
#include "core/placement/placer.h"
#include "core/strings.h"
#include "core/topology.h"

namespace tessera::bench {
namespace {

using namespace tessera::core;  // NOLINT: a benchmark of the core

int g_nodes = 5000;
constexpr int kGpusPerNode = 8;
constexpr int64_t kGpuMiB = 81920;
// The timed share request: 30% of a GPU and 8 GiB.
constexpr int kShareCores = 300;
constexpr int64_t kShareMiB = 8192;

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

PodRequest ShareRequest(int cores = kShareCores, int64_t memory = kShareMiB) {
  PodRequest r;
  r.uid = PodUid("bench");
  r.name = "bench";
  VGpuDemand d;
  d.cores = MilliGpu(cores);
  d.memory = {MemorySpec::Kind::kMiB, memory};
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

// The baseline's filter for one node: rebuild its per-device use from its pods, then look for a GPU with
// room.
bool NaiveFits(const NaiveNode& node, int need_cores, int64_t need_mem, int64_t* used_cores) {
  std::map<std::string, std::pair<int, int64_t>> use;
  for (const std::string& u : node.uuids) use[u] = {0, 0};
  for (const NaivePod& p : node.pods) {
    auto& d = use[p.uuid];
    d.first += p.cores;
    d.second += p.memory;
  }
  bool fits = false;
  *used_cores = 0;
  for (const auto& [uuid, d] : use) {
    *used_cores += d.first;
    if (1000 - d.first >= need_cores && kGpuMiB - d.second >= need_mem) fits = true;
  }
  return fits;
}

// The baseline: per call, rebuild each node's per-device use from its pods, then filter and binpack-score.
void NaiveBench(benchmark::State& state) {
  World& w = TheWorld();
  for (auto _ : state) {
    const NaiveNode* best = nullptr;
    double best_score = -1;
    for (const NaiveNode& node : w.naive) {
      int64_t used_cores = 0;
      if (!NaiveFits(node, kShareCores, kShareMiB, &used_cores)) continue;
      const double score = static_cast<double>(used_cores + kShareCores) / (1000.0 * kGpusPerNode);
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
// Baseline: every m-subset of the wholly free GPUs, the one whose farthest pair is nearest. Returns its cost
// (that of its farthest pair) and the subset.
std::pair<int, uint32_t> ExhaustiveBest(const LinkMatrix& links, const std::vector<MilliGpu>& free, int m) {
  int best_cost = 1 << 30;
  uint32_t best = 0;
  for (uint32_t s = 0; s < (1u << 8); ++s) {
    if (std::popcount(s) != m) continue;
    bool ok = true;
    int worst = 0;
    for (int a = 0; a < 8 && ok; ++a) {
      if (!(s >> a & 1U)) continue;
      if (free[static_cast<size_t>(a)] < kWholeGpu) ok = false;
      for (int b = a + 1; b < 8 && ok; ++b) {
        if (s >> b & 1U) worst = std::max(worst, links.at(a, b).Cost());
      }
    }
    if (ok && worst < best_cost) {
      best_cost = worst;
      best = s;
    }
  }
  return {best_cost, best};
}
void ExhaustiveLink(benchmark::State& state) {
  const int m = static_cast<int>(state.range(0));
  const LinkMatrix links = EightGpuTopology();
  for (auto _ : state) benchmark::DoNotOptimize(ExhaustiveBest(links, Tree().free, m));
}

// --- Checks: the answers of the timed code -------------------------------------------------------------

class Checks {
 public:
  void Expect(bool ok, const std::string& what) {
    std::printf("  %-6s %s\n", ok ? "ok" : "FAILED", what.c_str());
    if (!ok) ++failures_;
  }
  int failures() const { return failures_; }

 private:
  int failures_ = 0;
};

// The baseline and the Placer answer the same question: the nodes that can take a share. For the timed share
// (30% + 8 GiB) and for larger ones, which only some nodes can take.
void CheckFilterAgrees(Checks& checks) {
  World& w = TheWorld();
  std::unique_ptr<Policy> policy = *MakePolicy("binpack");
  Placer placer(*policy);
  Rng rng(1);
  const std::pair<int, int64_t> demands[] = {
      {kShareCores, kShareMiB}, {750, 8192}, {400, 65536}, {950, 40960}};
  int disagree = 0;
  bool discriminates = false;
  std::string counts;
  for (const auto& [cores, memory] : demands) {
    const PodRequest share = ShareRequest(cores, memory);
    int fits = 0;
    for (size_t i = 0; i < w.naive.size(); ++i) {
      int64_t used = 0;
      const bool naive = NaiveFits(w.naive[i], cores, memory, &used);
      const bool placer_fits = placer.Evaluate(w.cluster, w.cluster.nodes()[i], share, rng).fits();
      if (naive != placer_fits) ++disagree;
      if (placer_fits) ++fits;
    }
    if (fits > 0 && fits < static_cast<int>(w.naive.size())) discriminates = true;
    counts += StrCat(counts.empty() ? "" : ", ", cores / 10, "% + ", memory, " MiB: ", fits);
  }
  checks.Expect(disagree == 0 && discriminates,
                StrCat("baseline and Placer agree on which of ", w.naive.size(), " nodes fit (", counts,
                       "); ", disagree, " disagree", discriminates ? "" : "; no demand tells nodes apart"));
}

// Each timed placement lands on GPUs that have the room it takes, with what was asked.
void CheckPlacements(Checks& checks, const PolicyContext& context) {
  World& w = TheWorld();
  const struct {
    const char* policy;
    PodRequest request;
  } cases[] = {{"binpack", ShareRequest()}, {"gaia", ShareRequest()},  {"tessera", ShareRequest()},
               {"fgd", ShareRequest()},     {"gaia", WholeRequest(2)}, {"gaia", WholeRequest(4)}};
  for (const auto& c : cases) {
    std::unique_ptr<Policy> policy = *MakePolicy(c.policy, context);
    Placer placer(*policy);
    Rng rng(1);
    absl::StatusOr<Placement> p = placer.Place(w.cluster, c.request, rng);
    const size_t want = c.request.containers[0].vgpus.size();
    const bool whole = c.request.containers[0].vgpus[0].cores == kWholeGpu;
    std::string problem;
    if (!p.ok()) {
      problem = std::string(p.status().message());
    } else if (p->containers.size() != 1 || p->containers[0].vgpus.size() != want) {
      problem = "wrong number of GPUs";
    } else if (const NodeState* node = w.cluster.FindNode(p->node); node == nullptr) {
      problem = "unknown node";
    } else {
      GpuMask seen;
      for (const VGpuAssignment& v : p->containers[0].vgpus) {
        const bool right =
            whole ? v.cores == kWholeGpu : v.cores == MilliGpu(kShareCores) && v.memory == MiB(kShareMiB);
        if (v.gpu_index < 0 || v.gpu_index >= node->gpu_count() || seen.Has(v.gpu_index)) {
          problem = StrCat("GPU ", v.gpu_index, " is not a distinct GPU of the node");
        } else if (!right) {
          problem = StrCat("GPU ", v.gpu_index, " holds ", v.cores.value(), " and ", v.memory.value(),
                           " MiB, not what was asked");
        } else if (node->free_cores(v.gpu_index) < v.cores || node->free_memory(v.gpu_index) < v.memory) {
          problem = StrCat("GPU ", v.gpu_index, " has ", node->free_cores(v.gpu_index).value(), " and ",
                           node->free_memory(v.gpu_index).value(), " MiB free, less than it was given");
        }
        if (v.gpu_index >= 0 && v.gpu_index < node->gpu_count()) seen.Add(v.gpu_index);
      }
    }
    checks.Expect(problem.empty(), StrCat(c.policy, " places ", c.request.containers[0].vgpus.size(),
                                          whole ? " whole GPU(s)" : " share", " on GPUs with room",
                                          problem.empty() ? "" : ": " + problem));
  }
}

// The evaluation cache changes no decision: the same pods placed one after another, with and without it.
void CheckCacheChangesNothing(Checks& checks, const PolicyContext& context, int pods) {
  World& w = TheWorld();
  std::vector<PodRequest> workload = Workload();
  workload.resize(std::min(workload.size(), static_cast<size_t>(pods)));
  std::vector<uint32_t> rank(static_cast<size_t>(w.cluster.node_count()));
  for (size_t i = 0; i < rank.size(); ++i) rank[i] = static_cast<uint32_t>((i * 7919) % rank.size());
  // The policies the cache serves: the deterministic ones (binpack and gaia break ties at random, unkept).
  for (const char* name : {"tessera", "fgd", "bestfit", "dotprod"}) {
    Cluster with = w.cluster;
    Cluster without = w.cluster;
    std::unique_ptr<Policy> a = *MakePolicy(name, context);
    std::unique_ptr<Policy> b = *MakePolicy(name, context);
    Placer pa(*a);
    Placer pb(*b);
    EvaluationCache cache;
    Rng ra(3);
    Rng rb(3);
    int placed = 0;
    std::string problem = a->deterministic() ? "" : ": not deterministic, so never cached";
    for (const PodRequest& pod : workload) {
      if (!problem.empty()) break;
      absl::StatusOr<Placement> x = pa.Place(with, pod, ra, {}, rank, &cache);
      absl::StatusOr<Placement> y = pb.Place(without, pod, rb, {}, rank);
      if (x.ok() != y.ok() || (x.ok() && *x != *y)) {
        problem = StrCat(": pod ", pod.uid.value(), " goes to ", x.ok() ? x->node.value() : "nowhere",
                         " with the cache and to ", y.ok() ? y->node.value() : "nowhere", " without");
        break;
      }
      if (!x.ok()) continue;
      if (!with.Commit(pod, *x).ok() || !without.Commit(pod, *y).ok()) {
        problem = StrCat(": the placement of ", pod.uid.value(), " cannot be committed");
        break;
      }
      ++placed;
    }
    checks.Expect(problem.empty() && placed > 0,
                  StrCat(name, ": the evaluation cache changes none of ", workload.size(), " decisions (",
                         placed, " placed)", problem));
  }
}

// Gaia's tree operations against what they promise (the paper's algorithms 2 and 4).
void CheckTree(Checks& checks) {
  const TreeWorld& t = Tree();
  const LinkMatrix links = EightGpuTopology();
  for (int m : {2, 4}) {
    Rng rng(1);
    std::optional<GpuMask> got = t.tree.ScheduleLink(t.free, GpuMask::All(8), m, rng);
    const int best_cost = ExhaustiveBest(links, t.free, m).first;
    bool whole = got.has_value() && got->Count() == m;
    for (int g = 0; whole && g < 8; ++g) {
      if (got->Has(g) && t.free[static_cast<size_t>(g)] != kWholeGpu) whole = false;
    }
    const int cost = got.has_value() ? t.tree.CostOf(*got) : -1;
    checks.Expect(whole && cost == best_cost,
                  StrCat("Gaia Link of ", m, " GPUs: ", m, " wholly free GPUs at link cost ", cost,
                         "; exhaustive best ", best_cost));
  }
  // Fragment: the fragment GPU (partly used) with the least free share that still holds 30%.
  int want = -1;
  for (int g = 0; g < 8; ++g) {
    const MilliGpu f = t.free[static_cast<size_t>(g)];
    if (f >= MilliGpu(kShareCores) && f < kWholeGpu && (want < 0 || f < t.free[static_cast<size_t>(want)])) {
      want = g;
    }
  }
  Rng rng(1);
  const std::optional<int> got = t.tree.ScheduleFragment(t.free, GpuMask::All(8), MilliGpu(kShareCores), rng);
  checks.Expect(got.has_value() && *got == want,
                StrCat("Gaia Fragment of 30%: GPU ", got.value_or(-1), "; best fit GPU ", want));
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
  bool quick = false;
  bool nodes_given = false;
  bool min_time_given = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
      continue;
    }
    if (std::strncmp(argv[i], "--nodes=", 8) == 0) {
      g_nodes = std::max(1, std::atoi(argv[i] + 8));
      nodes_given = true;
    }
    if (std::strncmp(argv[i], "--benchmark_min_time", 20) == 0) min_time_given = true;
    if (std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "placement_bench: time one pod's filter and score over a cluster, and each Gaia tree operation,\n"
          "each next to a baseline measured in the same run.\n"
          "  --nodes=N     cluster size (default 5000 nodes of 8 GPUs, half full)\n"
          "  --quick       CI mode: 200 nodes (unless --nodes), 10 ms per benchmark; times are printed,\n"
          "                never judged\n"
          "  any Google Benchmark flag, e.g. --benchmark_filter=Place --benchmark_min_time=2\n"
          "Every run checks the answers (exit 1 on a wrong one): the baseline and the Placer find the same\n"
          "nodes fit a share (four sizes); each policy's placement of the timed pods is on GPUs with room;\n"
          "the evaluation cache changes no decision over 200 pods (tessera, fgd, bestfit, dotprod); Gaia's\n"
          "Link is as near as an exhaustive search, Fragment picks the best-fitting GPU.\n"
          "The full run (not --quick) also exits 1 when its target is missed: filter+score of one pod\n"
          "under 2 ms.\n");
      return 0;
    }
    args.push_back(argv[i]);
  }
  static char quick_min_time[] = "--benchmark_min_time=0.01";
  if (quick && !nodes_given) g_nodes = 200;
  if (quick && !min_time_given) args.push_back(quick_min_time);
  int args_count = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&args_count, args.data());
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

  std::printf("\nChecks:\n");
  Checks checks;
  const tessera::core::PolicyContext context =
      tessera::core::MakePolicyContext(TheWorld().cluster, Workload());
  CheckFilterAgrees(checks);
  CheckPlacements(checks, context);
  CheckCacheChangesNothing(checks, context, 200);
  CheckTree(checks);
  int status = 0;
  if (checks.failures() > 0) {
    std::fprintf(stderr, "placement_bench: %d check(s) FAILED: a wrong answer, whatever the times\n",
                 checks.failures());
    status = 1;
  }
  if (quick) {
    std::printf("quick mode: times printed, not judged against the target\n");
  } else if (place > 0 && place >= 2e6) {
    std::fprintf(stderr, "placement_bench: target missed: filter+score %.3f ms, target < 2 ms\n",
                 place / 1e6);
    status = 1;
  }
  return status;
}
