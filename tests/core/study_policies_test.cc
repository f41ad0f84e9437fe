// The FGD study's baselines score nodes as its simulator does (pkg/simulator/plugin/*_score.go of
// hkust-adsl/kubernetes-scheduler-simulator, read for the formulas), checked on small cases worked by hand.
#include <gtest/gtest.h>

#include <set>

#include "core/placement/evaluation_cache.h"
#include "core/placement/placer.h"
#include "core/strings.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Milli;
using ::tessera::testing::PlacementOn;

class StudyPoliciesTest : public ::testing::Test {
 protected:
  void AddNode(const std::string& name, int gpus, int64_t cpu = 96000) {
    NodeInfo n = MakeNode(name, gpus, MiB(16384), "G2");
    n.cpu = MilliCpu(cpu);
    n.memory = MiB(393216);
    ASSERT_TRUE(cluster_.AddNode(n).ok());
  }
  void Hold(const std::string& node, int gpu, int milli, const std::string& uid, int gpus = 1) {
    PodRequest p = MakePod(uid, std::vector<VGpuDemand>(static_cast<size_t>(gpus), Milli(milli)));
    std::vector<VGpuAssignment> v;
    for (int i = 0; i < gpus; ++i) v.push_back({gpu + i, GpuUuid(), MilliGpu(milli), MiB(100)});
    ASSERT_TRUE(cluster_.Commit(p, PlacementOn(node, v)).ok());
  }
  double Score(const std::string& policy, const std::string& node, const PodRequest& pod) {
    std::unique_ptr<Policy> p = *MakePolicy(policy, MakePolicyContext(cluster_, {}));
    Placer placer(*p);
    Rng rng(1);
    NodeFit fit = placer.Evaluate(cluster_, *cluster_.FindNode(NodeName(node)), pod, rng);
    EXPECT_TRUE(fit.fits());
    return fit.score;
  }
  Cluster cluster_;
};

TEST_F(StudyPoliciesTest, PackingCases) {
  AddNode("idle", 8);
  AddNode("partly", 8);
  Hold("partly", 0, 700, "a");  // GPU0 has 300 free
  Hold("partly", 1, 1000, "b");
  // An idle node: max(33 - free GPUs, free GPUs) = 25 for 8 GPUs.
  EXPECT_EQ(Score("packing", "idle", MakePod("p", {Milli(200)})), 25);
  // A share onto a partly used GPU with 300 free: 100 - 300 / 100 = 97.
  EXPECT_EQ(Score("packing", "partly", MakePod("p", {Milli(200)})), 97);
  // A share that needs a whole free GPU on a used node: max(50 - 1, 33) = 49.
  EXPECT_EQ(Score("packing", "partly", MakePod("p", {Milli(500)})), 49);
}

TEST_F(StudyPoliciesTest, ClusteringPrefersNodesOfTheSameShape) {
  AddNode("shares", 8);
  AddNode("mixed", 8);
  AddNode("empty", 8);
  Hold("shares", 0, 500, "s");
  Hold("mixed", 0, 500, "m1");
  Hold("mixed", 2, 1000, "m2", 2);
  const PodRequest share = MakePod("p", {Milli(300)});
  // base = 25 * (8000 - free) / 8000 (integer); +75 only this shape, +50 this and others, +25 no GPU pod.
  EXPECT_EQ(Score("clustering", "shares", share), 1 + 75);
  EXPECT_EQ(Score("clustering", "mixed", share), 7 + 50);
  EXPECT_EQ(Score("clustering", "empty", share), 0 + 25);
}

TEST_F(StudyPoliciesTest, BestFitAndDotProduct) {
  AddNode("n", 8, 128000);
  Hold("n", 0, 1000, "a");
  PodRequest p = MakePod("p", {Milli(500)});
  p.cpu = MilliCpu(16000);
  // Best fit: int(100 * (1 - (0.5 * (128000 - 16000) / 128000 + 0.5 * (7000 - 500) / 8000))) = 15.
  EXPECT_EQ(Score("bestfit", "n", p), 15);
  // Dot product: int(100 * (1 - (128000 * 16000 / 128000^2 + 7000 * 500 / 8000^2) / 2)) = 91.
  EXPECT_EQ(Score("dotprod", "n", p), 91);
}

