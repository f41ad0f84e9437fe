// Property tests: thousands of random place/release sequences over random clusters, with every policy.
//   - no GPU's compute share or memory is ever oversubscribed, and the ledger always adds up;
//   - releasing a pod right after placing it restores exactly the state before;
//   - releasing everything returns the cluster to empty.
#include <gtest/gtest.h>

#include <map>

#include "core/placement/placer.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::ReadTestData;

const std::vector<std::string>& TopoFiles() {
  static const std::vector<std::string> files = {"topo/dgx-a100.txt", "topo/two-socket-8gpu.txt",
                                                 "topo/two-socket-5gpu.txt", "topo/pcie-4gpu-t4.txt"};
  return files;
}

Cluster RandomCluster(Rng& rng) {
  Cluster c;
  const int nodes = 3 + static_cast<int>(rng.Uniform(5));
  for (int i = 0; i < nodes; ++i) {
    const bool t4 = rng.Uniform(2) == 0;
    NodeInfo n;
    if (rng.Uniform(3) == 0) {
      const std::string& file = TopoFiles()[rng.Uniform(static_cast<uint32_t>(TopoFiles().size()))];
      TopoReport topo = *ParseNvidiaSmiTopo(ReadTestData(file));
      n = MakeNode(StrCat("n", i), topo.links.size(), MiB(t4 ? 15360 : 81920), t4 ? "T4" : "A100");
      n.links = topo.links;
      for (int g = 0; g < n.links.size(); ++g)
        n.gpus[static_cast<size_t>(g)].numa_node = topo.numa_node[static_cast<size_t>(g)];
    } else {
      n = MakeNode(StrCat("n", i), 1 + static_cast<int>(rng.Uniform(8)), MiB(t4 ? 15360 : 81920),
                   t4 ? "T4" : "A100");
      for (GpuInfo& g : n.gpus) g.numa_node = g.index % 2;
    }
    n.cpu = MilliCpu(64000);
    n.memory = MiB(256 * 1024);
    EXPECT_TRUE(c.AddNode(n).ok());
  }
  c.SetQuota(Namespace("quota"), "T4", MilliGpu(3000));
  return c;
}

VGpuDemand RandomShare(Rng& rng) {
  VGpuDemand d;
  d.cores = MilliGpu(1 + static_cast<int>(rng.Uniform(999)));
  switch (rng.Uniform(4)) {
    case 0:
      d.memory = {MemorySpec::Kind::kMiB, 1 + rng.Uniform(20000)};
      break;
    case 1:
      d.memory = {MemorySpec::Kind::kPercent, 1 + rng.Uniform(100)};
      break;
    case 2:
      d.cores = MilliGpu(0);  // memory only
      d.memory = {MemorySpec::Kind::kMiB, 1 + rng.Uniform(15000)};
      break;
    default:
      break;
  }
  return d;
}

PodRequest RandomPod(Rng& rng, int id) {
  PodRequest p;
  p.uid = PodUid(StrCat("pod-", id));
  p.name = p.uid.value();
  p.ns = Namespace(rng.Uniform(5) == 0 ? "quota" : "default");
  const int containers = rng.Uniform(6) == 0 ? 2 : 1;
  for (int c = 0; c < containers; ++c) {
    ContainerRequest cr;
    cr.name = StrCat("c", c);
    switch (rng.Uniform(5)) {
      case 0: {  // whole GPUs
        const int n = 1 + static_cast<int>(rng.Uniform(4));
        for (int i = 0; i < n; ++i) cr.vgpus.push_back({kWholeGpu, {}});
        break;
      }
      case 1:  // "2.5 GPUs"
        cr.vgpus = {{kWholeGpu, {}}, {kWholeGpu, {}}, {MilliGpu(500), {}}};
        break;
      case 2: {  // several shares
        const int n = 2 + static_cast<int>(rng.Uniform(2));
        VGpuDemand d = RandomShare(rng);
        for (int i = 0; i < n; ++i) cr.vgpus.push_back(d);
        break;
      }
      default:
        cr.vgpus.push_back(RandomShare(rng));
    }
    p.containers.push_back(std::move(cr));
  }
  if (rng.Uniform(8) == 0) p.priority = Priority::kHigh;
  if (rng.Uniform(6) == 0) p.model_include = {rng.Uniform(2) == 0 ? "T4" : "A100"};
  if (rng.Uniform(10) == 0) p.numa_bind = true;
  p.cpu = MilliCpu(static_cast<int64_t>(rng.Uniform(8000)));
  p.memory = MiB(static_cast<int64_t>(rng.Uniform(32768)));
  return p;
}

