#include "core/request_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/cluster.h"
#include "core/strings.h"
#include "test_util.h"

namespace tessera::core {
namespace {

using ::tessera::testing::Share;
using ::tessera::testing::Whole;
using ::testing::HasSubstr;

PodSpec Pod(ResourceList limits, std::map<std::string, std::string> annotations = {}) {
  PodSpec p;
  p.name = "p";
  p.uid = "uid-1";
  p.annotations = std::move(annotations);
  p.containers.push_back({"main", std::move(limits), {}, false});
  return p;
}

std::vector<VGpuDemand> VGpus(const ResourceList& limits) {
  absl::StatusOr<PodRequest> r = ParsePodRequest(Pod(limits));
  EXPECT_TRUE(r.ok()) << r.status();
  if (!r.ok() || r->containers.empty()) return {};
  return r->containers[0].vgpus;
}

std::string Error(const PodSpec& pod, const ParseOptions& options = {}) {
  absl::StatusOr<PodRequest> r = ParsePodRequest(pod, options);
  EXPECT_FALSE(r.ok()) << "expected a refusal";
  return r.ok() ? "" : std::string(r.status().message());
}
std::string Refusal(const ResourceList& limits) {
  return Error(Pod(limits));
}

VGpuDemand WithMemory(VGpuDemand d, MemorySpec::Kind kind, int64_t value) {
  d.memory = {kind, value};
  return d;
}

TEST(RequestParserTest, TesseraShares) {
  EXPECT_EQ(
      VGpus({{"tessera.dev/gpu", "2"}, {"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}}),
      (std::vector<VGpuDemand>{Share(30, 4096), Share(30, 4096)}));
  // gpu defaults to 1 when another tessera resource is given.
  EXPECT_EQ(VGpus({{"tessera.dev/gpu-cores", "25"}}), (std::vector<VGpuDemand>{Share(25)}));
  // Memory in percent: compute follows it when cores are left out.
  EXPECT_EQ(VGpus({{"tessera.dev/gpu-memory-percentage", "50"}}),
            (std::vector<VGpuDemand>{WithMemory(Share(50), MemorySpec::Kind::kPercent, 50)}));
  // Memory only: compute in proportion, decided on the GPU chosen.
  EXPECT_EQ(VGpus({{"tessera.dev/gpu-memory", "8192"}}),
            (std::vector<VGpuDemand>{{MilliGpu(0), {MemorySpec::Kind::kMiB, 8192}}}));
}

TEST(RequestParserTest, WholeGpus) {
  EXPECT_EQ(VGpus({{"tessera.dev/gpu", "3"}}), (std::vector<VGpuDemand>{Whole(), Whole(), Whole()}));
  EXPECT_EQ(VGpus({{"tessera.dev/gpu", "1"}, {"tessera.dev/gpu-cores", "100"}}),
            (std::vector<VGpuDemand>{Whole()}));
}

TEST(RequestParserTest, TwoAndAHalfGpus) {
  // Gaia's future work (docs/requests.md, "2.5 GPUs"): gpu-cores 250 without tessera.dev/gpu.
  EXPECT_EQ(VGpus({{"tessera.dev/gpu-cores", "250"}}),
            (std::vector<VGpuDemand>{Whole(), Whole(), Share(50)}));
  EXPECT_EQ(VGpus({{"tessera.dev/gpu-cores", "200"}}), (std::vector<VGpuDemand>{Whole(), Whole()}));
}

TEST(RequestParserTest, NoGpu) {
  absl::StatusOr<PodRequest> r = ParsePodRequest(Pod({{"cpu", "1"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->wants_gpu());
  r = ParsePodRequest(Pod({{"tessera.dev/gpu", "0"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->wants_gpu());
}

TEST(RequestParserTest, CoresAboveOnePerVGpuSaysWhatToWrite) {
  std::string e = Refusal({{"tessera.dev/gpu", "2"}, {"tessera.dev/gpu-cores", "150"}});
  EXPECT_THAT(e, HasSubstr("container \"main\""));
  EXPECT_THAT(e, HasSubstr("cores are per vGPU, 1-100"));
  EXPECT_THAT(e, HasSubstr("For 2 whole GPUs write tessera.dev/gpu-cores: 100"));
  EXPECT_THAT(e, HasSubstr("for 1.5 GPUs remove tessera.dev/gpu and keep tessera.dev/gpu-cores: 150"));
}

TEST(RequestParserTest, RefusalsSayWhatToWriteInstead) {
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-cores", "0"}}), HasSubstr("ask for 1-100 percent"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-memory", "4Gi"}}), HasSubstr("write 4096 for 4Gi"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-memory", "4096"}, {"tessera.dev/gpu-memory-percentage", "50"}}),
              HasSubstr("give one"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-memory-percentage", "120"}}), HasSubstr("1-100"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "0"}, {"tessera.dev/gpu-cores", "20"}}), HasSubstr("1 or more"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "1.5"}}), HasSubstr("whole number"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "-1"}}), HasSubstr("cannot be negative"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "two"}}), HasSubstr("not a quantity"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "65"}}), HasSubstr("no node has more than 64 GPUs"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "1"}, {"nvidia.com/gpumem", "1000"}}),
              HasSubstr("mixes the GPU resources of different systems"));
}

TEST(RequestParserTest, HugeValuesAreRefusedNotWrapped) {
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-memory", "9223372036854775"}}),
              HasSubstr("more than any GPU could hold"));
  EXPECT_THAT(Refusal({{"aliyun.com/gpu-mem", "9100000000000000"}}),
              HasSubstr("more than any GPU could hold"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "1"}, {"memory", "9223372036854775807m"}}),
              HasSubstr("more than any node has"));
  PodSpec two = Pod({{"tessera.dev/gpu", "1"}, {"cpu", "9000000000000000"}});
  two.containers.push_back({"b", {{"cpu", "9000000000000000"}}, {}, false});
  EXPECT_THAT(Error(two), HasSubstr("more than any node has"));
  PodSpec many = Pod({{"tessera.dev/gpu", "40"}});
  many.containers.push_back({"b", {{"tessera.dev/gpu", "40"}}, {}, false});
  EXPECT_THAT(Error(many), HasSubstr("80 vGPUs in all"));
}

// 16 containers at the per-container cap (2^50 cores) and one more sum to 2^64 + 1 core: the sum used to wrap
// to one core, and the pod fit a 48-core node.
PodSpec WrappingCpuPod() {
  PodSpec p = Pod({{"tessera.dev/gpu", "1"}, {"cpu", "1125899906842624"}});
  for (int i = 1; i < 16; ++i)
    p.containers.push_back({StrCat("c", i), {{"cpu", "1125899906842624"}}, {}, false});
  p.containers.push_back({"last", {{"cpu", "432345564227568616m"}}, {}, false});
  return p;
}

TEST(RequestParserTest, HostSumsDoNotWrap) {
  EXPECT_THAT(Error(WrappingCpuPod()),
              HasSubstr("the pod's containers ask for more cpu in all than any node has"));
  // The same with memory, and with sidecars beside the app containers.
  PodSpec mem = Pod({{"tessera.dev/gpu", "1"}});
  for (int i = 0; i < 17; ++i) {
    mem.init_containers.push_back({StrCat("side", i), {{"memory", "1125899906842624"}}, {}, false, true});
  }
  EXPECT_THAT(Error(mem), HasSubstr("more memory in all than any node has"));
  // Below the cap, a sum is a sum.
  PodSpec fine = Pod({{"tessera.dev/gpu", "1"}, {"cpu", "562949953421312"}});  // 2^49 cores, twice
  fine.containers.push_back({"b", {{"cpu", "562949953421312"}}, {}, false});
  absl::StatusOr<PodRequest> r = ParsePodRequest(fine);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cpu.value(), (int64_t{1} << 50) * 1000);
}

TEST(RequestParserTest, MilliSuffixIsExplained) {
  EXPECT_THAT(
      Refusal({{"tessera.dev/gpu-memory", "4096m"}}),
      HasSubstr("tessera.dev/gpu-memory is \"4096m\", which is 4.096 (the m suffix means thousandths), not "
                "a whole number; write a plain whole number of MiB"));
  // "30000m" is 30, and used to be answered "write 30000".
  EXPECT_THAT(
      Refusal({{"tessera.dev/gpu-cores", "30000m"}}),
      HasSubstr(
          "tessera.dev/gpu-cores is \"30000m\", which is 30 (the m suffix means thousandths); write 30"));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu-cores", "30500m"}}), HasSubstr("which is 30.5 ("));
  EXPECT_THAT(Refusal({{"tessera.dev/gpu", "2"}, {"tessera.dev/gpu-cores", "205"}}),
              HasSubstr("for 2.05 GPUs"));
}

// The admission webhook names the container itself: the parser's own prefix used to double it
// (container m: container "container": ...).
TEST(RequestParserTest, TranslationErrorsLeaveTheContainerToTheCaller) {
  absl::StatusOr<std::optional<Translation>> t =
      TranslateToTessera({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "150"}});
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), ::testing::Not(HasSubstr("container")));
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("nvidia.com/gpucores is 150"));
  absl::StatusOr<std::optional<int64_t>> n = ImpliedGpuCount({{"tessera.dev/gpu-cores", "0"}});
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), ::testing::Not(HasSubstr("container")));
}

