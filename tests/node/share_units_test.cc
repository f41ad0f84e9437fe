// One unit for a share from the request to the hook (docs/hook-abi.md, "cores-milli"): whatever set of pods
// the scheduler admits on a GPU, the limits files the agent writes for them never give out more than the GPU
// has, in compute or in memory. The path is the real one: ParsePodRequest, the Placer and the Cluster's
// ledger (Commit, compressions included), the assignment annotation written and read back, the agent's
// record, its limits file formatted and parsed as the hook parses it, and the share the hook enforces
// (SharePpm).
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/cluster.h"
#include "core/placement/placer.h"
#include "core/placement/policy.h"
#include "core/random.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/assignment.h"
#include "hook/common/limits.h"
#include "node/record.h"
#include "test_util.h"

namespace tessera::node {
namespace {

struct GpuModel {
  const char* model;
  int64_t mib;
};
// Sizes as NVML reports them, and one that divides by nothing (gpushare's worked example).
constexpr GpuModel kModels[] = {
    {"V100", 32768}, {"T4", 15360}, {"A100", 40960}, {"H100", 81559}, {"odd", 16276}};

struct Sums {
  uint64_t ppm = 0;       // the hook's shares, as it enforces them
  uint64_t bytes = 0;     // the limits files' memory
  int64_t committed = 0;  // the ledger's thousandths
  int files = 0;
  std::string log;  // the files, for a failure's message
};

// The limits files the agent writes for every pod placed in `cluster`, read back as a hook reads them.
Sums LimitsOnTheGpu(const core::Cluster& cluster, const std::vector<core::PodRequest>& pods) {
  Sums s;
  for (const core::PodRequest& pod : pods) {
    const core::Placement* placed = cluster.FindPlacement(pod.uid);
    if (placed == nullptr) continue;
    // Through the annotation, as the agent reads it.
    absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(formats::FormatAssignment(*placed));
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) continue;
    for (const core::ContainerAssignment& c : a->containers) {
      ContainerRecord r;
      r.pod_uid = pod.uid.value();
      r.container = c.name;
      r.vgpus = c.vgpus;
      // Through the agent's record file, as it keeps it.
      absl::StatusOr<ContainerRecord> kept = ParseRecord(SerializeRecord(r));
      EXPECT_TRUE(kept.ok()) << kept.status();
      if (!kept.ok()) continue;
      const hook::Limits written = LimitsFor(*kept);
      char text[4096];
      const size_t n = hook::FormatLimits(written, text, sizeof(text));
      EXPECT_GT(n, 0u);
      hook::Limits read;
      hook::Error error;
      EXPECT_TRUE(hook::ParseLimits(text, n, &read, &error)) << error.text << "\n" << text;
      for (int d = 0; d < read.device_count; ++d) {
        s.ppm += hook::SharePpm(read.devices[d]);
        s.bytes += read.devices[d].memory_bytes;
        EXPECT_NE(read.devices[d].memory_bytes, 0u) << "a share without a memory limit:\n" << text;
      }
      for (const core::VGpuAssignment& v : c.vgpus) s.committed += v.cores.value();
      ++s.files;
      s.log += text;
    }
  }
  return s;
}

void ExpectWithinTheGpu(const Sums& s, int64_t gpu_mib, const std::string& what) {
  EXPECT_LE(s.ppm, hook::kPpmPerGpu) << what << ": the hooks enforce " << s.ppm << " ppm of the GPU\n"
                                     << s.log;
  EXPECT_LE(s.bytes, static_cast<uint64_t>(gpu_mib) << 20)
      << what << ": the limits files give " << s.bytes << " bytes of " << (gpu_mib << 20) << "\n"
      << s.log;
  // Nothing lost either: the hook enforces exactly what the ledger committed.
  EXPECT_EQ(s.ppm, static_cast<uint64_t>(s.committed) * (hook::kPpmPerGpu / hook::kMilliPerGpu)) << what;
}

core::ContainerSpec Container(std::string name, core::ResourceList limits) {
  core::ContainerSpec c;
  c.name = std::move(name);
  c.limits = std::move(limits);
  return c;
}

// A pod in one of the forms of docs/requests.md, of random size.
core::PodSpec RandomPod(core::Rng& rng, int i, int64_t gpu_mib) {
  const auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.Next() % (hi - lo + 1));
  };
  core::PodSpec spec;
  spec.name = StrCat("p", i);
  spec.uid = StrCat("uid-", i);
  core::ResourceList l;
  switch (pick(0, 11)) {
    case 0:  // Tessera: cores and memory
      l = {{"tessera.dev/gpu-cores", StrCat(pick(1, 100))},
           {"tessera.dev/gpu-memory", StrCat(pick(1, gpu_mib))}};
      break;
    case 1:  // Tessera: cores only (memory in proportion, rounded down)
      l = {{"tessera.dev/gpu-cores", StrCat(pick(1, 60))}};
      break;
    case 2:  // Tessera: memory only (compute in proportion, rounded up)
      l = {{"tessera.dev/gpu-memory", StrCat(pick(1, gpu_mib / 3))}};
      break;
    case 3:  // Tessera: memory percentage
      l = {{"tessera.dev/gpu-memory-percentage", StrCat(pick(1, 50))}};
      break;
    case 4:  // HAMi: cores and memory
      l = {{"nvidia.com/gpu", "1"},
           {"nvidia.com/gpucores", StrCat(pick(1, 100))},
           {"nvidia.com/gpumem", StrCat(pick(1, gpu_mib))}};
      break;
    case 5:  // HAMi: memory only (no core limit: compute in proportion)
      l = {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", StrCat(pick(1, gpu_mib / 2))}};
      break;
    case 6:  // HAMi: memory percentage
      l = {{"nvidia.com/gpu", "1"},
           {"nvidia.com/gpumem-percentage", StrCat(pick(1, 60))},
           {"nvidia.com/gpucores", StrCat(pick(1, 60))}};
      break;
    case 7:  // gpu-manager: cores (of 100) and memory (units of 256 MiB)
      l = {{"tencent.com/vcuda-core", StrCat(pick(1, 99))},
           {"tencent.com/vcuda-memory", StrCat(pick(1, gpu_mib / 256))}};
      break;
    case 8:  // gpushare: GiB, compute in proportion
      l = {{"aliyun.com/gpu-mem", StrCat(pick(1, gpu_mib / 1024 / 2))}};
      break;
    case 9:  // memory-only, tiny: the smallest share there is
      l = {{"tessera.dev/gpu-memory", StrCat(pick(1, 4))}};
      break;
    case 10:  // a whole GPU
      l = {{"tessera.dev/gpu", "1"}};
      break;
    default:  // a tiny share of compute
      l = {{"tessera.dev/gpu-cores", "1"}, {"tessera.dev/gpu-memory", StrCat(pick(1, 64))}};
      break;
  }
  spec.containers.push_back(Container("main", l));
  if (pick(0, 7) == 0) spec.annotations["tessera.dev/priority"] = "high";
  return spec;
}

