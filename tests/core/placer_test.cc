#include "core/placement/placer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::ReadTestData;
using ::tessera::testing::Share;
using ::tessera::testing::Whole;
using ::testing::HasSubstr;
using ::testing::Not;

class PlacerTest : public ::testing::Test {
 protected:
  Placer MakePlacer(const std::string& policy, PlacementOptions options = {}) {
    policies_.push_back(*MakePolicy(policy));
    return Placer(*policies_.back(), options);
  }
  // Commits a pod holding `milli` and `mib` on one GPU.
  void Occupy(const std::string& node, int gpu, int milli, int64_t mib, const std::string& uid,
              Priority priority = Priority::kLow) {
    PodRequest p = MakePod(uid, {});
    p.priority = priority;
    const NodeState* n = cluster_.FindNode(NodeName(node));
    ASSERT_NE(n, nullptr);
    Placement pl =
        ::tessera::testing::PlacementOn(node, {{gpu, n->gpu(gpu).uuid, MilliGpu(milli), MiB(mib)}});
    ASSERT_TRUE(cluster_.Commit(p, pl).ok());
  }
  absl::StatusOr<Placement> Place(Placer& placer, const PodRequest& pod) {
    absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng_);
    if (p.ok()) {
      EXPECT_TRUE(cluster_.Commit(pod, *p).ok());
    }
    return p;
  }

  Cluster cluster_;
  Rng rng_{1};
  std::vector<std::unique_ptr<Policy>> policies_;
};

TEST_F(PlacerTest, UnknownPolicyNamesTheChoices) {
  absl::StatusOr<std::unique_ptr<Policy>> p = MakePolicy("fastest");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(std::string(p.status().message()), HasSubstr("gaia, binpack, spread, gpushare"));
}

TEST_F(PlacerTest, ModelIncludeAndExclude) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("t4", 2, MiB(15360), "T4")).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a100", 2, MiB(81920), "A100")).ok());
  Placer placer = MakePlacer("binpack");
  PodRequest want_a100 = MakePod("p1", {Share(10)});
  want_a100.model_include = {"A100"};
  EXPECT_EQ(Place(placer, want_a100)->node, NodeName("a100"));
  PodRequest no_a100 = MakePod("p2", {Share(10)});
  no_a100.model_exclude = {"A100"};
  EXPECT_EQ(Place(placer, no_a100)->node, NodeName("t4"));
  PodRequest h100 = MakePod("p3", {Share(10)});
  h100.model_include = {"H100"};
  absl::StatusOr<Placement> none = Place(placer, h100);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()),
              HasSubstr("node t4: has T4 GPUs; the pod allows only H100"));
}

TEST_F(PlacerTest, NeverMixesModelsInOnePod) {
  NodeInfo mixed = MakeNode("mixed", 4, MiB(16384), "T4");
  mixed.gpus[2].model = "V100";
  mixed.gpus[3].model = "V100";
  mixed.gpus[2].memory = mixed.gpus[3].memory = MiB(32768);
  ASSERT_TRUE(cluster_.AddNode(mixed).ok());
  Placer placer = MakePlacer("gaia");
  // Three GPUs exist, but not three of one model.
  EXPECT_FALSE(placer.Place(cluster_, MakePod("three", {Whole(), Whole(), Whole()}), rng_).ok());
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<Placement> two = placer.Place(cluster_, MakePod("two", {Whole(), Whole()}), rng_);
    ASSERT_TRUE(two.ok());
    const auto& v = two->containers[0].vgpus;
    EXPECT_EQ(mixed.gpus[static_cast<size_t>(v[0].gpu_index)].model,
              mixed.gpus[static_cast<size_t>(v[1].gpu_index)].model);
  }
}

