// The SharedGPU seed (Wang et al., section 2): shared and exclusive modes, the priority rules of section 2.3,
// and compression by its equations (1) and (2), with the seed's own example.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/placement/compression.h"
#include "core/placement/placer.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Share;
using ::tessera::testing::Whole;
using ::testing::ElementsAre;

std::vector<int> Cuts(std::vector<int> shares, int deficit, int min_share) {
  std::vector<MilliGpu> s;
  for (int x : shares) s.emplace_back(x);
  std::optional<std::vector<MilliGpu>> cuts = CompressionCuts(s, MilliGpu(deficit), MilliGpu(min_share));
  if (!cuts) return {-1};
  std::vector<int> out;
  for (MilliGpu c : *cuts) out.push_back(c.value());
  return out;
}

TEST(CompressionCutsTest, SeedExample) {
  // One low-priority tenant of 40; the GPU has 60 free; a high-priority pod asks 70:
  // Q = (70 - 60) % 1 = 0, R = (70 - 60) / 1 = 10: the tenant gives up 10.
  EXPECT_THAT(Cuts({400}, 100, 10), ElementsAre(100));
}

TEST(CompressionCutsTest, EquationsOneAndTwo) {
  // Three tenants yield 10%: R = 3, Q = 1; the largest tenant gives R + 1.
  EXPECT_THAT(Cuts({200, 500, 300}, 100, 10), ElementsAre(30, 40, 30));
  // Evenly divisible: Q = 0.
  EXPECT_THAT(Cuts({300, 300}, 200, 10), ElementsAre(100, 100));
  // Thousandths when a share is not a whole percent.
  EXPECT_THAT(Cuts({205, 300}, 101, 10), ElementsAre(50, 51));
}

TEST(CompressionCutsTest, MinimumShareHoldsAndTheRestIsShared) {
  // The 5% tenant can give only 4% (down to the 1% minimum); the others share what it could not.
  EXPECT_THAT(Cuts({50, 400, 400}, 300, 10), ElementsAre(40, 130, 130));
  EXPECT_THAT(Cuts({100, 100}, 190, 10), ElementsAre(-1));  // cannot free 19% without going below 1%
  EXPECT_THAT(Cuts({100, 100}, 0, 10), ElementsAre(0, 0));
}

class SharedGpuTest : public ::testing::Test {
 protected:
  void SetUp() override { policy_ = *MakePolicy("gaia"); }
  absl::StatusOr<Placement> Place(const PodRequest& pod) {
    Placer placer(*policy_);
    absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng_);
    if (p.ok()) {
      EXPECT_TRUE(cluster_.Commit(pod, *p).ok());
    }
    return p;
  }
  PodRequest Pod(const std::string& uid, std::vector<VGpuDemand> v, Priority prio) {
    PodRequest p = MakePod(uid, std::move(v));
    p.priority = prio;
    return p;
  }
  Cluster cluster_;
  Rng rng_{9};
  std::unique_ptr<Policy> policy_;
};

TEST_F(SharedGpuTest, SharedAndExclusiveModes) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("n", 4)).ok());
  // Shared: 0-100 of one GPU. Exclusive: multiples of 100 are whole GPUs.
  absl::StatusOr<Placement> shared = Place(Pod("s", {Share(50)}, Priority::kLow));
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->containers[0].vgpus[0].cores.value(), 500);
  absl::StatusOr<Placement> exclusive = Place(Pod("e", {Whole(), Whole()}, Priority::kLow));
  ASSERT_TRUE(exclusive.ok());
  for (const VGpuAssignment& v : exclusive->containers[0].vgpus) {
    EXPECT_TRUE(IsWholeGpu(v.cores));
    EXPECT_NE(v.gpu_index, shared->containers[0].vgpus[0].gpu_index);
  }
}

TEST_F(SharedGpuTest, SeedCompressionExample) {
  // The seed's experiment: one GPU split 40 / 60; low-priority task A holds the 40; high-priority B asks 70.
  ASSERT_TRUE(cluster_.AddNode(MakeNode("gpu", 1, MiB(16384))).ok());
  ASSERT_TRUE(Place(Pod("A", {Share(40, 2048)}, Priority::kLow)).ok());
  absl::StatusOr<Placement> b = Place(Pod("B", {Share(70, 2048)}, Priority::kHigh));
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_EQ(b->compressions.size(), 1u);
  EXPECT_EQ(b->compressions[0].tenant.pod, PodUid("A"));
  EXPECT_EQ(b->compressions[0].old_cores.value(), 400);
  EXPECT_EQ(b->compressions[0].new_cores.value(), 300);  // "cut by 10"
  EXPECT_EQ(b->containers[0].vgpus[0].cores.value(), 700);
  const NodeState& n = *cluster_.FindNode(NodeName("gpu"));
  EXPECT_EQ(n.free_cores(0).value(), 0);
  // The new limits of every tenant: A 30, B 70; A's recorded placement says so too.
  EXPECT_EQ(n.tenants(0)[0].cores.value(), 300);
  EXPECT_EQ(n.tenants(0)[0].requested.value(), 400);
  EXPECT_EQ(cluster_.FindPlacement(PodUid("A"))->containers[0].vgpus[0].cores.value(), 300);
  // When B leaves, A gets its 40 back.
  absl::StatusOr<std::vector<ShareChange>> back = cluster_.Release(PodUid("B"));
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->size(), 1u);
  EXPECT_EQ((*back)[0].new_cores.value(), 400);
  EXPECT_EQ(n.tenants(0)[0].cores.value(), 400);
}

