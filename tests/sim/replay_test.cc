#include "sim/replay.h"

#include <gtest/gtest.h>

#include <set>

#include "core/strings.h"
#include "sim/metrics.h"
#include "sim/report.h"
#include "sim/trace.h"
#include "sim/workload.h"

namespace tessera::sim {
namespace {

// 10 nodes of 4 GPUs; 60 pods asking 30 GPUs in all (75% of 40).
ReplayInput SmallInput() {
  std::string nodes = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (int i = 0; i < 10; ++i) nodes += StrCat("n", i, ",32000,131072,4,", i < 5 ? "T4" : "V100M32", "\n");
  std::string pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n";
  for (int i = 0; i < 60; ++i) {
    const int kind = i % 4;
    pods += StrCat("p", i < 10 ? "0" : "", i, ",", 2000 + 1000 * (i % 5), ",8192,", kind == 3 ? 0 : 1, ",",
                   kind == 0   ? 1000
                   : kind == 1 ? 500
                   : kind == 2 ? 500
                               : 0,
                   ",", i % 7 == 0 && kind != 3 ? "T4" : "", "\n");
  }
  return ReplayInput::Make(*LoadCluster(nodes, "nodes"), *LoadPods(pods, "pods"));
}

int64_t Total(const std::vector<const core::PodRequest*>& order) {
  int64_t t = 0;
  for (const core::PodRequest* p : order) t += GpuMilli(*p);
  return t;
}

TEST(ArrivalOrderTest, ShuffledThenScaledUpWithClonesAtTheEnd) {
  ReplayInput in = SmallInput();
  std::vector<core::PodRequest> clones;
  std::vector<const core::PodRequest*> order = *ArrivalOrder(in.pods, in.capacity_milli, 1.3, 42, clones);
  // The originals first, each once, shuffled; then the clones.
  std::set<std::string> firsts;
  for (size_t i = 0; i < in.pods.size(); ++i) firsts.insert(order[i]->name);
  EXPECT_EQ(firsts.size(), in.pods.size());
  bool shuffled = false;
  for (size_t i = 0; i < in.pods.size(); ++i) shuffled = shuffled || order[i]->name != in.pods[i].name;
  EXPECT_TRUE(shuffled);
  for (size_t i = in.pods.size(); i < order.size(); ++i)
    EXPECT_NE(order[i]->name.find("-clone-"), std::string::npos);
  // Scaled to 130% of 40 GPUs without passing it, and no further clone would fit under it... up to one pod.
  EXPECT_LE(Total(order), 52000);
  EXPECT_GT(Total(order), 52000 - 1000);
  // Same seed, same order; another seed, another.
  std::vector<core::PodRequest> c2;
  std::vector<const core::PodRequest*> again = *ArrivalOrder(in.pods, in.capacity_milli, 1.3, 42, c2);
  ASSERT_EQ(again.size(), order.size());
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(again[i]->name, order[i]->name);
  std::vector<core::PodRequest> c3;
  std::vector<const core::PodRequest*> other = *ArrivalOrder(in.pods, in.capacity_milli, 1.3, 43, c3);
  bool differs = false;
  for (size_t i = 0; i < std::min(other.size(), order.size()); ++i)
    differs = differs || other[i]->name != order[i]->name;
  EXPECT_TRUE(differs);
}

TEST(ArrivalOrderTest, ScaledDownByRemovals) {
  ReplayInput in = SmallInput();
  std::vector<core::PodRequest> clones;
  std::vector<const core::PodRequest*> order = *ArrivalOrder(in.pods, in.capacity_milli, 0.5, 7, clones);
  EXPECT_TRUE(clones.empty());
  EXPECT_LE(Total(order), 20000);
  EXPECT_LT(order.size(), in.pods.size());
}

// A pod asking `milli` thousandths of one GPU.
core::PodRequest Tiny(const std::string& name, int milli) {
  core::PodRequest r;
  r.name = name;
  r.uid = core::PodUid(name);
  if (milli > 0) r.containers.push_back({"main", {core::VGpuDemand{core::MilliGpu(milli), {}}}});
  return r;
}

// --inflate on a large cluster with tiny pods used to clone until bad_alloc.
TEST(ArrivalOrderTest, ClonesPastTheTracePodCapAreRefused) {
  const std::vector<core::PodRequest> tiny = {Tiny("a", 1)};
  // 10 x 800,000 GPUs of 1-thousandth pods: 8 billion arrivals, refused before a run.
  absl::Status s = CheckArrivals(tiny, 800'000'000, 10);
  EXPECT_TRUE(absl::IsResourceExhausted(s)) << s;
  EXPECT_NE(std::string(s.message()).find("a replay takes at most 5000000"), std::string::npos) << s;
  std::vector<core::PodRequest> clones;
  EXPECT_TRUE(absl::IsResourceExhausted(ArrivalOrder(tiny, 800'000'000, 10, 1, clones).status()));
  EXPECT_TRUE(clones.empty());
  // Pods without GPU add no GPU, so CheckArrivals cannot bound them in advance: half the clones here ask for
  // none, and the whole GPU pods alone stay under the cap. ArrivalOrder stops at the cap as it clones.
  const std::vector<core::PodRequest> mixed = {Tiny("g", 1000), Tiny("cpu", 0)};
  EXPECT_TRUE(CheckArrivals(mixed, 3'000'000'000, 1).ok());
  EXPECT_TRUE(absl::IsResourceExhausted(ArrivalOrder(mixed, 3'000'000'000, 1, 1, clones).status()));
  // Within the cap, nothing changes.
  EXPECT_TRUE(CheckArrivals(mixed, 100'000, 1.3).ok());
  absl::StatusOr<std::vector<const core::PodRequest*>> fine = ArrivalOrder(mixed, 100'000, 1.3, 1, clones);
  ASSERT_TRUE(fine.ok()) << fine.status();
  EXPECT_GT(fine->size(), 100u);
}

TEST(ReplayTest, RecordsEveryArrival) {
  ReplayInput in = SmallInput();
  for (const char* policy : {"tessera", "fgd", "bestfit", "packing", "clustering", "dotprod", "random",
                             "gaia", "binpack", "spread", "gpushare"}) {
    absl::StatusOr<RunResult> r = Replay(in, policy, 42, 1.3);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status();
    ASSERT_EQ(r->events.size(), r->pods);
    int failed = 0;
    for (const auto& [shape, n] : r->failed_by_shape) failed += n;
    EXPECT_EQ(r->placed + static_cast<size_t>(failed), r->pods) << policy;
    int64_t previous = 0;
    for (const Event& e : r->events) {
      ASSERT_GE(e.arrived_milli, previous);
      previous = e.arrived_milli;
      ASSERT_LE(e.used_milli, in.capacity_milli);
      ASSERT_EQ(e.used_milli + e.idle_milli, in.capacity_milli);
      ASSERT_GE(e.frag_milli, 0);
      ASSERT_LE(e.frag_milli, static_cast<double>(e.idle_milli) + 1e-6);
    }
    EXPECT_GT(r->placed, 0u) << policy;
  }
  EXPECT_FALSE(Replay(in, "fastest", 1, 1.3).ok());
}

TEST(ReplayTest, FailureCauses) {
  core::Cluster c =
      *LoadCluster("sn,cpu_milli,memory_mib,gpu,model\nt4,4000,8192,1,T4\nv,64000,65536,1,V100M32\n", "n");
  core::PodRequest big_cpu = ToPodRequest({"p", 8000, 1024, 1, 500, {"T4"}}, "p");
  EXPECT_EQ(FailureCause(c, big_cpu), "cpu-memory");  // the T4 has room, not the CPU
  core::PodRequest t4 = ToPodRequest({"q", 1000, 1024, 1, 500, {"T4"}}, "q");
  core::Placement hold;
  hold.node = core::NodeName("t4");
  hold.containers.push_back({"main", {{0, core::GpuUuid(), core::MilliGpu(800), core::MiB(10)}}, -1, ""});
  ASSERT_TRUE(c.Commit(ToPodRequest({"h", 0, 0, 1, 800, {}}, "h"), hold).ok());
  EXPECT_EQ(FailureCause(c, t4), "gpu-model");  // room only on the V100
  core::PodRequest two = ToPodRequest({"r", 1000, 1024, 2, 1000, {}}, "r");
  EXPECT_EQ(FailureCause(c, two), "gpu");  // no node has two free GPUs
  EXPECT_EQ(FailureCause(c, ToPodRequest({"s", 999999, 1, 0, 0, {}}, "s")), "cpu-memory");
}

TEST(MetricsTest, NoCapacityNoCurve) {
  RunResult r;
  r.capacity_milli = 0;
  r.events = {{0, 0, 0, 0}};
  EXPECT_TRUE(std::isnan(BinRun(r, 130).allocated_pct[0]));
}

TEST(ReplayTest, RepeatedNamesAreStillDistinctPods) {
  ReplayInput in =
      ReplayInput::Make(*LoadCluster("sn,cpu_milli,memory_mib,gpu,model\nn,8000,8192,4,T4\n", "n"),
                        *LoadPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,500\n"
                                  "p,1,1,1,500\nq,1,1,1,500\n",
                                  "p"));
  absl::StatusOr<RunResult> r = Replay(in, "tessera", 1, 0.375);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->placed, 3u);
}

TEST(ReplayTest, UnhealthyGpusAreNotCapacity) {
  ReplayInput in = ReplayInput::Make(
      *LoadCluster("nodes:\n  - name: a\n    gpus:\n      - {model: T4, memoryMiB: 15360}\n"
                   "      - {model: T4, memoryMiB: 15360, healthy: false}\n",
                   "c.yaml"),
      *LoadPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1,1,1,500\nb,1,1,1,500\nc,1,1,1,500\n"
                "d,1,1,1,500\n",
                "p"));
  EXPECT_EQ(in.capacity_milli, 1000);
  absl::StatusOr<RunResult> r = Replay(in, "fgd", 1, 2.0);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->placed, 2u);
  EXPECT_EQ(r->events.back().used_milli, 1000);
  EXPECT_EQ(r->events.back().idle_milli, 0);
}

TEST(ReplayTest, FailureCausesSeeModelsTwoAndAHalfAndQuota) {
  core::Cluster c = *LoadCluster("sn,cpu_milli,memory_mib,gpu,model\nv,64000,65536,4,V100M32\n", "n");
  // Excluded model: room exists only on a model the pod may not use.
  core::PodRequest no_v100 = ToPodRequest({"x", 1000, 1024, 1, 500, {}}, "x");
  no_v100.model_exclude = {"V100M32"};
  EXPECT_EQ(FailureCause(c, no_v100), "gpu-model");
  // "2.5 GPUs" on a node with four free GPUs has room.
  core::PodRequest two_and_half = ToPodRequest({"y", 1000, 1024, 1, 500, {}}, "y");
  two_and_half.containers[0].vgpus = {
      {core::kWholeGpu, {}}, {core::kWholeGpu, {}}, {core::MilliGpu(500), {}}};
  EXPECT_EQ(FailureCause(c, two_and_half), "other");
  // A quota that refuses it.
  c.SetQuota(core::Namespace("default"), "V100M32", core::MilliGpu(100));
  core::PodRequest quota = ToPodRequest({"z", 1000, 1024, 1, 500, {}}, "z");
  EXPECT_EQ(FailureCause(c, quota), "other");
}

TEST(MetricsTest, BinsByRoundedArrivedShareAndFallsBackToNeighbours) {
  RunResult r;
  r.policy = "p";
  r.capacity_milli = 100000;
  // Arrivals at 9.6% and 10.4% (both round to 10), and 12.2% (12); nothing rounds to 11 or 13.
  r.events = {{9600, 9000, 0, 91000}, {10400, 10000, 0, 90000}, {12200, 11000, 0, 89000}};
  Curve c = BinRun(r, 13);
  EXPECT_DOUBLE_EQ(c.allocated_pct[10], 9.5);
  EXPECT_DOUBLE_EQ(c.allocated_pct[12], 11.0);
  EXPECT_DOUBLE_EQ(c.allocated_pct[11], (9.0 + 10.0 + 11.0) / 3);  // 10..12
  EXPECT_DOUBLE_EQ(c.allocated_pct[13], 11.0);                     // 12..13
  EXPECT_TRUE(std::isnan(c.allocated_pct[5]));
  // Half to even: 10.5% belongs to 10.
  RunResult half = r;
  half.events = {{10500, 7000, 0, 93000}};
  EXPECT_DOUBLE_EQ(BinRun(half, 13).allocated_pct[10], 7.0);
}

TEST(MetricsTest, SummaryAndReports) {
  ReplayInput in = SmallInput();
  std::vector<RunResult> runs;
  for (uint64_t seed : {1, 2}) {
    runs.push_back(*Replay(in, "tessera", seed, 1.3));
    runs.push_back(*Replay(in, "random", seed, 1.3));
  }
  std::vector<PolicySummary> s = Summarize(runs, {"tessera", "random"}, 130);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].seeds, (std::vector<uint64_t>{1, 2}));
  EXPECT_NEAR(s[0].Mean100(), (s[0].unallocated_at_100[0] + s[0].unallocated_at_100[1]) / 2, 1e-9);
  ReportInfo info;
  info.nodes = "nodes";
  info.pods = "pods";
  info.seeds = {1, 2};
  const std::string json = FormatJson(info, s);
  EXPECT_NE(json.find("\"unallocated_pct_at_100\""), std::string::npos);
  EXPECT_NE(json.find("\"unallocated_pct_at_130\""), std::string::npos);
  EXPECT_NE(json.find("\"tessera\""), std::string::npos);
  const std::string table = FormatTable(info, s);
  EXPECT_NE(table.find("Seeds:    1,2"), std::string::npos);
  const std::string svg = PlotSvg(info, s);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("random"), std::string::npos);
}

TEST(WorkloadTest, YamlFilesToo) {
  absl::StatusOr<core::Cluster> c =
      LoadCluster("nodes:\n  - {name: a, gpus: {model: T4, count: 2, memoryMiB: 15360}}\n", "c.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::vector<core::PodRequest>> p = LoadPods(
      "pods:\n  - name: x\n    replicas: 3\n    containers:\n      - resources: {tessera.dev/gpu-cores: "
      "\"40\"}\n",
      "w.yaml");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->size(), 3u);
  absl::StatusOr<std::vector<core::PodRequest>> bad = LoadPods(
      "pods:\n  - name: x\n    containers:\n      - resources: {tessera.dev/gpu-cores: \"0\"}\n", "w.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(std::string(bad.status().message()).find("w.yaml: pod default/x"), std::string::npos);
}

}  // namespace
}  // namespace tessera::sim