TEST(RequestParserTest, LimitsAndRequestsMustAgree) {
  PodSpec p = Pod({{"tessera.dev/gpu-cores", "30"}});
  p.containers[0].requests = {{"tessera.dev/gpu-cores", "20"}};
  EXPECT_THAT(Error(p), HasSubstr("cannot be overcommitted"));
  p.containers[0].requests = {{"tessera.dev/gpu-cores", "30"}};
  EXPECT_TRUE(ParsePodRequest(p).ok());
  // Requests alone are read too.
  PodSpec q = Pod({});
  q.containers[0].requests = {{"tessera.dev/gpu", "1"}};
  EXPECT_EQ(ParsePodRequest(q)->containers[0].vgpus, std::vector<VGpuDemand>{Whole()});
}

TEST(RequestParserTest, PrivilegedContainersMayNotShare) {
  PodSpec p = Pod({{"tessera.dev/gpu-cores", "30"}});
  p.containers[0].privileged = true;
  EXPECT_THAT(Error(p), HasSubstr("privileged"));
  PodSpec whole = Pod({{"tessera.dev/gpu", "1"}});
  whole.containers[0].privileged = true;
  EXPECT_TRUE(ParsePodRequest(whole).ok());
}

TEST(RequestParserTest, InitContainersMayNotAskForGpus) {
  PodSpec p = Pod({});
  p.init_containers.push_back({"setup", {{"tessera.dev/gpu", "1"}}, {}, false});
  EXPECT_THAT(Error(p), HasSubstr("move the GPU resources"));
}