TEST_F(StudyPoliciesTest, StudyGpuChoiceIsBestFitLowestIndex) {
  AddNode("n", 4);
  Hold("n", 1, 600, "a");
  Hold("n", 3, 600, "b");
  std::unique_ptr<Policy> packing = *MakePolicy("packing");
  Placer placer(*packing);
  Rng rng(1);
  absl::StatusOr<Placement> p = placer.Place(cluster_, MakePod("p", {Milli(300)}), rng);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->containers[0].vgpus[0].gpu_index, 1);  // least free (400) that fits; GPU 3 ties, index 1 first
  absl::StatusOr<Placement> whole = placer.Place(cluster_, MakePod("w", {Milli(1000), Milli(1000)}), rng);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->containers[0].vgpus[0].gpu_index, 0);  // the first free GPUs by index
  EXPECT_EQ(whole->containers[0].vgpus[1].gpu_index, 2);
}

// A pod's CPU changes fragmentation once, however many containers it has: tessera's cost for two containers
// of 0.6 GPU equals its cost for one container of two 0.6 GPUs. (Shares of 0.6, so that both pods leave the
// same gaps: two containers of half a GPU may share one GPU, which leaves no gap and costs less.)
TEST_F(StudyPoliciesTest, ContainersCountThePodsCpuOnce) {
  NodeInfo n = MakeNode("n", 4, MiB(16384), "T4");
  n.cpu = MilliCpu(16000);
  ASSERT_TRUE(cluster_.AddNode(n).ok());
  std::vector<PodRequest> workload;
  for (int i = 0; i < 10; ++i) {
    PodRequest w = MakePod(StrCat("w", i), {Milli(1000)});
    w.cpu = MilliCpu(8000);
    workload.push_back(w);
  }
  std::unique_ptr<Policy> tessera = *MakePolicy("tessera", MakePolicyContext(cluster_, workload));
  Placer placer(*tessera);
  Rng rng(1);
  PodRequest one = MakePod("one", {Milli(600), Milli(600)});
  one.cpu = MilliCpu(10000);
  PodRequest two = MakePod("two", {Milli(600)});
  two.containers.push_back({"second", {Milli(600)}});
  two.cpu = MilliCpu(10000);
  const NodeState& node = *cluster_.FindNode(NodeName("n"));
  const double a = placer.Evaluate(cluster_, node, one, rng).choice.selection_cost;
  const double b = placer.Evaluate(cluster_, node, two, rng).choice.selection_cost;
  EXPECT_DOUBLE_EQ(a, b);
  EXPECT_GT(a, 0);
}

TEST_F(StudyPoliciesTest, FragmentationPoliciesNeedTheWorkload) {
  absl::StatusOr<std::unique_ptr<Policy>> fgd = MakePolicy("fgd");
  ASSERT_FALSE(fgd.ok());
  EXPECT_NE(std::string(fgd.status().message()).find("MakePolicyContext"), std::string::npos);
  EXPECT_TRUE(MakePolicy("tessera", MakePolicyContext(cluster_, {})).ok());
}

// The cache must never change a decision: the same pods placed with and without it land alike.
TEST_F(StudyPoliciesTest, EvaluationCacheChangesNothing) {
  for (int i = 0; i < 6; ++i) AddNode(StrCat("n", i), 1 + i % 4, 32000 + 8000 * i);
  Rng gen(3);
  std::vector<PodRequest> pods;
  for (int i = 0; i < 300; ++i) {
    PodRequest p = MakePod(
        StrCat("p", i), {Milli(gen.Uniform(3) == 0 ? 1000 : 100 * (1 + static_cast<int>(gen.Uniform(9))))});
    p.cpu = MilliCpu(1000 * (1 + gen.Uniform(8)));
    pods.push_back(p);
  }
  const PolicyContext context = MakePolicyContext(cluster_, pods);
  std::vector<uint32_t> rank = {5, 3, 1, 0, 2, 4};
  for (const char* name : {"fgd", "tessera", "packing", "bestfit", "clustering", "dotprod"}) {
    Cluster with = cluster_;
    Cluster without = cluster_;
    std::unique_ptr<Policy> a = *MakePolicy(name, context);
    std::unique_ptr<Policy> b = *MakePolicy(name, context);
    Placer pa(*a);
    Placer pb(*b);
    EvaluationCache cache;
    Rng ra(1);
    Rng rb(1);
    for (const PodRequest& pod : pods) {
      absl::StatusOr<Placement> x = pa.Place(with, pod, ra, {}, rank, &cache);
      absl::StatusOr<Placement> y = pb.Place(without, pod, rb, {}, rank);
      ASSERT_EQ(x.ok(), y.ok()) << name << " " << pod.name;
      if (!x.ok()) continue;
      ASSERT_EQ(*x, *y) << name << " " << pod.name;
      ASSERT_TRUE(with.Commit(pod, *x).ok());
      ASSERT_TRUE(without.Commit(pod, *y).ok());
    }
  }
}

