#include "sim/bound.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/strings.h"
#include "sim/trace.h"
#include "sim/workload.h"

namespace tessera::sim {
namespace {

std::vector<const core::PodRequest*> All(const std::vector<core::PodRequest>& pods) {
  std::vector<const core::PodRequest*> out;
  for (const core::PodRequest& p : pods) out.push_back(&p);
  return out;
}

Bound Solve(const std::string& nodes, const std::string& pods, size_t forced = 0,
            const BoundOptions& options = {}) {
  const core::Cluster cluster = *LoadCluster("sn,cpu_milli,memory_mib,gpu,model\n" + nodes, "nodes");
  const std::vector<core::PodRequest> list =
      *LoadPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + pods, "pods");
  const std::vector<const core::PodRequest*> all = All(list);
  absl::StatusOr<Bound> b =
      LowerBound(cluster, all, std::span<const core::PodRequest* const>(all.data(), forced), options);
  EXPECT_TRUE(b.ok()) << b.status();
  return b.ok() ? *b : Bound{};
}

TEST(LowerBoundTest, SharesPairOnlyWhereTheyFitTogether) {
  // Three 60% shares on two GPUs: no two share a GPU, so 1.2 of 2 GPUs at most.
  Bound b = Solve("a,64000,262144,2,T4\n", "p1,1000,1024,1,600,\np2,1000,1024,1,600,\np3,1000,1024,1,600,\n");
  EXPECT_NEAR(b.max_allocated_milli, 1200, 1e-6);
  EXPECT_NEAR(b.unallocated_pct, 40, 1e-6);
  // 60% and 40% pair: everything fits.
  b = Solve("a,64000,262144,2,T4\n", "p1,1000,1024,1,600,\np2,1000,1024,1,400,\np3,1000,1024,1,1000,\n");
  EXPECT_NEAR(b.unallocated_pct, 0, 1e-6);
  EXPECT_GT(b.patterns, 0);
}

TEST(LowerBoundTest, WholeGpuPodsNeedWhollyFreeGpus) {
  // A 50% share and two whole GPUs on two GPUs: the share takes a GPU a whole pod needed.
  Bound b =
      Solve("a,64000,262144,2,T4\n", "p1,1000,1024,1,500,\np2,1000,1024,1,1000,\np3,1000,1024,1,1000,\n");
  EXPECT_NEAR(b.max_allocated_milli, 2000, 1e-6);  // both whole pods, not the share
}

TEST(LowerBoundTest, HostCpuAndModelsConstrain) {
  // Two whole-GPU pods of 8 cores on a node of 10 cores: 1.25 of them (the relaxation places fractions).
  Bound b = Solve("a,10000,262144,2,T4\n", "p1,8000,1024,1,1000,\np2,8000,1024,1,1000,\n");
  EXPECT_NEAR(b.max_allocated_milli, 1250, 1e-6);
  // A pod too large for any node is never placed, and never forced.
  b = Solve("a,10000,262144,2,T4\n", "p1,12000,1024,1,1000,\np2,1000,1024,1,1000,\n", 1);
  EXPECT_TRUE(b.feasible);
  EXPECT_NEAR(b.max_allocated_milli, 1000, 1e-6);
  // A pod bound to a model the cluster lacks places nowhere.
  b = Solve("a,64000,262144,2,T4\n", "p1,1000,1024,1,1000,V100M32\n");
  EXPECT_NEAR(b.max_allocated_milli, 0, 1e-6);
}

TEST(LowerBoundTest, ForcedPodsRaiseTheFloor) {
  // Forcing the 60% share in (an online scheduler places it on arrival) costs the whole pods a GPU.
  const std::string nodes = "a,64000,262144,2,T4\n";
  const std::string pods = "p1,1000,1024,1,600,\np2,1000,1024,1,1000,\np3,1000,1024,1,1000,\n";
  EXPECT_NEAR(Solve(nodes, pods, 0).max_allocated_milli, 2000, 1e-6);
  EXPECT_NEAR(Solve(nodes, pods, 1).max_allocated_milli, 1600, 1e-6);
  // Forced pods that cannot all be placed: infeasible, reported so.
  Bound b = Solve("a,1000,262144,2,T4\n", "p1,800,1024,1,1000,\np2,800,1024,1,1000,\n", 2);
  EXPECT_FALSE(b.feasible);
}

TEST(LowerBoundTest, GroupedShareSizesStillBoundAndSayHowLoosely) {
  // Shares 600, 410 and 390 on one GPU: only 600 + 390 fit together (exact: 1% left).
  const std::string nodes = "a,64000,262144,1,T4\n";
  const std::string pods = "p1,1000,1024,1,600,\np2,1000,1024,1,410,\np3,1000,1024,1,390,\n";
  const Bound exact = Solve(nodes, pods);
  EXPECT_FALSE(exact.share_sizes_grouped);
  EXPECT_NEAR(exact.unallocated_pct, 1, 1e-6);
  // Grouped {390, 410} and {600}: as 390s, 600 + 410 seem to fit (1.01 of the GPU: none left, clamped); as
  // 410s nothing pairs with 600, and 410 + 390 is the best: 20% left.
  const Bound grouped = Solve(nodes, pods, 0, {.exact_share_sizes = 2, .share_groups = 2});
  EXPECT_TRUE(grouped.share_sizes_grouped);
  EXPECT_NEAR(grouped.unallocated_pct, 0, 1e-6);
  EXPECT_NEAR(grouped.grouping_slack_pct, 20, 1e-6);
}

TEST(LowerBoundTest, GroupedShareSizesEncloseTheExactLpOnRandomWorkloads) {
  // The relaxed LP (shares rounded down) never leaves more than the exact one, and the restricted one
  // (rounded up) never less: the exact bound lies within [bound, bound + slack], forced pods or not.
  std::mt19937 rng(7);
  auto draw = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int trial = 0; trial < 60; ++trial) {
    std::string nodes;
    const char* models[] = {"T4", "A10"};
    for (int n = draw(1, 3); n > 0; --n) {
      nodes += StrCat("n", n, ",", draw(4, 32) * 1000, ",65536,", draw(1, 4), ",", models[draw(0, 1)], "\n");
    }
    std::string pods;
    for (int p = draw(4, 14); p > 0; --p) {
      const int whole = draw(0, 4) == 0;
      pods += StrCat("p", p, ",", draw(1, 8) * 1000, ",1024,", whole ? draw(1, 2) : 1, ",",
                     whole ? 1000 : draw(50, 950), ",", draw(0, 5) == 0 ? models[draw(0, 1)] : "", "\n");
    }
    const size_t forced = static_cast<size_t>(draw(0, 3));
    const Bound exact = Solve(nodes, pods, forced);
    // Three groups, or more than there are sizes (each size its own group: the exact LP again).
    const Bound grouped =
        Solve(nodes, pods, forced, {.exact_share_sizes = 0, .share_groups = trial % 10 == 0 ? 100u : 3u});
    SCOPED_TRACE(StrCat("nodes:\n", nodes, "pods:\n", pods, "forced: ", forced));
    ASSERT_TRUE(grouped.share_sizes_grouped);
    if (!exact.feasible) continue;  // the relaxation may still place the forced pods; nothing to compare
    ASSERT_TRUE(grouped.feasible);  // a relaxation of a feasible LP is feasible
    EXPECT_LE(grouped.unallocated_pct, exact.unallocated_pct + 1e-6);
    if (trial % 10 == 0) {
      EXPECT_NEAR(grouped.unallocated_pct, exact.unallocated_pct, 1e-6);
      EXPECT_NEAR(grouped.grouping_slack_pct, 0, 1e-6);
    }
    if (!std::isnan(grouped.grouping_slack_pct)) {
      EXPECT_GE(grouped.unallocated_pct + grouped.grouping_slack_pct, exact.unallocated_pct - 1e-6);
    }
  }
}

}  // namespace
}  // namespace tessera::sim