// The ledger of every GPU adds up and nothing is oversubscribed.
void CheckLedger(const Cluster& c) {
  for (const NodeState& n : c.nodes()) {
    MilliGpu max_free(0);
    for (int g = 0; g < n.gpu_count(); ++g) {
      int64_t cores = 0;
      int64_t memory = 0;
      bool exclusive = false;
      for (const Tenant& t : n.tenants(g)) {
        ASSERT_GE(t.cores.value(), 1);
        ASSERT_LE(t.cores, t.requested);
        cores += t.cores.value();
        memory += t.memory.value();
        exclusive = exclusive || IsWholeGpu(t.cores);
      }
      ASSERT_LE(cores, 1000) << n.name() << " GPU " << g;
      ASSERT_LE(memory, n.gpu(g).memory.value()) << n.name() << " GPU " << g;
      ASSERT_EQ(cores + n.free_cores(g).value(), 1000);
      ASSERT_EQ(memory + n.free_memory(g).value(), n.gpu(g).memory.value());
      if (exclusive) {
        ASSERT_EQ(n.tenants(g).size(), 1u);
      }
      if (n.healthy().Has(g)) max_free = std::max(max_free, n.free_cores(g));
    }
    ASSERT_EQ(n.max_free_cores(), max_free);
    ASSERT_GE(n.free_cpu().value(), 0);
    ASSERT_GE(n.free_host_memory().value(), 0);
  }
}

bool AnyCompressed(const NodeState& n) {
  for (int g = 0; g < n.gpu_count(); ++g) {
    for (const Tenant& t : n.tenants(g)) {
      if (t.cores < t.requested) return true;
    }
  }
  return false;
}

class PropertyTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PropertyTest, RandomPlaceReleaseSequences) {
  int placed_total = 0;
  int restore_checks = 0;
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    Rng rng(seed);
    Cluster cluster = RandomCluster(rng);
    // Policies that score against the workload (tessera, fgd) learn its typical pods from a sample of it.
    std::vector<PodRequest> sample;
    Rng sample_rng(seed + 1000);
    for (int i = 0; i < 50; ++i) sample.push_back(RandomPod(sample_rng, 100000 + i));
    absl::StatusOr<std::unique_ptr<Policy>> made = MakePolicy(GetParam(), MakePolicyContext(cluster, sample));
    ASSERT_TRUE(made.ok()) << made.status();
    std::unique_ptr<Policy> policy = *std::move(made);
    Placer placer(*policy);
    std::vector<NodeState> empty(cluster.nodes().begin(), cluster.nodes().end());
    std::vector<PodUid> live;
    for (int op = 0; op < 400; ++op) {
      if (live.empty() || rng.Uniform(10) < 6) {
        PodRequest pod = RandomPod(rng, op);
        absl::StatusOr<Placement> p = placer.Place(cluster, pod, rng);
        if (!p.ok()) continue;
        const NodeState* node = cluster.FindNode(p->node);
        const NodeState before = *node;
        ASSERT_TRUE(cluster.Commit(pod, *p).ok()) << "the Placer chose what Commit refuses: " << p->node;
        ++placed_total;
        CheckLedger(cluster);
        if (rng.Uniform(3) == 0) {
          // Release at once: the node must be exactly as before (when no earlier compression is pending).
          ASSERT_TRUE(cluster.Release(pod.uid).ok());
          CheckLedger(cluster);
          if (!AnyCompressed(before)) {
            ASSERT_TRUE(*cluster.FindNode(p->node) == before) << "seed " << seed << " op " << op;
            ++restore_checks;
          }
        } else {
          live.push_back(pod.uid);
        }
      } else {
        const size_t i = rng.Uniform(static_cast<uint32_t>(live.size()));
        ASSERT_TRUE(cluster.Release(live[i]).ok());
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
        CheckLedger(cluster);
      }
    }
    for (const PodUid& uid : live) ASSERT_TRUE(cluster.Release(uid).ok());
    CheckLedger(cluster);
    for (size_t i = 0; i < empty.size(); ++i) ASSERT_TRUE(cluster.nodes()[i] == empty[i]) << empty[i].name();
    EXPECT_EQ(cluster.pod_count(), 0);
  }
  // The sequences must have exercised something.
  EXPECT_GT(placed_total, 1000);
  EXPECT_GT(restore_checks, 200);
}

// Every registered policy, the scheduler's default (tessera) and its baseline (fgd) included.
INSTANTIATE_TEST_SUITE_P(Policies, PropertyTest, ::testing::ValuesIn(PolicyNames()));

}  // namespace
}  // namespace tessera::core
