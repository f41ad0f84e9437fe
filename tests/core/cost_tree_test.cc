#include "core/cost_tree.h"

#include <gtest/gtest.h>

#include <vector>

#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::ReadTestData;

AccessCostTree TreeOf(const std::string& file) {
  absl::StatusOr<TopoReport> r = ParseNvidiaSmiTopo(ReadTestData(file));
  EXPECT_TRUE(r.ok()) << r.status();
  absl::StatusOr<AccessCostTree> t = AccessCostTree::Build(r->links);
  EXPECT_TRUE(t.ok()) << t.status();
  return *t;
}

std::vector<MilliGpu> AllFree(int n) {
  return std::vector<MilliGpu>(static_cast<size_t>(n), kWholeGpu);
}

GpuMask Mask(std::initializer_list<int> gpus) {
  GpuMask m;
  for (int g : gpus) m.Add(g);
  return m;
}

TEST(CostTreeTest, NvSwitchIsOneLevel) {
  AccessCostTree t = TreeOf("topo/dgx-a100.txt");
  EXPECT_EQ(t.gpu_count(), 8);
  const AccessCostTree::Node& root = t.node(t.root());
  EXPECT_EQ(root.level, Link::NvLink(12));
  EXPECT_EQ(root.children.size(), 8u);
  for (int g = 0; g < 8; ++g) EXPECT_EQ(t.AccessCost(g), Link::NvLink(12).Cost());
}

TEST(CostTreeTest, TwoSocketsNestPixPhbSys) {
  AccessCostTree t = TreeOf("topo/two-socket-8gpu.txt");
  EXPECT_EQ(t.ToString(),
            "SYS (60)\n"
            "  PHB (40)\n"
            "    PIX (20)\n      GPU0 (20)\n      GPU1 (20)\n"
            "    PIX (20)\n      GPU2 (20)\n      GPU3 (20)\n"
            "  PHB (40)\n"
            "    PIX (20)\n      GPU4 (20)\n      GPU5 (20)\n"
            "    PIX (20)\n      GPU6 (20)\n      GPU7 (20)\n");
  EXPECT_EQ(t.CostOf(Mask({0, 1})), 20);
  EXPECT_EQ(t.CostOf(Mask({0, 2})), 40);
  EXPECT_EQ(t.CostOf(Mask({0, 7})), 60);
  EXPECT_EQ(t.CostOf(Mask({5})), 0);
}

TEST(CostTreeTest, LoneGpuHangsFromTheRoot) {
  AccessCostTree t = TreeOf("topo/two-socket-5gpu.txt");
  EXPECT_EQ(t.ToString(),
            "SYS (60)\n"
            "  GPU0 (60)\n"
            "  NODE (50)\n"
            "    PHB (40)\n      GPU1 (40)\n      GPU2 (40)\n"
            "    PHB (40)\n      GPU3 (40)\n      GPU4 (40)\n");
}

TEST(CostTreeTest, BuildRefusesEmptyAndHugeNodes) {
  EXPECT_FALSE(AccessCostTree::Build(LinkMatrix(0)).ok());
  EXPECT_FALSE(AccessCostTree::Build(LinkMatrix(65)).ok());
  absl::StatusOr<AccessCostTree> one = AccessCostTree::Build(LinkMatrix(1));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->AccessCost(0), 0);
}

TEST(CostTreeTest, FragmentTakesTheBestFittingFragment) {
  AccessCostTree t = TreeOf("topo/pcie-4gpu-t4.txt");
  Rng rng(1);
  std::vector<MilliGpu> free = {kWholeGpu, MilliGpu(300), MilliGpu(600), MilliGpu(250)};
  EXPECT_EQ(t.ScheduleFragment(free, GpuMask::All(4), MilliGpu(250), rng), 3);  // exact fit
  EXPECT_EQ(t.ScheduleFragment(free, GpuMask::All(4), MilliGpu(260), rng), 1);  // least free that fits
  EXPECT_EQ(t.ScheduleFragment(free, GpuMask::All(4), MilliGpu(700), rng), 0);  // no fragment: a whole GPU
  EXPECT_EQ(t.ScheduleFragment(free, Mask({1, 2}), MilliGpu(700), rng), std::nullopt);
}

