#include "core/cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Share;
using ::testing::HasSubstr;

Placement On(const std::string& node, std::vector<VGpuAssignment> vgpus) {
  return ::tessera::testing::PlacementOn(node, std::move(vgpus));
}

VGpuAssignment Vgpu(int gpu, int milli, int64_t mib) {
  return {gpu, GpuUuid(), MilliGpu(milli), MiB(mib)};
}

TEST(ClusterTest, AddNodeValidates) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2)).ok());
  EXPECT_EQ(c.AddNode(MakeNode("a", 2)).code(), absl::StatusCode::kAlreadyExists);

  NodeInfo bad_index = MakeNode("b", 2);
  bad_index.gpus[1].index = 5;
  EXPECT_THAT(std::string(c.AddNode(bad_index).message()), HasSubstr("indices must be 0..1"));

  NodeInfo dup = MakeNode("c", 2);
  dup.gpus[1].uuid = dup.gpus[0].uuid;
  EXPECT_THAT(std::string(c.AddNode(dup).message()), HasSubstr("appears twice"));

  NodeInfo no_mem = MakeNode("d", 1);
  no_mem.gpus[0].memory = MiB(0);
  EXPECT_THAT(std::string(c.AddNode(no_mem).message()), HasSubstr("memoryMiB"));

  NodeInfo wrong_links = MakeNode("e", 2);
  wrong_links.links = LinkMatrix(3);
  EXPECT_THAT(std::string(c.AddNode(wrong_links).message()), HasSubstr("link matrix is 3x3"));

  EXPECT_FALSE(c.AddNode(MakeNode("f", 65)).ok());
  EXPECT_EQ(c.node_count(), 1);
}

// A node's totals sum its 64 GPUs' memory, and pods' CPU adds up under its capacity: capacities beyond any
// machine, or negative ones, used to be accepted and their sums could wrap.
TEST(ClusterTest, CapacitiesThatCouldWrapAreRefused) {
  Cluster c;
  NodeInfo huge_gpu = MakeNode("g", 64);
  for (GpuInfo& g : huge_gpu.gpus) g.memory = MiB(int64_t{1} << 57);  // 64 x 2^57 wraps an int64
  EXPECT_THAT(std::string(c.AddNode(huge_gpu).message()), HasSubstr("no GPU has more than 2^40 MiB"));
  NodeInfo negative = MakeNode("n", 1);
  negative.cpu = MilliCpu(-1);
  EXPECT_THAT(std::string(c.AddNode(negative).message()), HasSubstr("negative or more than 2^40"));
  NodeInfo big_cpu = MakeNode("b", 1);
  big_cpu.memory = MiB(int64_t{1} << 41);
  EXPECT_THAT(std::string(c.AddNode(big_cpu).message()), HasSubstr("negative or more than 2^40"));
  EXPECT_EQ(c.node_count(), 0);
  // A negative request cannot free CPU on commit.
  ASSERT_TRUE(c.AddNode(MakeNode("a", 1)).ok());
  PodRequest p = MakePod("p", {Share(30, 1000)});
  p.cpu = MilliCpu(-5000);
  EXPECT_EQ(c.Commit(p, On("a", {Vgpu(0, 300, 1000)})).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClusterTest, CommitAndReleaseAccountExactly) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2, MiB(16000))).ok());
  PodRequest p = MakePod("p", {Share(30, 4000)});
  ASSERT_TRUE(c.Commit(p, On("a", {Vgpu(1, 300, 4000)})).ok());
  const NodeState* a = c.FindNode(NodeName("a"));
  EXPECT_EQ(a->free_cores(1).value(), 700);
  EXPECT_EQ(a->free_memory(1).value(), 12000);
  ASSERT_EQ(a->tenants(1).size(), 1u);
  EXPECT_EQ(a->tenants(1)[0].id, (TenantId{PodUid("p"), "main"}));
  EXPECT_EQ(a->whole_free_gpus(), 1);
  EXPECT_EQ(c.Commit(p, On("a", {Vgpu(0, 300, 4000)})).code(), absl::StatusCode::kAlreadyExists);

  ASSERT_TRUE(c.Release(PodUid("p")).ok());
  EXPECT_EQ(a->free_cores(1), kWholeGpu);
  EXPECT_EQ(a->free_memory(1).value(), 16000);
  EXPECT_TRUE(a->tenants(1).empty());
  EXPECT_EQ(c.Release(PodUid("p")).status().code(), absl::StatusCode::kNotFound);
}

TEST(ClusterTest, ExclusiveTenantTakesAllMemory) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 1, MiB(16000))).ok());
  ASSERT_TRUE(c.Commit(MakePod("p", {}), On("a", {Vgpu(0, 1000, 2000)})).ok());
  EXPECT_EQ(c.FindNode(NodeName("a"))->free_memory(0).value(), 0);
  EXPECT_EQ(c.FindNode(NodeName("a"))->tenants(0)[0].memory_limit.value(), 2000);
}

