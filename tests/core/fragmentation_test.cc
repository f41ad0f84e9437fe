// FGD's fragmentation measure (Weng et al., ATC '23, section 4) and the profile of typical pods.
#include "core/placement/fragmentation.h"

#include <gtest/gtest.h>

#include "core/random.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;

PodRequest Pod(int64_t cpu, int milli, int gpus, std::vector<std::string> models = {}) {
  PodRequest p;
  p.cpu = MilliCpu(cpu);
  p.model_include = std::move(models);
  if (gpus > 0)
    p.containers.push_back(
        {"main", std::vector<VGpuDemand>(static_cast<size_t>(gpus), {MilliGpu(milli), {}})});
  return p;
}

TEST(WorkloadProfileTest, TypicalPodsByCountUpToCoverage) {
  std::vector<PodRequest> pods;
  for (int i = 0; i < 6; ++i) pods.push_back(Pod(4000, 500, 1));
  for (int i = 0; i < 3; ++i) pods.push_back(Pod(8000, 1000, 1));
  pods.push_back(Pod(1000, 0, 0));  // CPU only, 1 of 10
  WorkloadProfile all = WorkloadProfile::FromPods(pods, 1.0);
  ASSERT_EQ(all.pods.size(), 3u);
  EXPECT_EQ(all.pods[0].share.value(), 500);
  EXPECT_DOUBLE_EQ(all.pods[0].popularity, 0.6);
  EXPECT_DOUBLE_EQ(all.pods[2].popularity, 0.1);
  // 90% is reached with the two GPU shapes; their popularities are renormalized.
  WorkloadProfile most = WorkloadProfile::FromPods(pods, 0.9);
  ASSERT_EQ(most.pods.size(), 2u);
  EXPECT_DOUBLE_EQ(most.pods[0].popularity, 6.0 / 9.0);
}

TEST(WorkloadProfileTest, EqualCountsOrderByLargerShape) {
  std::vector<PodRequest> pods = {Pod(4000, 300, 1), Pod(8000, 300, 1), Pod(8000, 700, 1)};
  WorkloadProfile p = WorkloadProfile::FromPods(pods, 1.0);
  ASSERT_EQ(p.pods.size(), 3u);
  EXPECT_EQ(p.pods[0].cpu.value(), 8000);
  EXPECT_EQ(p.pods[0].share.value(), 700);
  EXPECT_EQ(p.pods[2].cpu.value(), 4000);
}

class FragmentationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeInfo n = MakeNode("n", 4, MiB(16384), "T4");
    n.cpu = MilliCpu(32000);
    ASSERT_TRUE(cluster_.AddNode(n).ok());
    NodeInfo v = MakeNode("v", 2, MiB(32768), "V100");
    v.cpu = MilliCpu(16000);
    ASSERT_TRUE(cluster_.AddNode(v).ok());
  }
  Cluster cluster_;
};

// Worked by hand from the definition: a node with GPUs free 1000, 600, 300, 0 and 32 cores.
TEST_F(FragmentationTest, NodeFragmentByDefinition) {
  WorkloadProfile profile;
  profile.pods = {
      {MilliCpu(4000), MilliGpu(500), 1, {}, 1, 0.5},   // fits: GPUs below 500 (300) are its fragment
      {MilliCpu(4000), MilliGpu(1000), 2, {}, 1, 0.3},  // 2 whole GPUs: only 1 -> all idle
      {MilliCpu(1000), MilliGpu(0), 0, {}, 1, 0.2}};    // no GPU: all idle
  FragmentationModel model(profile, cluster_);
  const std::vector<MilliGpu> free = {MilliGpu(1000), MilliGpu(600), MilliGpu(300), MilliGpu(0)};
  FragmentationModel::NodeView v = model.Prepare(cluster_.ModelId("T4"), MilliCpu(32000), free);
  const double idle = 1900;
  EXPECT_DOUBLE_EQ(model.Fragment(v), 0.5 * 300 + 0.3 * idle + 0.2 * idle);
  // Without the CPU the first typical pod needs, it cannot be placed: all idle.
  FragmentationModel::NodeView poor = model.Prepare(cluster_.ModelId("T4"), MilliCpu(3000), free);
  EXPECT_DOUBLE_EQ(model.Fragment(poor), idle);
}