TEST_F(PlacerTest, UuidConstraints) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 4)).ok());
  Placer placer = MakePlacer("spread");
  PodRequest only2 = MakePod("p", {Share(10)});
  only2.uuid_include = {GpuUuid("GPU-a-2")};
  EXPECT_EQ(placer.Place(cluster_, only2, rng_)->containers[0].vgpus[0].gpu_index, 2);
  PodRequest not0to2 = MakePod("q", {Share(10)});
  not0to2.uuid_exclude = {GpuUuid("GPU-a-0"), GpuUuid("GPU-a-1"), GpuUuid("GPU-a-2")};
  EXPECT_EQ(placer.Place(cluster_, not0to2, rng_)->containers[0].vgpus[0].gpu_index, 3);
  PodRequest elsewhere = MakePod("r", {Share(10)});
  elsewhere.uuid_include = {GpuUuid("GPU-b-0")};
  absl::StatusOr<Placement> none = placer.Place(cluster_, elsewhere, rng_);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("gpu-uuid"));
}

TEST_F(PlacerTest, UnhealthyGpusAndUnschedulableNodesGetNothing) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 2)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("b", 2)).ok());
  ASSERT_TRUE(cluster_.SetGpuHealth(NodeName("a"), GpuUuid("GPU-a-0"), GpuHealth::kUnhealthy).ok());
  ASSERT_TRUE(cluster_.SetSchedulable(NodeName("b"), false).ok());
  Placer placer = MakePlacer("binpack");
  for (int i = 0; i < 10; ++i) {
    absl::StatusOr<Placement> p = placer.Place(cluster_, MakePod("p", {Share(10)}), rng_);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(p->node, NodeName("a"));
    EXPECT_EQ(p->containers[0].vgpus[0].gpu_index, 1);
  }
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("b")), MakePod("p", {Share(10)}));
  EXPECT_THAT(e.message, HasSubstr("node b: takes no new pods"));
}

TEST_F(PlacerTest, HostCpuAndMemoryCount) {
  NodeInfo small = MakeNode("small", 1);
  small.cpu = MilliCpu(2000);
  NodeInfo big = MakeNode("big", 1);
  big.cpu = MilliCpu(64000);
  ASSERT_TRUE(cluster_.AddNode(small).ok());
  ASSERT_TRUE(cluster_.AddNode(big).ok());
  Placer placer = MakePlacer("binpack");
  PodRequest p = MakePod("p", {Share(10)});
  p.cpu = MilliCpu(4000);
  EXPECT_EQ(placer.Place(cluster_, p, rng_)->node, NodeName("big"));
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("small")), p);
  EXPECT_EQ(e.message, "node small: 2000 millicores of CPU free, 4000 needed");
  EXPECT_TRUE(e.unresolvable);  // the node has only 2000 in all
}

TEST_F(PlacerTest, ExplainsWhatAGpuLacks) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 4, MiB(16384))).ok());
  for (int g = 0; g < 3; ++g) Occupy("a", g, 1000, 16384, StrCat("full", g));
  Occupy("a", 3, 500, 14336, "half");
  Placer placer = MakePlacer("gaia");
  PodRequest pod = MakePod("p", {Share(30, 4096)});
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("a")), pod);
  EXPECT_EQ(
      e.message,
      "node a: container main needs a GPU with 30% and 4096 MiB free; no GPU has room; GPU 3 has 2048 MiB "
      "free, 4096 needed");
  EXPECT_FALSE(e.unresolvable);  // preempting tenants would help

  PodRequest huge = MakePod("h", {Share(30, 20000)});
  Explanation h = placer.Explain(cluster_, *cluster_.FindNode(NodeName("a")), huge);
  EXPECT_TRUE(h.unresolvable);  // no GPU here has 20000 MiB at all
  EXPECT_THAT(h.message, HasSubstr("16384 MiB in all, 20000 needed"));

  PodRequest whole = MakePod("w", {Whole(), Whole()});
  Explanation w = placer.Explain(cluster_, *cluster_.FindNode(NodeName("a")), whole);
  EXPECT_THAT(
      w.message,
      HasSubstr("container main needs 2 whole GPUs; no GPU is wholly free; GPU 3 is shared (50% in use)"));

  absl::StatusOr<Placement> refused = placer.Place(cluster_, pod, rng_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("pod default/p fits on none of 1 nodes: node a:"));
}

