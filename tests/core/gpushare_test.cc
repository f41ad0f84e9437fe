// The worked examples of "GPU Sharing in Kubernetes" (Aliyun's gpushare scheduler extender design).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/placement/placer.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::testing::HasSubstr;

constexpr int64_t kGpuMiB = 16276;  // "a single device with 16GiB of memory ... 16276MiB"

class GpushareExamplesTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { policy_ = *MakePolicy(GetParam()); }
  void AddNode(const std::string& name, std::vector<int64_t> used_mib) {
    ASSERT_TRUE(cluster_.AddNode(MakeNode(name, static_cast<int>(used_mib.size()), MiB(kGpuMiB))).ok());
    for (size_t g = 0; g < used_mib.size(); ++g) {
      if (used_mib[g] == 0) continue;
      const MiB m(used_mib[g]);
      Placement p = ::tessera::testing::PlacementOn(
          name, {{static_cast<int>(g), GpuUuid(), ProportionalShare(m, MiB(kGpuMiB)), m}});
      ASSERT_TRUE(cluster_.Commit(MakePod(StrCat(name, "-used-", g), {}), p).ok());
    }
  }
  // gpushare's request: aliyun.com/gpu-mem in MiB, compute in proportion.
  PodRequest Ask(int64_t mib) {
    PodSpec spec;
    spec.name = "ask";
    spec.uid = "ask";
    spec.containers.push_back({"main", {{"aliyun.com/gpu-mem", StrCat(mib)}}, {}, false});
    ParseOptions options;
    options.gpushare_memory_unit = MiB(1);
    return *ParsePodRequest(spec, options);
  }
  Cluster cluster_;
  Rng rng_{5};
  std::unique_ptr<Policy> policy_;
};

// Bind: node N1's GPUs have 12207, 8138, 4069 and 16276 MiB free; a request of 8138 MiB picks GPU1, "which
// has the least remaining resources" among those that fit.
TEST_P(GpushareExamplesTest, BinpackPicksGpu1OnN1) {
  AddNode("N1", {kGpuMiB - 12207, kGpuMiB - 8138, kGpuMiB - 4069, 0});
  for (int i = 0; i < 20; ++i) {
    Placer placer(*policy_);
    absl::StatusOr<Placement> p = placer.Place(cluster_, Ask(8138), rng_);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->containers[0].vgpus[0].gpu_index, 1);
    EXPECT_EQ(p->containers[0].vgpus[0].memory.value(), 8138);
  }
}

// Filter: three nodes of two GPUs. N1 has 4069 MiB free in all; N2 has 8138 free, but 4069 on each GPU; N3
// has 8138 free on GPU0. Only N3 can take 8138 MiB on one device.
TEST_P(GpushareExamplesTest, FilterRejectsSplitMemory) {
  AddNode("N1", {kGpuMiB, 12207});
  AddNode("N2", {12207, 12207});
  AddNode("N3", {8138, kGpuMiB});
  Placer placer(*policy_);
  const PodRequest ask = Ask(8138);
  CompiledRequest compiled(cluster_, ask);
  EXPECT_FALSE(placer.Evaluate(*cluster_.FindNode(NodeName("N1")), compiled, rng_).fits());
  EXPECT_FALSE(placer.Evaluate(*cluster_.FindNode(NodeName("N2")), compiled, rng_).fits());
  EXPECT_TRUE(placer.Evaluate(*cluster_.FindNode(NodeName("N3")), compiled, rng_).fits());
  Explanation why = placer.Explain(cluster_, *cluster_.FindNode(NodeName("N2")), ask);
  EXPECT_THAT(
      why.message,
      HasSubstr("no GPU has room; GPU 0 has 25% compute free, 50% needed and 4069 MiB free, 8138 needed"));
  absl::StatusOr<Placement> p = placer.Place(cluster_, ask, rng_);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->node, NodeName("N3"));
  EXPECT_EQ(p->containers[0].vgpus[0].gpu_index, 0);
}

INSTANTIATE_TEST_SUITE_P(Policies, GpushareExamplesTest, ::testing::Values("gpushare", "binpack"));

}  // namespace
}  // namespace tessera::core