TEST(RequestParserTest, Annotations) {
  absl::StatusOr<PodRequest> r =
      ParsePodRequest(Pod({{"tessera.dev/gpu", "1"}}, {{"tessera.dev/gpu-model", "A100-SXM4-80GB, H100"},
                                                       {"tessera.dev/gpu-model-exclude", "T4"},
                                                       {"tessera.dev/gpu-uuid-exclude", "GPU-1"},
                                                       {"tessera.dev/priority", "High"},
                                                       {"tessera.dev/compute-policy", "elastic"},
                                                       {"tessera.dev/numa-bind", "true"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model_include, (std::vector<std::string>{"A100-SXM4-80GB", "H100"}));
  EXPECT_EQ(r->model_exclude, (std::vector<std::string>{"T4"}));
  EXPECT_EQ(r->uuid_exclude, (std::vector<GpuUuid>{GpuUuid("GPU-1")}));
  EXPECT_EQ(r->priority, Priority::kHigh);
  EXPECT_EQ(r->compute_policy, ComputePolicy::kElastic);
  EXPECT_TRUE(r->numa_bind);
}

TEST(RequestParserTest, BadAnnotations) {
  ResourceList one = {{"tessera.dev/gpu", "1"}};
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/priority", "urgent"}})), HasSubstr("write high or low"));
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/compute-policy", "soft"}})), HasSubstr("write hard"));
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/numa-bind", "yes"}})), HasSubstr("write true or false"));
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/gpu-model", " , "}})), HasSubstr("is empty"));
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/gpu-model", "T4"}, {"tessera.dev/gpu-model-exclude", "T4"}})),
              HasSubstr("both in"));
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/gpu-modle", "T4"}})),
              HasSubstr("did you mean tessera.dev/gpu-model?"));
  // A resource written as an annotation used to be ignored: the pod ran without the memory limit it meant.
  EXPECT_THAT(Error(Pod(one, {{"tessera.dev/gpu-memory", "8Gi"}})),
              HasSubstr("tessera.dev/gpu-memory is a resource, not an annotation"));
  EXPECT_THAT(Error(Pod({}, {{"tessera.dev/gpu", "1"}})), HasSubstr("resources.limits"));
  // Annotations Tessera itself writes are not mistaken for typos.
  EXPECT_TRUE(
      ParsePodRequest(Pod(one, {{"tessera.dev/assignment", "{}"}, {"tessera.dev/phase", "bound"}})).ok());
}

// Native sidecars (init containers with restartPolicy: Always) hold GPUs for the pod's life, as app containers do;
// a plain init container asking for one is refused with the way out.
TEST(RequestParserTest, SidecarsMayHoldGpusInitContainersMayNot) {
  PodSpec p = Pod({{"cpu", "1"}});
  ContainerSpec side{"gpu-proxy", {{"tessera.dev/gpu-cores", "20"}, {"cpu", "2"}}, {}, false};
  side.sidecar = true;
  p.init_containers.push_back(side);
  p.init_containers.push_back({"setup", {{"cpu", "4"}}, {}, false});
  absl::StatusOr<PodRequest> r = ParsePodRequest(p);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 1u);
  EXPECT_EQ(r->containers[0].name, "gpu-proxy");
  EXPECT_EQ(r->cpu.value(), 6000);  // setup (4) runs beside the sidecar (2), which beats 1 + 2 later
  p.init_containers[0].sidecar = false;
  EXPECT_THAT(Error(p), HasSubstr("make this one a sidecar (restartPolicy: Always)"));
}