TEST_F(SharedGpuTest, CompressionSharesTheCutByEquations) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("gpu", 1, MiB(16384))).ok());
  ASSERT_TRUE(Place(Pod("a", {Share(20, 1000)}, Priority::kLow)).ok());
  ASSERT_TRUE(Place(Pod("b", {Share(50, 1000)}, Priority::kLow)).ok());
  ASSERT_TRUE(Place(Pod("c", {Share(20, 1000)}, Priority::kLow)).ok());
  // 10 free; asks 20: the three tenants give 10 between them: R = 3, Q = 1, b (largest) gives 4.
  absl::StatusOr<Placement> h = Place(Pod("h", {Share(20, 1000)}, Priority::kHigh));
  ASSERT_TRUE(h.ok()) << h.status();
  std::map<std::string, int> cut;
  for (const Compression& c : h->compressions)
    cut[c.tenant.pod.value()] = (c.old_cores - c.new_cores).value();
  EXPECT_EQ(cut["a"], 30);
  EXPECT_EQ(cut["b"], 40);
  EXPECT_EQ(cut["c"], 30);
}

TEST_F(SharedGpuTest, HighPriorityTenantsAreNeverCompressed) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("gpu", 1, MiB(16384))).ok());
  ASSERT_TRUE(Place(Pod("vip", {Share(60, 1000)}, Priority::kHigh)).ok());
  ASSERT_TRUE(Place(Pod("low", {Share(20, 1000)}, Priority::kLow)).ok());
  // Needs 40 with 20 free: only the low tenant may give, and it can give 19 at most.
  EXPECT_FALSE(Place(Pod("h", {Share(40, 1000)}, Priority::kHigh)).ok());
  // Low-priority pods never compress anyone.
  EXPECT_FALSE(Place(Pod("l", {Share(30, 1000)}, Priority::kLow)).ok());
  // 35 fits by compressing low from 20 to 5.
  absl::StatusOr<Placement> ok = Place(Pod("h2", {Share(35, 1000)}, Priority::kHigh));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->compressions.size(), 1u);
  EXPECT_EQ(ok->compressions[0].new_cores.value(), 50);
}

TEST_F(SharedGpuTest, CompressionChoosesTheGpuWithMostFreeShare) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("n", 2, MiB(16384))).ok());
  ASSERT_TRUE(Place(Pod("a", {Share(70, 1000)}, Priority::kLow)).ok());
  ASSERT_TRUE(Place(Pod("b", {Share(80, 1000)}, Priority::kLow)).ok());
  const int gpu_of_a = cluster_.FindPlacement(PodUid("a"))->containers[0].vgpus[0].gpu_index;
  absl::StatusOr<Placement> h = Place(Pod("h", {Share(40, 1000)}, Priority::kHigh));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->containers[0].vgpus[0].gpu_index, gpu_of_a);  // 30 free beats 20 free
  ASSERT_EQ(h->compressions.size(), 1u);
  EXPECT_EQ(h->compressions[0].tenant.pod, PodUid("a"));
  EXPECT_EQ(h->compressions[0].new_cores.value(), 600);
}

TEST_F(SharedGpuTest, HighPriorityTakesAnIdleGpuFirst) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("n", 2, MiB(16384))).ok());
  ASSERT_TRUE(Place(Pod("a", {Share(30)}, Priority::kLow)).ok());
  const int used = cluster_.FindPlacement(PodUid("a"))->containers[0].vgpus[0].gpu_index;
  // Gaia's Fragment would put a low-priority 20% on the partly used GPU (best fit)...
  absl::StatusOr<Placement> low = Place(Pod("low", {Share(20)}, Priority::kLow));
  EXPECT_EQ(low->containers[0].vgpus[0].gpu_index, used);
  // ...but a high-priority pod takes the idle one.
  absl::StatusOr<Placement> high = Place(Pod("high", {Share(20)}, Priority::kHigh));
  EXPECT_EQ(high->containers[0].vgpus[0].gpu_index, 1 - used);
}

TEST_F(SharedGpuTest, HighPriorityPrefersNodesWithAnIdleGpu) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("full", 1)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("idle", 1)).ok());
  Placement on_full =
      ::tessera::testing::PlacementOn("full", {{0, GpuUuid("GPU-full-0"), MilliGpu(100), MiB(100)}});
  ASSERT_TRUE(cluster_.Commit(Pod("x", {}, Priority::kLow), on_full).ok());
  for (int i = 0; i < 10; ++i) {
    Placer placer(*policy_);
    absl::StatusOr<Placement> p = placer.Place(cluster_, Pod("h", {Share(20)}, Priority::kHigh), rng_);
    EXPECT_EQ(p->node, NodeName("idle"));
  }
}

TEST_F(SharedGpuTest, LowPriorityPrefersNodesWithOnlyLowPriorityTenants) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("with-high", 2)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("low-only", 2)).ok());
  Placement vip = ::tessera::testing::PlacementOn("with-high",
                                                  {{0, GpuUuid("GPU-with-high-0"), MilliGpu(500), MiB(100)}});
  ASSERT_TRUE(cluster_.Commit(Pod("vip", {}, Priority::kHigh), vip).ok());
  Placement low =
      ::tessera::testing::PlacementOn("low-only", {{0, GpuUuid("GPU-low-only-0"), MilliGpu(500), MiB(100)}});
  ASSERT_TRUE(cluster_.Commit(Pod("low", {}, Priority::kLow), low).ok());
  for (int i = 0; i < 10; ++i) {
    Placer placer(*policy_);
    EXPECT_EQ(placer.Place(cluster_, Pod("l", {Share(20)}, Priority::kLow), rng_)->node,
              NodeName("low-only"));
  }
}

}  // namespace
}  // namespace tessera::core