// Random pods on one GPU until it is full, under every policy that shares GPUs; the limits files must hold.
TEST(ShareUnitsPropertyTest, LimitsFilesNeverSumAboveTheGpu) {
  int admitted_total = 0;
  for (uint64_t seed = 1; seed <= 300; ++seed) {
    core::Rng rng(seed);
    const GpuModel gpu = kModels[rng.Next() % std::size(kModels)];
    core::Cluster cluster;
    ASSERT_TRUE(cluster.AddNode(testing::MakeNode("n", 1, core::MiB(gpu.mib), gpu.model)).ok());
    const char* policies[] = {"binpack", "spread", "gpushare", "gaia"};
    std::unique_ptr<core::Policy> policy = *core::MakePolicy(policies[rng.Next() % std::size(policies)]);
    core::Placer placer(*policy);
    std::vector<core::PodRequest> pods;
    for (int i = 0; i < 60; ++i) {
      absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(RandomPod(rng, i, gpu.mib));
      if (!request.ok()) continue;  // a form this size cannot have (the parser says why)
      absl::StatusOr<core::Placement> placed = placer.Place(cluster, *request, rng);
      if (!placed.ok()) continue;
      ASSERT_TRUE(cluster.Commit(*request, *placed).ok());
      pods.push_back(*request);
      ++admitted_total;
    }
    ExpectWithinTheGpu(LimitsOnTheGpu(cluster, pods), gpu.mib, StrCat("seed ", seed, " on a ", gpu.model));
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(admitted_total, 3000);  // the property was tried on many sets, not on empty GPUs
}

// Admits `count` pods asking `limits` on one GPU, and returns them.
std::vector<core::PodRequest> Admit(core::Cluster& cluster, const core::Placer& placer, core::Rng& rng,
                                    const core::ResourceList& limits, int count, const std::string& prefix) {
  std::vector<core::PodRequest> out;
  for (int i = 0; i < count; ++i) {
    core::PodSpec spec;
    spec.name = StrCat(prefix, i);
    spec.uid = StrCat(prefix, "-uid-", i);
    spec.containers.push_back(Container("main", limits));
    absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(spec);
    EXPECT_TRUE(request.ok()) << request.status();
    absl::StatusOr<core::Placement> placed = placer.Place(cluster, *request, rng);
    EXPECT_TRUE(placed.ok()) << placed.status();
    if (!placed.ok()) continue;
    EXPECT_TRUE(cluster.Commit(*request, *placed).ok());
    out.push_back(*request);
  }
  return out;
}

// Eight gpushare pods of 4 GiB on a 32 GiB V100: the ledger commits 8 x 125 thousandths, 100%; the limits
// files used to say 8 x 13% = 104%.
TEST(ShareUnitsPropertyTest, EightGpusharePodsOfFourGibOnAV100) {
  core::Cluster cluster;
  ASSERT_TRUE(cluster.AddNode(testing::MakeNode("n", 1, core::MiB(32768), "V100")).ok());
  std::unique_ptr<core::Policy> policy = *core::MakePolicy("binpack");
  core::Placer placer(*policy);
  core::Rng rng(1);
  std::vector<core::PodRequest> pods = Admit(cluster, placer, rng, {{"aliyun.com/gpu-mem", "4"}}, 8, "gs");
  ASSERT_EQ(pods.size(), 8u);
  const Sums s = LimitsOnTheGpu(cluster, pods);
  EXPECT_EQ(s.committed, 1000);
  EXPECT_EQ(s.ppm, hook::kPpmPerGpu);
  ExpectWithinTheGpu(s, 32768, "8 x 4 GiB gpushare on a V100");
}

// One 90% pod and 39 pods asking 1 MiB on a T4: the ledger commits 900 + 39 x 1 thousandths, 93.9%; the
// limits files used to say 90% + 39 x 1% = 129%, and the 90% tenant could no longer get its 90%.
TEST(ShareUnitsPropertyTest, NinetyPercentAndThirtyNineOneMibPodsOnAT4) {
  core::Cluster cluster;
  ASSERT_TRUE(cluster.AddNode(testing::MakeNode("n", 1, core::MiB(15360), "T4")).ok());
  std::unique_ptr<core::Policy> policy = *core::MakePolicy("binpack");
  core::Placer placer(*policy);
  core::Rng rng(1);
  std::vector<core::PodRequest> pods = Admit(
      cluster, placer, rng, {{"tessera.dev/gpu-cores", "90"}, {"tessera.dev/gpu-memory", "8192"}}, 1, "big");
  std::vector<core::PodRequest> small =
      Admit(cluster, placer, rng, {{"tessera.dev/gpu-memory", "1"}}, 39, "small");
  ASSERT_EQ(small.size(), 39u);
  pods.insert(pods.end(), small.begin(), small.end());
  const Sums s = LimitsOnTheGpu(cluster, pods);
  EXPECT_EQ(s.committed, 939);
  EXPECT_EQ(s.ppm, 939000u);
  ExpectWithinTheGpu(s, 15360, "90% and 39 x 1 MiB on a T4");
}

}  // namespace
}  // namespace tessera::node