TEST(RequestParserTest, HostResources) {
  PodSpec p = Pod({{"tessera.dev/gpu", "1"}});
  p.containers[0].requests = {{"cpu", "500m"}, {"memory", "8Gi"}};
  p.containers.push_back({"side", {{"cpu", "1"}, {"memory", "100Mi"}}, {}, false});
  p.init_containers.push_back({"init", {}, {{"cpu", "4"}}, false});
  absl::StatusOr<PodRequest> r = ParsePodRequest(p);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->cpu.value(), 4000);     // the init container's 4 CPUs beat 1.5 in the app containers
  EXPECT_EQ(r->memory.value(), 8292);  // 8 GiB + 100 MiB
}

// --- the other systems' names -------------------------------------------------------------------------

TEST(ForeignNamesTest, Hami) {
  // nvidia.com/gpu alone: whole GPUs (HAMi gives the whole memory; the NVIDIA plugin whole devices).
  EXPECT_EQ(VGpus({{"nvidia.com/gpu", "2"}}),
            (std::vector<VGpuDemand>{WithMemory(Whole(), MemorySpec::Kind::kPercent, 100),
                                     WithMemory(Whole(), MemorySpec::Kind::kPercent, 100)}));
  EXPECT_EQ(VGpus({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "4000"}}),
            (std::vector<VGpuDemand>{Share(30, 4000)}));
  // Cores without memory: HAMi gives the whole memory.
  EXPECT_EQ(VGpus({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}}),
            (std::vector<VGpuDemand>{WithMemory(Share(30), MemorySpec::Kind::kPercent, 100)}));
  // gpucores 0 is HAMi's "no core limit": compute follows memory.
  EXPECT_EQ(
      VGpus({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "0"}, {"nvidia.com/gpumem-percentage", "25"}}),
      (std::vector<VGpuDemand>{WithMemory(Share(25), MemorySpec::Kind::kPercent, 25)}));
}