TEST(CostTreeTest, SingularKeepsPairsIntact) {
  AccessCostTree t = TreeOf("topo/two-socket-8gpu.txt");
  Rng rng(7);
  std::vector<MilliGpu> free = AllFree(8);
  free[4] = MilliGpu(0);  // GPU4 busy: GPU5 is the free GPU of a broken pair
  for (int i = 0; i < 50; ++i) EXPECT_EQ(t.ScheduleSingular(free, GpuMask::All(8), rng), 5);
  free[5] = MilliGpu(500);  // a fragment sibling breaks the pair too
  free[4] = kWholeGpu;
  for (int i = 0; i < 50; ++i) EXPECT_EQ(t.ScheduleSingular(free, GpuMask::All(8), rng), 4);
}

TEST(CostTreeTest, SingularPrefersALoneGpu) {
  AccessCostTree t = TreeOf("topo/two-socket-5gpu.txt");
  Rng rng(3);
  EXPECT_EQ(t.ScheduleSingular(AllFree(5), GpuMask::All(5), rng), 0);
  // Not eligible (say, excluded by UUID): the pairs are all intact, so the lowest cost wins.
  std::optional<int> g = t.ScheduleSingular(AllFree(5), Mask({1, 2, 3, 4}), rng);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(t.AccessCost(*g), 40);
}

TEST(CostTreeTest, LinkPicksTheNearestSubtree) {
  AccessCostTree t = TreeOf("topo/two-socket-8gpu.txt");
  Rng rng(11);
  std::vector<MilliGpu> free = AllFree(8);
  std::optional<GpuMask> two = t.ScheduleLink(free, GpuMask::All(8), 2, rng);
  ASSERT_TRUE(two.has_value());
  EXPECT_EQ(t.CostOf(*two), 20);  // a PIX pair
  std::optional<GpuMask> four = t.ScheduleLink(free, GpuMask::All(8), 4, rng);
  ASSERT_TRUE(four.has_value());
  EXPECT_TRUE(*four == Mask({0, 1, 2, 3}) || *four == Mask({4, 5, 6, 7}));
}

TEST(CostTreeTest, LinkTakesWholeChildrenToKeepOthersIntact) {
  AccessCostTree t = TreeOf("topo/two-socket-8gpu.txt");
  Rng rng(5);
  std::vector<MilliGpu> free = AllFree(8);
  free[0] = MilliGpu(0);
  // Three GPUs: socket 0 holds exactly three (1 + the pair 2,3).
  EXPECT_EQ(t.ScheduleLink(free, GpuMask::All(8), 3, rng), Mask({1, 2, 3}));
  // Four: socket 0 has only three, socket 1 has four.
  EXPECT_EQ(t.ScheduleLink(free, GpuMask::All(8), 4, rng), Mask({4, 5, 6, 7}));
  // Six over both sockets: all free of one socket plus an intact pair of the other.
  std::vector<MilliGpu> all = AllFree(8);
  std::optional<GpuMask> six = t.ScheduleLink(all, GpuMask::All(8), 6, rng);
  ASSERT_TRUE(six.has_value());
  EXPECT_EQ(six->Count(), 6);
  GpuMask left = GpuMask::All(8) & ~*six;
  EXPECT_EQ(t.CostOf(left), 20) << "the two GPUs left over should be a PIX pair";
  EXPECT_EQ(t.ScheduleLink(all, GpuMask::All(8), 9, rng), std::nullopt);
}

TEST(CostTreeTest, ScheduleDispatchesByAmount) {
  AccessCostTree t = TreeOf("topo/pcie-4gpu-t4.txt");
  Rng rng(2);
  std::vector<MilliGpu> free = AllFree(4);
  EXPECT_EQ(t.Schedule(free, GpuMask::All(4), MilliGpu(500), rng)->Count(), 1);
  EXPECT_EQ(t.Schedule(free, GpuMask::All(4), MilliGpu(1000), rng)->Count(), 1);
  EXPECT_EQ(t.Schedule(free, GpuMask::All(4), MilliGpu(2000), rng)->Count(), 2);
  EXPECT_EQ(t.Schedule(free, GpuMask::All(4), MilliGpu(1500), rng), std::nullopt);  // whole GPUs above one
  EXPECT_EQ(t.Schedule(free, GpuMask::All(4), MilliGpu(0), rng), std::nullopt);
}

}  // namespace
}  // namespace tessera::core