TEST(ClusterTest, RefusedCommitChangesNothing) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2, MiB(16000))).ok());
  ASSERT_TRUE(c.Commit(MakePod("p", {}), On("a", {Vgpu(0, 800, 1000)})).ok());
  const NodeState before = *c.FindNode(NodeName("a"));
  // The second vGPU does not fit: the first must not be recorded either.
  absl::Status s = c.Commit(MakePod("q", {}), On("a", {Vgpu(1, 500, 1000), Vgpu(0, 500, 1000)}));
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("GPU 0 has 200/1000 share"));
  EXPECT_TRUE(*c.FindNode(NodeName("a")) == before);
  EXPECT_FALSE(c.HasPod(PodUid("q")));
  // Other refusals.
  EXPECT_FALSE(c.Commit(MakePod("r", {}), On("a", {Vgpu(7, 100, 10)})).ok());
  EXPECT_FALSE(c.Commit(MakePod("r", {}), On("a", {Vgpu(1, 100, 10), Vgpu(1, 100, 10)})).ok());
  EXPECT_FALSE(c.Commit(MakePod("r", {}), On("a", {{1, GpuUuid("GPU-other"), MilliGpu(100), MiB(10)}})).ok());
  EXPECT_FALSE(c.Commit(MakePod("r", {}), On("zz", {Vgpu(0, 100, 10)})).ok());
  EXPECT_FALSE(c.Commit(MakePod("r", {}), On("a", {Vgpu(1, 0, 10)})).ok());
  EXPECT_TRUE(*c.FindNode(NodeName("a")) == before);
}

TEST(ClusterTest, RefusesATenantCompressedTwice) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 1, MiB(16000))).ok());
  ASSERT_TRUE(c.Commit(MakePod("lo", {}), On("a", {Vgpu(0, 400, 100)})).ok());
  Placement p = On("a", {Vgpu(0, 900, 100)});
  const TenantId lo{PodUid("lo"), "main"};
  p.compressions = {{lo, 0, MilliGpu(400), MilliGpu(100)}, {lo, 0, MilliGpu(400), MilliGpu(100)}};
  PodRequest hi = MakePod("hi", {});
  hi.priority = Priority::kHigh;
  absl::Status s = c.Commit(hi, p);
  EXPECT_THAT(std::string(s.message()), HasSubstr("compressed twice"));
  EXPECT_EQ(c.FindNode(NodeName("a"))->free_cores(0).value(), 600);
}

TEST(ClusterTest, HostResourcesAreAccounted) {
  Cluster c;
  NodeInfo n = MakeNode("a", 1);
  n.cpu = MilliCpu(4000);
  n.memory = MiB(8192);
  ASSERT_TRUE(c.AddNode(n).ok());
  PodRequest p = MakePod("p", {Share(10)});
  p.cpu = MilliCpu(3000);
  p.memory = MiB(4096);
  ASSERT_TRUE(c.Commit(p, On("a", {Vgpu(0, 100, 100)})).ok());
  EXPECT_EQ(c.FindNode(NodeName("a"))->free_cpu().value(), 1000);
  PodRequest q = MakePod("q", {Share(10)});
  q.cpu = MilliCpu(2000);
  EXPECT_THAT(std::string(c.Commit(q, On("a", {Vgpu(0, 100, 100)})).message()),
              HasSubstr("1000 millicores free"));
  ASSERT_TRUE(c.Release(PodUid("p")).ok());
  EXPECT_EQ(c.FindNode(NodeName("a"))->free_host_memory().value(), 8192);
}

TEST(ClusterTest, HealthAndRemoval) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2)).ok());
  ASSERT_TRUE(c.AddNode(MakeNode("b", 1)).ok());
  ASSERT_TRUE(c.SetGpuHealth(NodeName("a"), GpuUuid("GPU-a-1"), GpuHealth::kUnhealthy).ok());
  EXPECT_EQ(c.FindNode(NodeName("a"))->healthy().Count(), 1);
  EXPECT_EQ(c.FindNode(NodeName("a"))->whole_free_gpus(), 1);
  EXPECT_FALSE(c.SetGpuHealth(NodeName("a"), GpuUuid("GPU-zz"), GpuHealth::kHealthy).ok());

  ASSERT_TRUE(c.Commit(MakePod("p", {}), On("a", {Vgpu(0, 100, 10)})).ok());
  EXPECT_EQ(c.RemoveNode(NodeName("a")).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.Commit(MakePod("q", {}), On("b", {Vgpu(0, 100, 10)})).ok());
  ASSERT_TRUE(c.Release(PodUid("p")).ok());
  ASSERT_TRUE(c.RemoveNode(NodeName("a")).ok());
  // "b" moved in the node list; its pod must still release from it.
  ASSERT_TRUE(c.Release(PodUid("q")).ok());
  EXPECT_EQ(c.FindNode(NodeName("b"))->free_cores(0), kWholeGpu);
  EXPECT_EQ(c.FindNode(NodeName("a")), nullptr);
}