TEST(ForeignNamesTest, ZeroGpusMeansNoGpu) {
  for (const ResourceList& zero :
       std::vector<ResourceList>{{{"nvidia.com/gpu", "0"}}, {{"volcano.sh/vgpu-number", "0"}}}) {
    absl::StatusOr<PodRequest> r = ParsePodRequest(Pod(zero));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->wants_gpu());
    EXPECT_TRUE(TranslateToTessera(zero).ok());
  }
}

TEST(ForeignNamesTest, ConflictsNameTheKeysWritten) {
  EXPECT_THAT(Error(Pod({{"nvidia.com/gpu", "1"}},
                        {{"nvidia.com/use-gputype", "T4"}, {"nvidia.com/nouse-gputype", "T4"}})),
              HasSubstr("both in nvidia.com/use-gputype and in nvidia.com/nouse-gputype"));
}

TEST(ForeignNamesTest, GpuManager) {
  // vcuda-core: 100 per GPU; vcuda-memory: units of 256 MiB.
  EXPECT_EQ(VGpus({{"tencent.com/vcuda-core", "50"}, {"tencent.com/vcuda-memory", "8"}}),
            (std::vector<VGpuDemand>{Share(50, 2048)}));
  EXPECT_EQ(VGpus({{"tencent.com/vcuda-core", "200"}, {"tencent.com/vcuda-memory", "8"}}),
            (std::vector<VGpuDemand>{Whole(), Whole()}));
  EXPECT_THAT(Refusal({{"tencent.com/vcuda-core", "150"}}), HasSubstr("multiple of 100"));
}

TEST(ForeignNamesTest, GpushareAndVolcano) {
  EXPECT_EQ(VGpus({{"aliyun.com/gpu-mem", "8"}}),
            (std::vector<VGpuDemand>{{MilliGpu(0), {MemorySpec::Kind::kMiB, 8192}}}));
  ParseOptions mib;
  mib.gpushare_memory_unit = MiB(1);
  absl::StatusOr<PodRequest> r = ParsePodRequest(Pod({{"aliyun.com/gpu-mem", "8138"}}), mib);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->containers[0].vgpus[0].memory.value, 8138);
  EXPECT_EQ(VGpus({{"volcano.sh/vgpu-number", "2"},
                   {"volcano.sh/vgpu-cores", "40"},
                   {"volcano.sh/vgpu-memory", "3000"}}),
            (std::vector<VGpuDemand>{Share(40, 3000), Share(40, 3000)}));
}

TEST(ForeignNamesTest, HamiAnnotations) {
  absl::StatusOr<PodRequest> r =
      ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}},
                          {{"nvidia.com/use-gputype", "A100"}, {"nvidia.com/nouse-gpuuuid", "GPU-9"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model_include, std::vector<std::string>{"A100"});
  EXPECT_EQ(r->uuid_exclude, std::vector<GpuUuid>{GpuUuid("GPU-9")});
}

