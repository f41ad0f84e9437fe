// The evaluation cache's per-shape index of the best node (RankedIndex) must choose exactly what the Placer's
// scan of every node chooses under the same node ranking, whatever happens to the cluster between pods.
#include <gtest/gtest.h>

#include <algorithm>

#include "core/placement/evaluation_cache.h"
#include "core/placement/placer.h"
#include "core/strings.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Milli;

NodeInfo RandomNode(Rng& gen, int id) {
  NodeInfo n = MakeNode(StrCat("n", id), 1 + static_cast<int>(gen.Uniform(8)), MiB(16384),
                        gen.Uniform(2) == 0 ? "T4" : "G2");
  n.cpu = MilliCpu(16000 + 8000 * static_cast<int64_t>(gen.Uniform(8)));
  n.memory = MiB(65536 + 32768 * static_cast<int64_t>(gen.Uniform(4)));
  return n;
}

// Most pods of a few common shapes, the others of many (CPU in 1..60 cores, memory, shares, whole GPUs,
// bound models): the common shapes find their index again and again, the rare ones make more keys than the
// index keeps, so that shapes are forgotten and rebuilt too.
PodRequest RandomPod(Rng& gen, int id) {
  const bool common = gen.Uniform(5) != 0;
  std::vector<VGpuDemand> vgpus;
  const uint32_t kind = gen.Uniform(4);
  if (kind == 0) {
    vgpus.assign(1 + gen.Uniform(2), Milli(1000));
  } else {
    vgpus.push_back(
        Milli(common ? 250 * static_cast<int>(kind) : 100 * (1 + static_cast<int>(gen.Uniform(9)))));
  }
  PodRequest p = MakePod(StrCat("p", id), vgpus);
  p.cpu = MilliCpu(common ? 4000 : 1000 * (1 + gen.Uniform(60)));
  p.memory = MiB(common ? 8192 : 1024 * (1 + gen.Uniform(16)));
  if (!common && gen.Uniform(2) == 0) p.model_include = {gen.Uniform(2) == 0 ? "T4" : "G2"};
  return p;
}

std::vector<uint32_t> Shuffled(Rng& gen, size_t n) {
  std::vector<uint32_t> rank(n);
  for (uint32_t i = 0; i < n; ++i) rank[i] = i;
  for (size_t i = n; i > 1; --i) std::swap(rank[i - 1], rank[gen.Uniform(static_cast<uint32_t>(i))]);
  return rank;
}