TEST_F(FragmentationTest, NodesThatDoNotAccountCpuHaveEnoughAndUnhealthyGpusAreLeftOut) {
  Cluster c;
  NodeInfo n = MakeNode("no-cpu", 2, MiB(16384), "T4");  // cpu 0: not accounted
  n.gpus[1].health = GpuHealth::kUnhealthy;
  ASSERT_TRUE(c.AddNode(n).ok());
  WorkloadProfile profile;
  profile.pods = {{MilliCpu(4000), MilliGpu(500), 1, {}, 1, 1.0}};
  FragmentationModel model(profile, c);
  EXPECT_DOUBLE_EQ(model.NodeFragment(*c.FindNode(NodeName("no-cpu"))),
                   0);  // fits; the unhealthy GPU is not idle
}

TEST_F(FragmentationTest, ModelsATypicalPodCannotUseAreAllFragment) {
  WorkloadProfile profile;
  profile.pods = {{MilliCpu(1000), MilliGpu(500), 1, {"V100"}, 1, 1.0}};
  FragmentationModel model(profile, cluster_);
  const std::vector<MilliGpu> free = {MilliGpu(1000), MilliGpu(1000), MilliGpu(200), MilliGpu(1000)};
  EXPECT_DOUBLE_EQ(model.Fragment(model.Prepare(cluster_.ModelId("T4"), MilliCpu(32000), free)), 3200);
  EXPECT_DOUBLE_EQ(model.Fragment(model.Prepare(cluster_.ModelId("V100"), MilliCpu(32000), free)), 200);
}

// FragmentAfter, which updates a prepared view by the changes, agrees with preparing the changed node anew.
TEST_F(FragmentationTest, IncrementalEqualsFromScratch) {
  Rng rng(11);
  std::vector<PodRequest> pods;
  for (int i = 0; i < 200; ++i) {
    const int kind = static_cast<int>(rng.Uniform(4));
    const int64_t cpu = 1000 * (1 + rng.Uniform(12));
    if (kind == 0) pods.push_back(Pod(cpu, 0, 0));
    if (kind == 1) pods.push_back(Pod(cpu, 10 * (1 + static_cast<int>(rng.Uniform(99))), 1));
    if (kind == 2)
      pods.push_back(Pod(cpu, 1000, 1 + static_cast<int>(rng.Uniform(4)),
                         rng.Uniform(3) == 0 ? std::vector<std::string>{"T4"} : std::vector<std::string>{}));
    if (kind == 3) pods.push_back(Pod(cpu, 10 * (1 + static_cast<int>(rng.Uniform(99))), 1, {"V100"}));
  }
  FragmentationModel model(WorkloadProfile::FromPods(pods), cluster_);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<MilliGpu> free(4);
    for (MilliGpu& f : free) f = MilliGpu(rng.Uniform(3) == 0 ? 1000 : static_cast<int>(rng.Uniform(1001)));
    const int model_id = static_cast<int>(rng.Uniform(2));
    const MilliCpu cpu(static_cast<int64_t>(rng.Uniform(40000)));
    FragmentationModel::NodeView v = model.Prepare(model_id, cpu, free);
    // Change up to two GPUs and take some CPU.
    std::vector<std::pair<MilliGpu, MilliGpu>> changes;
    std::vector<MilliGpu> after = free;
    for (int c = 0; c < 2; ++c) {
      const size_t g = rng.Uniform(4);
      const MilliGpu to(static_cast<int>(rng.Uniform(static_cast<uint32_t>(after[g].value()) + 1)));
      changes.push_back({after[g], to});
      after[g] = to;
    }
    const MilliCpu taken(static_cast<int64_t>(rng.Uniform(8000)));
    const double incremental = model.FragmentAfter(v, taken, changes);
    const double scratch = model.Fragment(model.Prepare(model_id, cpu - taken, after));
    ASSERT_NEAR(incremental, scratch, 1e-6) << "trial " << trial;
  }
}

