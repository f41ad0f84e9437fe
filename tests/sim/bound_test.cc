#include "sim/bound.h"

#include <gtest/gtest.h>

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

Bound Solve(const std::string& nodes, const std::string& pods, size_t forced = 0) {
  const core::Cluster cluster = *LoadCluster("sn,cpu_milli,memory_mib,gpu,model\n" + nodes, "nodes");
  const std::vector<core::PodRequest> list =
      *LoadPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n" + pods, "pods");
  const std::vector<const core::PodRequest*> all = All(list);
  absl::StatusOr<Bound> b =
      LowerBound(cluster, all, std::span<const core::PodRequest* const>(all.data(), forced));
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

}  // namespace
}  // namespace tessera::sim