// Tessera places whole GPUs by Gaia's access-cost tree, on a box of two PIX pairs (0-1, 2-3) joined at PXB
// with one GPU partly used. Taking the lowest free indices would split a pair in both cases below.
class TesseraTopologyTest : public ::testing::Test {
 protected:
  void Use(int gpu) {
    NodeInfo n = MakeNode("pcie", 4, MiB(16384), "T4", Link::Of(LinkKind::kPxb));
    n.links.Set(0, 1, Link::Of(LinkKind::kPix));
    n.links.Set(2, 3, Link::Of(LinkKind::kPix));
    ASSERT_TRUE(cluster_.AddNode(n).ok());
    ASSERT_TRUE(cluster_
                    .Commit(MakePod("share", {Milli(300)}),
                            PlacementOn("pcie", {{gpu, GpuUuid(), MilliGpu(300), MiB(100)}}))
                    .ok());
    const std::vector<PodRequest> workload = {MakePod("w1", {Milli(300)}), MakePod("w2", {Milli(1000)})};
    policy_ = *MakePolicy("tessera", MakePolicyContext(cluster_, workload));
  }
  std::vector<int> Gpus(const PodRequest& pod) {
    Placer placer(*policy_);
    Rng rng(7);
    absl::StatusOr<Placement> p = placer.Place(cluster_, pod, rng);
    EXPECT_TRUE(p.ok()) << p.status();
    std::vector<int> out;
    for (const VGpuAssignment& v : p->containers[0].vgpus) out.push_back(v.gpu_index);
    std::sort(out.begin(), out.end());
    return out;
  }
  Cluster cluster_;
  std::unique_ptr<Policy> policy_;
};

// GPU 1 used: two whole GPUs take the intact pair 2-3 (Link), not 0 and 2.
TEST_F(TesseraTopologyTest, TwoWholeGpusTakeTheIntactPair) {
  Use(1);
  EXPECT_EQ(Gpus(MakePod("two", {Milli(1000), Milli(1000)})), (std::vector<int>{2, 3}));
}

// GPU 3 used: one whole GPU takes its sibling 2, so that the pair 0-1 stays whole (Singular), not GPU 0.
TEST_F(TesseraTopologyTest, OneWholeGpuKeepsThePairIntact) {
  Use(3);
  EXPECT_EQ(Gpus(MakePod("one", {Milli(1000)})), (std::vector<int>{2}));
}

// Across nodes: of two nodes where two whole GPUs fit alike, the one whose free pair is nearer wins.
TEST(TesseraTopologyAcrossNodes, NearerGroupWins) {
  Cluster cluster;
  NodeInfo far = MakeNode("far", 2, MiB(16384), "T4", Link::Of(LinkKind::kSys));
  NodeInfo near = MakeNode("near", 2, MiB(16384), "T4", Link::NvLink(4));
  ASSERT_TRUE(cluster.AddNode(far).ok());
  ASSERT_TRUE(cluster.AddNode(near).ok());
  const std::vector<PodRequest> workload = {MakePod("w", {Milli(1000), Milli(1000)})};
  std::unique_ptr<Policy> policy = *MakePolicy("tessera", MakePolicyContext(cluster, workload));
  Placer placer(*policy);
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    Rng rng(seed);
    absl::StatusOr<Placement> p = placer.Place(cluster, MakePod("two", {Milli(1000), Milli(1000)}), rng);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->node.value(), "near") << "seed " << seed;
  }
}