// The node's fragment split over its GPUs: by hand on the definition's example, and adding up to NodeFragment
// on random states of a real node.
TEST_F(FragmentationTest, GpuFragmentsSplitTheNodesFragment) {
  WorkloadProfile profile;
  profile.pods = {
      {MilliCpu(4000), MilliGpu(500), 1, {}, 1, 0.5},   // fits: only GPU 2 (300 free) is lost to it
      {MilliCpu(4000), MilliGpu(1000), 2, {}, 1, 0.3},  // 2 whole GPUs: one only, so every idle GPU is lost
      {MilliCpu(1000), MilliGpu(0), 0, {}, 1, 0.2}};    // no GPU: every idle GPU is lost
  FragmentationModel model(profile, cluster_);
  // Node n: GPUs free 1000, 600, 300, 0.
  auto on = [](int gpu, int milli) {
    return ::tessera::testing::PlacementOn(
        "n", {{gpu, GpuUuid("GPU-n-" + std::to_string(gpu)), MilliGpu(milli), MiB(1024)}});
  };
  PodRequest a = ::tessera::testing::MakePod("a", {::tessera::testing::Milli(400)});
  PodRequest b = ::tessera::testing::MakePod("b", {::tessera::testing::Milli(700)});
  PodRequest c = ::tessera::testing::MakePod("c", {::tessera::testing::Whole()});
  ASSERT_TRUE(cluster_.Commit(a, on(1, 400)).ok());
  ASSERT_TRUE(cluster_.Commit(b, on(2, 700)).ok());
  ASSERT_TRUE(cluster_.Commit(c, on(3, 1000)).ok());
  const NodeState& n = *cluster_.FindNode(NodeName("n"));
  std::vector<double> parts = model.GpuFragments(n);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_DOUBLE_EQ(parts[0], 0.5 * 1000);  // the whole-GPU and no-GPU pods' part of its idle 1000
  EXPECT_DOUBLE_EQ(parts[1], 0.5 * 600);
  EXPECT_DOUBLE_EQ(parts[2], 1.0 * 300);  // lost to all three
  EXPECT_DOUBLE_EQ(parts[3], 0);
  EXPECT_DOUBLE_EQ(parts[0] + parts[1] + parts[2] + parts[3], model.NodeFragment(n));

  // Random workloads and states: the parts always add up to the node's fragment.
  Rng rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<PodRequest> pods;
    for (int i = 0; i < 30; ++i) {
      const int64_t cpu = 1000 * (1 + static_cast<int64_t>(rng.Uniform(12)));
      const int kind = static_cast<int>(rng.Uniform(3));
      if (kind == 0) pods.push_back(Pod(cpu, 0, 0));
      if (kind == 1) pods.push_back(Pod(cpu, 10 * (1 + static_cast<int>(rng.Uniform(99))), 1));
      if (kind == 2) pods.push_back(Pod(cpu, 1000, 1 + static_cast<int>(rng.Uniform(3))));
    }
    Cluster fresh;
    NodeInfo info = ::tessera::testing::MakeNode("r", 4, MiB(16384), "T4");
    info.cpu = MilliCpu(32000);
    ASSERT_TRUE(fresh.AddNode(info).ok());
    for (int g = 0; g < 4; ++g) {
      const int milli = static_cast<int>(rng.Uniform(1001));
      if (milli == 0) continue;
      PodRequest p = ::tessera::testing::MakePod("p" + std::to_string(g), {::tessera::testing::Milli(milli)});
      ASSERT_TRUE(
          fresh
              .Commit(p, ::tessera::testing::PlacementOn(
                             "r", {{g, GpuUuid("GPU-r-" + std::to_string(g)), MilliGpu(milli), MiB(1)}}))
              .ok());
    }
    FragmentationModel random_model(WorkloadProfile::FromPods(pods), fresh);
    const NodeState& r = *fresh.FindNode(NodeName("r"));
    double sum = 0;
    for (double part : random_model.GpuFragments(r)) sum += part;
    ASSERT_NEAR(sum, random_model.NodeFragment(r), 1e-6) << "trial " << trial;
  }
}

}  // namespace
}  // namespace tessera::core