// Caches keyed by a node's position and version (EvaluationCache, RankedIndex) rely on node_versions():
// every change gives the node a version newer than any before, and a node moved to another position by a
// removal counts as changed there.
TEST(ClusterTest, NodeVersionsFollowEveryChangeAndMove) {
  Cluster c;
  for (const char* name : {"a", "b", "c"}) ASSERT_TRUE(c.AddNode(MakeNode(name, 2)).ok());
  auto newest = [&] { return *std::max_element(c.node_versions().begin(), c.node_versions().end()); };
  ASSERT_EQ(c.node_versions().size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(c.node_versions()[i], c.nodes()[i].version());

  uint64_t before = newest();
  ASSERT_TRUE(c.Commit(MakePod("p", {}), On("b", {Vgpu(0, 100, 10)})).ok());
  EXPECT_GT(c.node_versions()[1], before);
  before = newest();
  ASSERT_TRUE(c.SetSchedulable(NodeName("a"), false).ok());
  EXPECT_GT(c.node_versions()[0], before);

  before = newest();
  ASSERT_TRUE(c.RemoveNode(NodeName("a")).ok());  // "c" moves to position 0
  ASSERT_EQ(c.node_versions().size(), 2u);
  EXPECT_EQ(c.nodes()[0].name().value(), "c");
  EXPECT_GT(c.node_versions()[0], before);
  EXPECT_EQ(c.node_versions()[0], c.nodes()[0].version());
  EXPECT_EQ(c.node_versions()[1], c.nodes()[1].version());
}

TEST(ClusterTest, QuotaUseFollowsCommitAndRelease) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2, MiB(16000), "T4")).ok());
  c.SetQuota(Namespace("team"), "T4", MilliGpu(1500));
  const int t4 = c.ModelId("T4");
  EXPECT_EQ(c.Quota(Namespace("team"), t4), MilliGpu(1500));
  EXPECT_EQ(c.Quota(Namespace("other"), t4), std::nullopt);
  ASSERT_TRUE(c.Commit(MakePod("p", {}, "team"), On("a", {Vgpu(0, 1000, 10), Vgpu(1, 250, 10)})).ok());
  EXPECT_EQ(c.QuotaUsed(Namespace("team"), t4).value(), 1250);
  ASSERT_TRUE(c.Release(PodUid("p")).ok());
  EXPECT_EQ(c.QuotaUsed(Namespace("team"), t4).value(), 0);
}

TEST(ClusterTest, QuotaHeldElsewhereCountsAndIsReplacedWhole) {
  Cluster c;
  ASSERT_TRUE(c.AddNode(MakeNode("a", 2, MiB(16000), "T4")).ok());
  c.SetQuota(Namespace("team"), "T4", MilliGpu(1500));
  ASSERT_TRUE(c.Commit(MakePod("p", {}, "team"), On("a", {Vgpu(0, 250, 10)})).ok());
  const std::vector<QuotaStanding> elsewhere = {
      {.ns = Namespace("team"), .model = "T4", .limit = std::nullopt, .held_elsewhere = 1000},
      {.ns = Namespace("lab"), .model = "A100", .limit = std::nullopt, .held_elsewhere = 500},
      {.ns = Namespace("bad"),
       .model = "T4",
       .limit = std::nullopt,
       .held_elsewhere = -7000}};  // never frees quota
  c.SetQuotaHeldElsewhere(elsewhere);
  const int t4 = c.ModelId("T4");
  EXPECT_EQ(c.QuotaUsed(Namespace("team"), t4).value(), 1250);
  EXPECT_EQ(c.QuotaUsed(Namespace("bad"), t4).value(), 0);
  std::vector<QuotaStanding> s = c.QuotaStandings();  // namespace order: lab, team
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].ns, Namespace("lab"));
  EXPECT_EQ(s[0].model, "A100");
  EXPECT_EQ(s[0].limit, std::nullopt);
  EXPECT_EQ(s[0].held_elsewhere, 500);
  EXPECT_EQ(s[1].ns, Namespace("team"));
  EXPECT_EQ(s[1].limit, MilliGpu(1500));
  EXPECT_EQ(s[1].held_here, 250);
  EXPECT_EQ(s[1].held_elsewhere, 1000);
  // The next figures replace these: what is no longer held elsewhere is free again.
  c.SetQuotaHeldElsewhere({});
  EXPECT_EQ(c.QuotaUsed(Namespace("team"), t4).value(), 250);
}

}  // namespace
}  // namespace tessera::core
