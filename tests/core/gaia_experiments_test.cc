// The Gaia Scheduler paper's Experiments 1-4 (Song et al., section IV, Tables I-IV), 500 repetitions each.
//
// The paper's figure of the 4-GPU tree is not in the text; its tables fit this tree: gpu0-gpu1 joined at a
// higher access cost (PHB) than gpu2-gpu3 (PIX), the two pairs joined at SOC (SYS).
#include <gtest/gtest.h>

#include <map>

#include "core/cluster.h"
#include "core/cost_tree.h"
#include "core/placement/placer.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Milli;
using ::tessera::testing::Whole;

constexpr int kRepetitions = 500;  // as in the paper

LinkMatrix PaperTopology() {
  absl::StatusOr<LinkMatrix> m = LinkMatrix::FromRows({{"X", "PHB", "SOC", "SOC"},
                                                       {"PHB", "X", "SOC", "SOC"},
                                                       {"SOC", "SOC", "X", "PIX"},
                                                       {"SOC", "SOC", "PIX", "X"}});
  EXPECT_TRUE(m.ok());
  return *m;
}

AccessCostTree PaperTree() {
  return *AccessCostTree::Build(PaperTopology());
}

std::vector<MilliGpu> Free(int g0, int g1, int g2, int g3) {
  return {MilliGpu(g0), MilliGpu(g1), MilliGpu(g2), MilliGpu(g3)};
}

// Table I: 1 GPU goes to gpu2 or gpu3 (227 / 273 in the paper), 2 GPUs always to gpu2 & gpu3.
TEST(GaiaExperimentsTest, Table1SimpleScheduling) {
  AccessCostTree tree = PaperTree();
  Rng rng(20190101);
  std::map<int, int> one;
  int pair23 = 0;
  for (int i = 0; i < kRepetitions; ++i) {
    std::optional<GpuMask> g = tree.Schedule(Free(1000, 1000, 1000, 1000), GpuMask::All(4), kWholeGpu, rng);
    ASSERT_TRUE(g.has_value());
    ++one[*g->begin()];
    std::optional<GpuMask> two =
        tree.Schedule(Free(1000, 1000, 1000, 1000), GpuMask::All(4), MilliGpu(2000), rng);
    ASSERT_TRUE(two.has_value());
    if (two->bits() == 0b1100) ++pair23;
  }
  EXPECT_EQ(one[0] + one[1], 0);
  EXPECT_GT(one[2], 0);
  EXPECT_GT(one[3], 0);
  EXPECT_GE(one[2], kRepetitions * 40 / 100);
  EXPECT_LE(one[2], kRepetitions * 60 / 100);
  EXPECT_GE(one[3], kRepetitions * 40 / 100);
  EXPECT_LE(one[3], kRepetitions * 60 / 100);
  EXPECT_EQ(pair23, kRepetitions);
}

// Table II: with 0.5 of gpu2 assigned, 0.4 then 0.1 of a GPU land on gpu2, every time.
TEST(GaiaExperimentsTest, Table2FragmentScheduling) {
  AccessCostTree tree = PaperTree();
  Rng rng(2);
  for (int i = 0; i < kRepetitions; ++i) {
    std::vector<MilliGpu> free = Free(1000, 1000, 500, 1000);
    std::optional<int> c2 = tree.ScheduleFragment(free, GpuMask::All(4), MilliGpu(400), rng);
    ASSERT_EQ(c2, 2);
    free[2] -= MilliGpu(400);
    std::optional<int> c3 = tree.ScheduleFragment(free, GpuMask::All(4), MilliGpu(100), rng);
    ASSERT_EQ(c3, 2);
  }
}

// Table III: with gpu2 taken, 1 GPU is gpu3, every time.
TEST(GaiaExperimentsTest, Table3SingularScheduling) {
  AccessCostTree tree = PaperTree();
  Rng rng(3);
  for (int i = 0; i < kRepetitions; ++i) {
    ASSERT_EQ(tree.ScheduleSingular(Free(1000, 1000, 0, 1000), GpuMask::All(4), rng), 3);
  }
}

// Table IV: with gpu2 taken, 2 GPUs are gpu0 & gpu1, every time.
TEST(GaiaExperimentsTest, Table4LinkScheduling) {
  AccessCostTree tree = PaperTree();
  Rng rng(4);
  for (int i = 0; i < kRepetitions; ++i) {
    ASSERT_EQ(tree.ScheduleLink(Free(1000, 1000, 0, 1000), GpuMask::All(4), 2, rng), GpuMask(0b0011));
  }
}

// The same four experiments end to end: pods through the Placer with the gaia policy on a one-node cluster,
// committed to and released from the Cluster, 500 times each.
class GaiaThroughPlacerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NodeInfo node = MakeNode("paper", 4);
    node.links = PaperTopology();
    ASSERT_TRUE(cluster_.AddNode(node).ok());
    policy_ = *MakePolicy("gaia");
  }
  // Places and commits a pod; returns the GPU indices it got.
  std::vector<int> Place(const PodRequest& pod) {
    Placer placer(*policy_);
    absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng_);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return {};
    EXPECT_TRUE(cluster_.Commit(pod, *p).ok());
    std::vector<int> gpus;
    for (const VGpuAssignment& v : p->containers[0].vgpus) gpus.push_back(v.gpu_index);
    std::sort(gpus.begin(), gpus.end());
    return gpus;
  }
  void Release(const std::string& uid) { ASSERT_TRUE(cluster_.Release(PodUid(uid)).ok()); }

  Cluster cluster_;
  std::unique_ptr<Policy> policy_;
  Rng rng_{42};
};

TEST_F(GaiaThroughPlacerTest, AllFourTables) {
  std::map<int, int> table1;
  for (int i = 0; i < kRepetitions; ++i) {
    std::vector<int> g = Place(MakePod("one", {Whole()}));
    ASSERT_EQ(g.size(), 1u);
    ++table1[g[0]];
    Release("one");
    ASSERT_EQ(Place(MakePod("two", {Whole(), Whole()})), (std::vector<int>{2, 3}));
    Release("two");
  }
  EXPECT_EQ(table1[0] + table1[1], 0);
  EXPECT_GE(table1[2], 200);
  EXPECT_LE(table1[2], 300);

  // Table II: container 1 holds 0.5 of gpu2.
  ASSERT_TRUE(cluster_
                  .Commit(MakePod("c1", {Milli(500)}),
                          ::tessera::testing::PlacementOn(
                              "paper", {{2, GpuUuid("GPU-paper-2"), MilliGpu(500), MiB(8192)}}))
                  .ok());
  for (int i = 0; i < kRepetitions; ++i) {
    ASSERT_EQ(Place(MakePod("c2", {Milli(400)})), std::vector<int>{2});
    ASSERT_EQ(Place(MakePod("c3", {Milli(100)})), std::vector<int>{2});
    Release("c2");
    Release("c3");
  }
  Release("c1");

  // Tables III and IV: gpu2 taken whole.
  ASSERT_TRUE(cluster_
                  .Commit(MakePod("busy", {Whole()}),
                          ::tessera::testing::PlacementOn(
                              "paper", {{2, GpuUuid("GPU-paper-2"), kWholeGpu, MiB(16384)}}))
                  .ok());
  for (int i = 0; i < kRepetitions; ++i) {
    ASSERT_EQ(Place(MakePod("three", {Whole()})), std::vector<int>{3});
    Release("three");
    ASSERT_EQ(Place(MakePod("four", {Whole(), Whole()})), (std::vector<int>{0, 1}));
    Release("four");
  }
}

}  // namespace
}  // namespace tessera::core