TEST(ForeignNamesTest, TranslationMeansTheSame) {
  const std::vector<ResourceList> cases = {
      {{"nvidia.com/gpu", "2"}, {"cpu", "1"}},
      {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "4000"}},
      {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}},
      {{"tencent.com/vcuda-core", "50"}, {"tencent.com/vcuda-memory", "8"}},
      {{"tencent.com/vcuda-core", "300"}},
      {{"aliyun.com/gpu-mem", "8"}, {"memory", "1Gi"}},
      {{"volcano.sh/vgpu-number", "1"}, {"volcano.sh/vgpu-memory-percentage", "40"}},
  };
  for (const ResourceList& original : cases) {
    absl::StatusOr<std::optional<Translation>> t = TranslateToTessera(original);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_TRUE(t->has_value());
    for (const auto& [name, value] : (*t)->resources) {
      EXPECT_TRUE(name.starts_with("tessera.dev/") || name == "cpu" || name == "memory") << name;
    }
    EXPECT_EQ(VGpus(original), VGpus((*t)->resources))
        << StrJoin(std::vector<std::string>{original.begin()->first}, "");
  }
  // Already Tessera's names, or no GPU: nothing to translate.
  EXPECT_FALSE(TranslateToTessera({{"tessera.dev/gpu", "1"}})->has_value());
  EXPECT_FALSE(TranslateToTessera({{"cpu", "1"}})->has_value());
  EXPECT_FALSE(TranslateToTessera({{"tencent.com/vcuda-core", "150"}}).ok());
}

// --- migration that keeps HAMi's meaning (docs/migration.md) ------------------------------------------------

// HAMi: gpucores left out (or 0) is "no core limit". Kept as an elastic share (by default), or Tessera's hard
// proportional share with --hami-no-core-limit=proportional; a stated core limit stays hard.
TEST(MigrationTest, HamiWithoutCoreLimitIsElasticUnlessTheOperatorSaysOtherwise) {
  for (const ResourceList& no_limit : std::vector<ResourceList>{
           {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}},
           {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "0"}, {"nvidia.com/gpumem", "4000"}},
           {{"volcano.sh/vgpu-number", "1"}, {"volcano.sh/vgpu-memory", "4000"}}}) {
    absl::StatusOr<PodRequest> r = ParsePodRequest(Pod(no_limit));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->compute_policy, ComputePolicy::kElastic);
    absl::StatusOr<std::optional<Translation>> t = TranslateToTessera(no_limit);
    ASSERT_TRUE(t.ok() && t->has_value());
    EXPECT_TRUE((*t)->elastic);
    ParseOptions native;
    native.hami_no_core_limit = NoCoreLimit::kProportional;
    r = ParsePodRequest(Pod(no_limit), native);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->compute_policy, ComputePolicy::kHard);
    EXPECT_FALSE((*TranslateToTessera(no_limit, native))->elastic);
  }
  absl::StatusOr<PodRequest> limited =
      ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}}));
  ASSERT_TRUE(limited.ok());
  EXPECT_EQ(limited->compute_policy, ComputePolicy::kHard);
  // The pod's own policy wins.
  absl::StatusOr<PodRequest> own = ParsePodRequest(
      Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}}, {{"tessera.dev/compute-policy", "hard"}}));
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->compute_policy, ComputePolicy::kHard);
  // Tessera's own names keep Tessera's rule.
  absl::StatusOr<PodRequest> native = ParsePodRequest(Pod({{"tessera.dev/gpu-memory", "4000"}}));
  ASSERT_TRUE(native.ok());
  EXPECT_EQ(native->compute_policy, ComputePolicy::kHard);
}