TEST_F(PlacerTest, EvaluateAgreesWithExplain) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 2, MiB(16384))).ok());
  Occupy("a", 0, 900, 1000, "x");
  Placer placer = MakePlacer("gaia");
  const NodeState& a = *cluster_.FindNode(NodeName("a"));
  NodeFit fits = placer.Evaluate(cluster_, a, MakePod("p", {Share(50)}), rng_);
  EXPECT_TRUE(fits.fits());
  EXPECT_EQ(placer.Explain(cluster_, a, MakePod("p", {Share(50)})).message, "node a: fits");
  NodeFit no = placer.Evaluate(cluster_, a, MakePod("p", {Share(50), Share(50)}), rng_);
  EXPECT_EQ(no.reject, RejectCode::kGpuCapacity);
}

TEST_F(PlacerTest, NumaBinding) {
  absl::StatusOr<TopoReport> topo = ParseNvidiaSmiTopo(ReadTestData("topo/two-socket-8gpu.txt"));
  ASSERT_TRUE(topo.ok());
  NodeInfo n = MakeNode("two-socket", 8, MiB(32768), "V100");
  n.links = topo->links;
  for (int g = 0; g < 8; ++g) n.gpus[static_cast<size_t>(g)].numa_node = g < 4 ? 0 : 1;
  n.numa_cpus = {{0, "0-9,20-29"}, {1, "10-19,30-39"}};
  ASSERT_TRUE(cluster_.AddNode(n).ok());
  Occupy("two-socket", 0, 1000, 32768, "busy");
  Placer placer = MakePlacer("gaia");
  PodRequest four = MakePod("four", {Whole(), Whole(), Whole(), Whole()});
  four.numa_bind = true;
  absl::StatusOr<Placement> p = placer.Place(cluster_, four, rng_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->containers[0].numa_node, 1);
  EXPECT_EQ(p->containers[0].cpus, "10-19,30-39");
  for (const VGpuAssignment& v : p->containers[0].vgpus) EXPECT_GE(v.gpu_index, 4);
  // Three on socket 0 fit the NUMA node with less room (best fit).
  PodRequest three = MakePod("three", {Whole(), Whole(), Whole()});
  three.numa_bind = true;
  EXPECT_EQ(placer.Place(cluster_, three, rng_)->containers[0].numa_node, 0);
  // Five fit the node but no NUMA node.
  PodRequest five = MakePod("five", {Whole(), Whole(), Whole(), Whole(), Whole()});
  five.numa_bind = true;
  EXPECT_EQ(placer.Evaluate(cluster_, *cluster_.FindNode(NodeName("two-socket")), five, rng_).reject,
            RejectCode::kNuma);
  EXPECT_THAT(placer.Explain(cluster_, *cluster_.FindNode(NodeName("two-socket")), five).message,
              HasSubstr("only across NUMA nodes"));
  five.numa_bind = false;
  EXPECT_TRUE(placer.Place(cluster_, five, rng_).ok());
}

TEST_F(PlacerTest, NamespaceQuotaPerModel) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("t4", 4, MiB(15360), "T4")).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("v100", 4, MiB(32768), "V100")).ok());
  cluster_.SetQuota(Namespace("team"), "T4", MilliGpu(1500));
  Placer placer = MakePlacer("binpack");
  PodRequest a = MakePod("a", {Whole()}, "team");
  a.model_include = {"T4"};
  ASSERT_TRUE(Place(placer, a).ok());
  PodRequest b = MakePod("b", {Whole()}, "team");
  b.model_include = {"T4"};
  absl::StatusOr<Placement> over = Place(placer, b);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("namespace team holds 1 of its 1.5 T4 GPUs (quota) and the pod needs 1 more"));
  PodRequest half = MakePod("c", {Share(50)}, "team");
  half.model_include = {"T4"};
  EXPECT_TRUE(Place(placer, half).ok());
  // Without a model constraint the pod goes where the quota allows; other namespaces are not limited.
  EXPECT_EQ(Place(placer, MakePod("d", {Whole()}, "team"))->node, NodeName("v100"));
  PodRequest other = MakePod("e", {Whole()}, "other");
  other.model_include = {"T4"};
  EXPECT_TRUE(Place(placer, other).ok());
}