// Random clusters under churn: pods placed and released, GPUs failing and recovering, nodes cordoned, added
// and removed (which moves another node to the removed one's position), the ranking redrawn. Each step is
// applied to two copies of the cluster; the pods are placed through the index on one and by the plain scan
// on the other, and must land alike.
TEST(RankedIndexTest, ChoosesWhatTheScanChoosesUnderChurn) {
  for (const char* policy_name : {"tessera", "fgd", "bestfit", "packing", "dotprod"}) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(StrCat(policy_name, " seed ", seed));
      Rng gen(seed);
      Cluster with;
      int next_node = 0;
      for (; next_node < 14; ++next_node) ASSERT_TRUE(with.AddNode(RandomNode(gen, next_node)).ok());
      std::vector<PodRequest> workload;
      for (int i = 0; i < 200; ++i) workload.push_back(RandomPod(gen, 100000 + i));
      const PolicyContext context = MakePolicyContext(with, workload);
      Cluster without = with;
      std::unique_ptr<Policy> a = *MakePolicy(policy_name, context);
      std::unique_ptr<Policy> b = *MakePolicy(policy_name, context);
      Placer pa(*a);
      Placer pb(*b);
      EvaluationCache cache;
      Rng ra(1);
      Rng rb(1);
      std::vector<uint32_t> rank = Shuffled(gen, static_cast<size_t>(with.node_count()));
      std::vector<PodRequest> placed;
      int removals = 0;
      int placements = 0;
      for (int step = 0; step < 700; ++step) {
        const uint32_t op = gen.Uniform(100);
        if (op < 60 || placed.empty()) {
          PodRequest pod = RandomPod(gen, step);
          absl::StatusOr<Placement> x = pa.Place(with, pod, ra, {}, rank, &cache);
          absl::StatusOr<Placement> y = pb.Place(without, pod, rb, {}, rank);
          ASSERT_EQ(x.ok(), y.ok()) << "step " << step;
          if (!x.ok()) continue;
          ASSERT_EQ(*x, *y) << "step " << step;
          ASSERT_TRUE(with.Commit(pod, *x).ok());
          ASSERT_TRUE(without.Commit(pod, *y).ok());
          placed.push_back(pod);
          ++placements;
        } else if (op < 85) {
          const size_t i = gen.Uniform(static_cast<uint32_t>(placed.size()));
          ASSERT_TRUE(with.Release(placed[i].uid).ok());
          ASSERT_TRUE(without.Release(placed[i].uid).ok());
          placed.erase(placed.begin() + static_cast<std::ptrdiff_t>(i));
        } else if (op < 95) {
          const NodeState& n = with.nodes()[gen.Uniform(static_cast<uint32_t>(with.node_count()))];
          const GpuUuid gpu = n.gpu(static_cast<int>(gen.Uniform(static_cast<uint32_t>(n.gpu_count())))).uuid;
          const GpuHealth health = gen.Uniform(2) == 0 ? GpuHealth::kUnhealthy : GpuHealth::kHealthy;
          const NodeName name = n.name();
          ASSERT_TRUE(with.SetGpuHealth(name, gpu, health).ok());
          ASSERT_TRUE(without.SetGpuHealth(name, gpu, health).ok());
        } else if (op < 93) {
          const NodeName name = with.nodes()[gen.Uniform(static_cast<uint32_t>(with.node_count()))].name();
          const bool schedulable = gen.Uniform(2) == 0;
          ASSERT_TRUE(with.SetSchedulable(name, schedulable).ok());
          ASSERT_TRUE(without.SetSchedulable(name, schedulable).ok());
        } else if (op < 95) {
          const NodeInfo n = RandomNode(gen, next_node++);
          ASSERT_TRUE(with.AddNode(n).ok());
          ASSERT_TRUE(without.AddNode(n).ok());
          rank = Shuffled(gen, static_cast<size_t>(with.node_count()));
        } else if (op < 98) {
          // A node other than the last, its pods released first, so that the last moves into its place.
          const int i = static_cast<int>(gen.Uniform(static_cast<uint32_t>(with.node_count() - 1)));
          const NodeName name = with.nodes()[static_cast<size_t>(i)].name();
          for (size_t k = placed.size(); k-- > 0;) {
            if (with.FindPlacement(placed[k].uid)->node != name) continue;
            ASSERT_TRUE(with.Release(placed[k].uid).ok());
            ASSERT_TRUE(without.Release(placed[k].uid).ok());
            placed.erase(placed.begin() + static_cast<std::ptrdiff_t>(k));
          }
          ASSERT_TRUE(with.RemoveNode(name).ok());
          ASSERT_TRUE(without.RemoveNode(name).ok());
          ++removals;
          // Every node keeps its rank; the last one's moves with it to position i.
          rank[static_cast<size_t>(i)] = rank.back();
          rank.pop_back();
          if (gen.Uniform(2) == 0) {
            // Replaced before the next pod: as many nodes as before, the moved one at a new position.
            const NodeInfo n = RandomNode(gen, next_node++);
            ASSERT_TRUE(with.AddNode(n).ok());
            ASSERT_TRUE(without.AddNode(n).ok());
            rank.push_back(static_cast<uint32_t>(1000 + next_node));
          }
        } else {
          rank = Shuffled(gen, static_cast<size_t>(with.node_count()));
        }
      }
      EXPECT_GT(placements, 120) << "too few placements: the test checks little";
      EXPECT_GT(removals, 5);
    }
  }
}

// Placing a pod changes one node: the next pod of the same shape re-evaluates that node alone.
TEST(RankedIndexTest, ReevaluatesOnlyTheNodesThatChanged) {
  Cluster cluster;
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(cluster.AddNode(MakeNode(StrCat("n", i), 8)).ok());
  const std::vector<PodRequest> workload = {MakePod("w", {Milli(500)})};
  std::unique_ptr<Policy> policy = *MakePolicy("tessera", MakePolicyContext(cluster, workload));
  Placer placer(*policy);
  EvaluationCache cache;
  Rng rng(1);
  std::vector<uint32_t> rank = Shuffled(rng, 20);
  for (int i = 0; i < 5; ++i) {
    const PodRequest pod = MakePod(StrCat("p", i), {Milli(500)});
    const uint64_t before = cache.ranked().evaluations();
    absl::StatusOr<Placement> p = placer.Place(cluster, pod, rng, {}, rank, &cache);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(cache.ranked().evaluations() - before, i == 0 ? 20u : 1u) << "pod " << i;
    ASSERT_TRUE(cluster.Commit(pod, *p).ok());
  }
}

}  // namespace
}  // namespace tessera::core