// gpu-manager limits a share's utilization only with the pod annotation tencent.com/vcuda-core-limit (its README):
// without it the share is elastic, with it hard; whole GPUs are never throttled.
TEST(MigrationTest, GpuManagerShareIsElasticWithoutItsCoreLimitAnnotation) {
  absl::StatusOr<PodRequest> r =
      ParsePodRequest(Pod({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "8"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->compute_policy, ComputePolicy::kElastic);
  r = ParsePodRequest(Pod({{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "8"}},
                          {{"tencent.com/vcuda-core-limit", "30"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->compute_policy, ComputePolicy::kHard);
  r = ParsePodRequest(Pod({{"tencent.com/vcuda-core", "200"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->compute_policy, ComputePolicy::kHard);
}

// HAMi's nvidia.com/priority: 0 is high, anything else low (HAMi's documentation); it asks for no GPU itself and
// never stays in the resources (no node advertises it).
TEST(MigrationTest, HamiTaskPriorityIsThePodsPriority) {
  absl::StatusOr<PodRequest> r =
      ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/priority", "0"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->priority, Priority::kHigh);
  r = ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/priority", "1"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->priority, Priority::kLow);
  absl::StatusOr<std::optional<Translation>> t =
      TranslateToTessera({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/priority", "0"}});
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->priority, Priority::kHigh);
  EXPECT_FALSE((*t)->resources.contains("nvidia.com/priority"));
  // Alone it asks for nothing, and still goes.
  t = TranslateToTessera({{"nvidia.com/priority", "0"}, {"cpu", "1"}});
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->resources, (ResourceList{{"cpu", "1"}}));
  // Disagreeing with the pod's annotation: refused, naming both.
  EXPECT_THAT(Error(Pod({{"nvidia.com/gpu", "1"}, {"nvidia.com/priority", "0"}}, {{"tessera.dev/priority", "low"}})),
              HasSubstr("keep one of them"));
}

// HAMi's use-gputype / nouse-gputype match a model by case-insensitive substring (its own example is
// "Tesla V100-PCIE-32GB"; users write "A100"); Tessera's annotations match exactly.
TEST(MigrationTest, HamiGpuTypeIsASubstringTesseraModelIsExact) {
  Cluster cluster;
  for (const char* model : {"NVIDIA A100-SXM4-80GB", "Tesla V100-PCIE-32GB", "NVIDIA H100 80GB HBM3"}) {
    NodeInfo n;
    n.name = NodeName(StrCat("node-", model));
    GpuInfo g;
    g.uuid = GpuUuid(StrCat("GPU-", model));
    g.model = model;
    g.memory = MiB(32768);
    n.gpus.push_back(g);
    ASSERT_TRUE(cluster.AddNode(n).ok());
  }
  absl::StatusOr<PodRequest> hami =
      ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/use-gputype", "a100,V100"}}));
  ASSERT_TRUE(hami.ok());
  EXPECT_TRUE(hami->model_include_substring);
  std::vector<int> ids;
  for (const std::string& m : hami->model_include) {
    for (int id : cluster.ModelIds(m, hami->model_include_substring)) ids.push_back(id);
  }
  EXPECT_EQ(ids.size(), 2u);
  absl::StatusOr<PodRequest> own =
      ParsePodRequest(Pod({{"tessera.dev/gpu", "1"}}, {{"tessera.dev/gpu-model", "A100"}}));
  ASSERT_TRUE(own.ok());
  EXPECT_FALSE(own->model_include_substring);
  EXPECT_TRUE(cluster.ModelIds("A100", false).empty());
  EXPECT_EQ(cluster.ModelIds("NVIDIA A100-SXM4-80GB", false).size(), 1u);
  EXPECT_TRUE(cluster.ModelIds("", true).empty()) << "an empty word matches nothing";
}

TEST(MigrationTest, HamiNumaBindIsTesseras) {
  absl::StatusOr<PodRequest> r = ParsePodRequest(Pod({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/numa-bind", "true"}}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->numa_bind);
  EXPECT_THAT(Error(Pod({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/numa-bind", "yes"}})),
              HasSubstr("nvidia.com/numa-bind is \"yes\"; write true or false"));
}

// HAMi's chart renames its resources; Tessera reads the names the cluster used.
TEST(MigrationTest, HamiResourceNamesAreConfigurable) {
  ParseOptions o;
  ASSERT_TRUE(ParseHamiNames("gpu=example.com/vgpu, memory=example.com/vgpu-mem", &o.hami).ok());
  absl::StatusOr<PodRequest> r =
      ParsePodRequest(Pod({{"example.com/vgpu", "1"}, {"example.com/vgpu-mem", "3000"}}), o);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers.size(), 1u);
  EXPECT_EQ(r->containers[0].vgpus[0].memory.value, 3000);
  absl::StatusOr<std::optional<Translation>> t =
      TranslateToTessera({{"example.com/vgpu", "1"}, {"example.com/vgpu-mem", "3000"}}, o);
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->resources, (ResourceList{{"tessera.dev/gpu", "1"}, {"tessera.dev/gpu-memory", "3000"}}));
  // Renamed away, the old name is no GPU resource any more.
  EXPECT_FALSE(ParsePodRequest(Pod({{"nvidia.com/gpumem", "3000"}}), o)->wants_gpu());
  HamiNames names;
  EXPECT_THAT(std::string(ParseHamiNames("gpus=x.io/g", &names).message()), HasSubstr("unknown HAMi resource"));
  EXPECT_THAT(std::string(ParseHamiNames("gpu=vgpu", &names).message()), HasSubstr("domain/name"));
  EXPECT_THAT(std::string(ParseHamiNames("gpu=tessera.dev/gpu", &names).message()), HasSubstr("another system"));
}

// ACK's multi-GPU gpushare: aliyun.com/gpu-count GPUs (a pod label, or the resource), gpu-mem split evenly.
TEST(MigrationTest, GpushareCountSplitsTheMemory) {
  PodSpec labelled = Pod({{"aliyun.com/gpu-mem", "8"}});
  labelled.labels["aliyun.com/gpu-count"] = "4";
  absl::StatusOr<PodRequest> r = ParsePodRequest(labelled);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->containers[0].vgpus.size(), 4u);
  EXPECT_EQ(r->containers[0].vgpus[0].memory.value, 2048);
  EXPECT_EQ(VGpus({{"aliyun.com/gpu-count", "2"}, {"aliyun.com/gpu-mem", "8"}}),
            (std::vector<VGpuDemand>{{MilliGpu(0), {MemorySpec::Kind::kMiB, 4096}},
                                     {MilliGpu(0), {MemorySpec::Kind::kMiB, 4096}}}));
  absl::StatusOr<std::optional<Translation>> t =
      TranslateToTessera({{"aliyun.com/gpu-mem", "8"}}, {}, std::optional<int64_t>(4));
  ASSERT_TRUE(t.ok() && t->has_value());
  EXPECT_EQ((*t)->resources, (ResourceList{{"tessera.dev/gpu", "4"}, {"tessera.dev/gpu-memory", "2048"}}));
  ParseOptions mib;
  mib.gpushare_memory_unit = MiB(1);
  PodSpec odd = Pod({{"aliyun.com/gpu-mem", "1001"}});
  odd.labels["aliyun.com/gpu-count"] = "2";
  EXPECT_THAT(Error(odd, mib), HasSubstr("not a whole number of MiB each"));
  PodSpec bad = Pod({{"aliyun.com/gpu-mem", "8"}});
  bad.labels["aliyun.com/gpu-count"] = "two";
  EXPECT_THAT(Error(bad), HasSubstr("write the number of GPUs"));
}

TEST(MigrationTest, WarningsNameWhatIsIgnored) {
  PodSpec pod = Pod({{"nvidia.com/gpu", "1"}}, {{"hami.io/gpu-scheduler-policy", "spread"},
                                                 {"hami.io/node-scheduler-policy", "binpack"},
                                                 {"nvidia.com/vgpu-mode", "mig"}});
  std::vector<std::string> w = MigrationWarnings(pod);
  ASSERT_EQ(w.size(), 3u);
  EXPECT_THAT(w[0], HasSubstr("hami.io/node-scheduler-policy=binpack is ignored"));
  EXPECT_THAT(w[1], HasSubstr("hami.io/gpu-scheduler-policy=spread is ignored"));
  EXPECT_THAT(w[2], HasSubstr("MIG"));
  EXPECT_TRUE(MigrationWarnings(Pod({{"nvidia.com/gpu", "1"}}, {{"nvidia.com/vgpu-mode", "hami-core"}})).empty());
}

}  // namespace
}  // namespace tessera::core