TEST_F(PlacerTest, BinpackAndSpreadChooseOppositeNodes) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("busy", 2)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("idle", 2)).ok());
  Occupy("busy", 0, 500, 8192, "x");
  Placer binpack = MakePlacer("binpack");
  Placer spread = MakePlacer("spread");
  absl::StatusOr<Placement> b = binpack.Place(cluster_, MakePod("p", {Share(20)}), rng_);
  EXPECT_EQ(b->node, NodeName("busy"));
  EXPECT_EQ(b->containers[0].vgpus[0].gpu_index, 0);  // best fit on the node too
  EXPECT_EQ(spread.Place(cluster_, MakePod("p", {Share(20)}), rng_)->node, NodeName("idle"));
}

TEST_F(PlacerTest, ContainersOfOnePodShareTheNode) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("one", 1)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("two", 2)).ok());
  PodRequest pod = MakePod("p", {Share(60)});
  pod.containers.push_back({"sidecar", {Share(60)}});
  Placer placer = MakePlacer("binpack");
  absl::StatusOr<Placement> p = Place(placer, pod);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->node, NodeName("two"));
  EXPECT_NE(p->containers[0].vgpus[0].gpu_index, p->containers[1].vgpus[0].gpu_index);
}

TEST_F(PlacerTest, MemoryLimitsAsMaterialized) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 1, MiB(16000))).ok());
  Placer placer = MakePlacer("gaia");
  // Memory left out: in proportion to the share.
  EXPECT_EQ(placer.Place(cluster_, MakePod("p", {Share(25)}), rng_)->containers[0].vgpus[0].memory.value(),
            4000);
  // Or the whole GPU's memory, by configuration.
  PlacementOptions whole;
  whole.default_memory = PlacementOptions::DefaultMemory::kWholeGpuMemory;
  Placer placer2 = MakePlacer("gaia", whole);
  EXPECT_EQ(placer2.Place(cluster_, MakePod("p", {Share(25)}), rng_)->containers[0].vgpus[0].memory.value(),
            16000);
  // Memory only: the share follows the memory.
  VGpuDemand mem_only{MilliGpu(0), {MemorySpec::Kind::kMiB, 4000}};
  absl::StatusOr<Placement> m = placer.Place(cluster_, MakePod("m", {mem_only}), rng_);
  EXPECT_EQ(m->containers[0].vgpus[0].cores.value(), 250);
}

TEST_F(PlacerTest, ContainersMayShareOneGpu) {
  // Only the vGPUs of one container need distinct GPUs: two containers of 30% fit on one GPU.
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 1)).ok());
  PodRequest pod = MakePod("p", {Share(30)});
  pod.containers.push_back({"c2", {Share(30)}});
  for (const char* policy : {"gaia", "binpack", "spread", "gpushare"}) {
    Placer placer = MakePlacer(policy);
    absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng_);
    ASSERT_TRUE(p.ok()) << policy << ": " << p.status();
    EXPECT_EQ(p->containers[1].vgpus[0].gpu_index, 0);
  }
}

TEST_F(PlacerTest, ExplainsTwoAndAHalfGpus) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 4, MiB(16384))).ok());
  for (int g = 0; g < 3; ++g) Occupy("a", g, 300, 1000, StrCat("t", g));
  Placer placer = MakePlacer("gaia");
  PodRequest pod = MakePod("p", {Whole(), Whole(), Share(50)});
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("a")), pod);
  EXPECT_EQ(
      e.message,
      "node a: container main needs 2 whole GPUs and another GPU with 50% and 8192 MiB free; only 1 wholly "
      "free (GPU 3); GPU 0 is shared (30% in use); a whole GPU is needed");
  EXPECT_FALSE(e.unresolvable);
}

TEST_F(PlacerTest, ExplainsAGpuHeldWholeAsFullyInUseNotShared) {
  // GPU 0 is one tenant's whole GPU: "shared (100% in use)" would tell the operator the wrong story.
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 1, MiB(16384))).ok());
  Occupy("a", 0, 1000, 16384, "whole");
  Placer placer = MakePlacer("gaia");
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("a")), MakePod("p", {Whole()}));
  EXPECT_THAT(e.message, HasSubstr("GPU 0 is fully in use; a whole GPU is needed"));
  EXPECT_THAT(e.message, Not(HasSubstr("is shared (100%")));
}