// Tessera's model pressure reads the whole cluster (Policy::Observe) and changes as models fill; the cache
// must still never change a decision. Random clusters of two models, a third of the GPU pods bound to one.
TEST(TesseraModelPressure, EvaluationCacheChangesNothing) {
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    Rng gen(seed);
    Cluster cluster;
    for (int i = 0; i < 8; ++i) {
      NodeInfo n = MakeNode(StrCat("n", i), 1 + static_cast<int>(gen.Uniform(8)), MiB(16384),
                            gen.Uniform(2) == 0 ? "T4" : "G2");
      n.cpu = MilliCpu(16000 + 8000 * static_cast<int64_t>(gen.Uniform(8)));
      n.memory = MiB(262144);
      ASSERT_TRUE(cluster.AddNode(n).ok());
    }
    std::vector<PodRequest> pods;
    for (int i = 0; i < 200; ++i) {
      PodRequest p = MakePod(
          StrCat("p", i), {Milli(gen.Uniform(3) == 0 ? 1000 : 100 * (1 + static_cast<int>(gen.Uniform(9))))});
      p.cpu = MilliCpu(1000 * (1 + gen.Uniform(8)));
      if (gen.Uniform(3) == 0) p.model_include = {gen.Uniform(2) == 0 ? "T4" : "G2"};
      pods.push_back(p);
    }
    const PolicyContext context = MakePolicyContext(cluster, pods);
    std::vector<uint32_t> rank(8);
    for (uint32_t i = 0; i < 8; ++i) rank[i] = (i * 5) % 8;
    Cluster with = cluster;
    Cluster without = cluster;
    std::unique_ptr<Policy> a = *MakePolicy("tessera", context);
    std::unique_ptr<Policy> b = *MakePolicy("tessera", context);
    Placer pa(*a);
    Placer pb(*b);
    EvaluationCache cache;
    Rng ra(1);
    Rng rb(1);
    std::set<uint64_t> keys;
    for (const PodRequest& pod : pods) {
      absl::StatusOr<Placement> x = pa.Place(with, pod, ra, {}, rank, &cache);
      absl::StatusOr<Placement> y = pb.Place(without, pod, rb, {}, rank);
      keys.insert(a->state_key());
      ASSERT_EQ(x.ok(), y.ok()) << "seed " << seed << " " << pod.name;
      if (!x.ok()) continue;
      ASSERT_EQ(*x, *y) << "seed " << seed << " " << pod.name;
      ASSERT_TRUE(with.Commit(pod, *x).ok());
      ASSERT_TRUE(without.Commit(pod, *y).ok());
    }
    EXPECT_GT(keys.size(), 1u) << "the pressure never changed: the test checks nothing";
  }
}

// Of two nodes alike but for their model, a pod that may use either goes to the model that pods bound to a
// model need less, where FGD's measure sees no difference (the bound pod is too rare to be a typical pod),
// and once that model is full, to the other.
TEST(TesseraModelPressure, UnboundPodsLeaveTheNeededModel) {
  Cluster cluster;
  for (const char* model : {"T4", "G2"}) {
    NodeInfo n = MakeNode(StrCat("node-", model), 4, MiB(16384), model);
    n.cpu = MilliCpu(64000);
    n.memory = MiB(262144);
    ASSERT_TRUE(cluster.AddNode(n).ok());
  }
  // 20 pods of one whole GPU, any model; one of four GPUs bound to T4 (a sixth of the GPU asked).
  std::vector<PodRequest> workload;
  for (int i = 0; i < 20; ++i) workload.push_back(MakePod(StrCat("u", i), {Milli(1000)}));
  PodRequest bound = MakePod("bound", {Milli(1000), Milli(1000), Milli(1000), Milli(1000)});
  bound.model_include = {"T4"};
  workload.push_back(bound);
  std::unique_ptr<Policy> policy = *MakePolicy("tessera", MakePolicyContext(cluster, workload));
  Placer placer(*policy);
  Rng rng(1);
  const std::vector<uint32_t> rank = {0, 1};  // ties would go to node-T4
  for (int i = 0; i < 5; ++i) {
    PodRequest pod = MakePod(StrCat("free", i), {Milli(1000)});
    absl::StatusOr<Placement> p = placer.Place(cluster, pod, rng, {}, rank);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->node.value(), i < 4 ? "node-G2" : "node-T4") << "pod " << i;
    ASSERT_TRUE(cluster.Commit(pod, *p).ok());
  }
}

}  // namespace
}  // namespace tessera::core