TEST_F(PlacerTest, ExplainSkipsModelsThePodCannotUse) {
  NodeInfo mixed = MakeNode("m", 3, MiB(16384), "T4");
  mixed.gpus[2].model = "A100";
  ASSERT_TRUE(cluster_.AddNode(mixed).ok());
  Occupy("m", 2, 1000, 16384, "busy");
  Placer placer = MakePlacer("gaia");
  PodRequest pod = MakePod("p", {Share(50)});
  pod.uuid_include = {GpuUuid("GPU-m-2")};
  Explanation e = placer.Explain(cluster_, *cluster_.FindNode(NodeName("m")), pod);
  EXPECT_EQ(e.message,
            "node m: container main needs a GPU with 50% and 8192 MiB free; no GPU has room; GPU 2 has 0% "
            "compute free, 50% needed and 0 MiB free, 8192 needed");
}

TEST_F(PlacerTest, NumaIdsAboveAByte) {
  NodeInfo n = MakeNode("big-numa", 2);
  n.gpus[0].numa_node = 200;
  n.gpus[1].numa_node = 201;
  n.numa_cpus = {{200, "0-3"}, {201, "4-7"}};
  ASSERT_TRUE(cluster_.AddNode(n).ok());
  Placer placer = MakePlacer("gaia");
  PodRequest pod = MakePod("p", {Share(10)});
  pod.numa_bind = true;
  absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng_);
  ASSERT_TRUE(p.ok());
  EXPECT_GE(p->containers[0].numa_node, 200);
  EXPECT_FALSE(p->containers[0].cpus.empty());
}

TEST_F(PlacerTest, GaiaFragmentWithGpusOfDifferentSizes) {
  // One model, two sizes: a memory-only share is a different fraction of each GPU.
  NodeInfo n = MakeNode("sizes", 2, MiB(16384));
  n.gpus[1].memory = MiB(32768);
  ASSERT_TRUE(cluster_.AddNode(n).ok());
  Occupy("sizes", 0, 500, 8192, "x");   // GPU0: 50% and 8 GiB free
  Occupy("sizes", 1, 740, 24248, "y");  // GPU1: 26% and 8520 MiB free
  Placer placer = MakePlacer("gaia");
  VGpuDemand mem_only{MilliGpu(0), {MemorySpec::Kind::kMiB, 8192}};  // 50% of GPU0, 25% of GPU1
  absl::StatusOr<Placement> p = placer.Place(cluster_, MakePod("p", {mem_only}), rng_);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->containers[0].vgpus[0].gpu_index, 1);  // the best-fitting fragment
}

TEST_F(PlacerTest, CandidatesLimitTheSearch) {
  ASSERT_TRUE(cluster_.AddNode(MakeNode("a", 1)).ok());
  ASSERT_TRUE(cluster_.AddNode(MakeNode("b", 1)).ok());
  Placer placer = MakePlacer("spread");
  std::vector<NodeName> only_b = {NodeName("b")};
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(placer.Place(cluster_, MakePod("p", {Share(10)}), rng_, only_b)->node, NodeName("b"));
}

TEST_F(PlacerTest, PodsWithoutGpusAreFitByCpu) {
  NodeInfo a = MakeNode("a", 1);
  a.cpu = MilliCpu(1000);
  ASSERT_TRUE(cluster_.AddNode(a).ok());
  PodRequest cpu_only;
  cpu_only.uid = PodUid("c");
  cpu_only.name = "c";
  cpu_only.cpu = MilliCpu(800);
  Placer placer = MakePlacer("binpack");
  ASSERT_TRUE(Place(placer, cpu_only).ok());
  cpu_only.uid = PodUid("d");
  EXPECT_FALSE(placer.Place(cluster_, cpu_only, rng_).ok());
}

}  // namespace
}  // namespace tessera::core
