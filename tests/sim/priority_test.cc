// Priorities in the simulator: trace pods given SharedGPU's priority by QoS class, compression on and off,
// and what the reports say about them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/strings.h"
#include "sim/metrics.h"
#include "sim/replay.h"
#include "sim/report.h"
#include "sim/trace.h"
#include "sim/workload.h"

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kPodHeader[] = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\n";

// One node with one 16 GiB GPU. Pod "a" (best effort, low priority) asks 60%, pod "b" (latency-sensitive)
// 70%: 1.3 GPUs in all, so --inflate 1.3 neither clones nor drops a pod. When "a" arrives first, "b" finds
// 40% free: only compression makes room.
ReplayInput OneGpuInput(const WorkloadOptions& options) {
  const std::string nodes = "sn,cpu_milli,memory_mib,gpu,model\nn0,16000,65536,1,T4\n";
  const std::string pods = StrCat(kPodHeader, "a,1000,1024,1,600,,BE\nb,1000,1024,1,700,,LS\n");
  absl::StatusOr<core::Cluster> cluster = LoadCluster(nodes, "nodes.csv");
  absl::StatusOr<std::vector<core::PodRequest>> workload = LoadPods(pods, "pods.csv", options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_TRUE(workload.ok()) << workload.status();
  return ReplayInput::Make(*std::move(cluster), *std::move(workload));
}

// A seed whose arrival order puts the low-priority pod "a" first.
uint64_t SeedWithLowFirst(const ReplayInput& in) {
  for (uint64_t seed = 1; seed < 100; ++seed) {
    std::vector<core::PodRequest> clones;
    absl::StatusOr<std::vector<const core::PodRequest*>> order =
        ArrivalOrder(in.pods, in.capacity_milli, 1.3, seed, clones);
    EXPECT_TRUE(order.ok()) << order.status();
    EXPECT_EQ(order->size(), 2u);  // no clone, no removal
    if (order->size() == 2 && (*order)[0]->name == "a") return seed;
  }
  ADD_FAILURE() << "no seed in 1..99 puts pod a first";
  return 0;
}

WorkloadOptions LsHighComputeOnly() {
  WorkloadOptions o;
  o.high_priority_qos = {"LS"};
  o.share_memory = WorkloadOptions::ShareMemory::kNone;
  return o;
}

TEST(PriorityReplayTest, CompressionIsTheOnlyRoomForTheHighPriorityPod) {
  const ReplayInput in = OneGpuInput(LsHighComputeOnly());
  ASSERT_EQ(in.pods[1].priority, core::Priority::kHigh);
  ASSERT_EQ(in.pods[0].priority, core::Priority::kLow);
  const uint64_t seed = SeedWithLowFirst(in);

  absl::StatusOr<RunResult> on = Replay(in, "tessera", seed, 1.3);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->placed, 2u);
  // SharedGPU's equations (1) and (2) with one tenant (Wang et al., section 2.3): D = 70% - 40% free = 30%,
  // N = 1, Q = 0, R = 30%: "a" goes from 60% to 30%.
  PriorityCounts want_on;
  want_on.high_pods = 1;
  want_on.high_placed = 1;
  want_on.placed_by_compression = 1;
  want_on.compressed_tenants = 1;
  want_on.compressed_milli = 300;
  EXPECT_EQ(on->priority, want_on);
  EXPECT_EQ(on->priority.high_unplaced(), 0u);
  // The GPU allocated is what the tenants hold (30% + 70%), not what they asked (60% + 70%).
  ASSERT_EQ(on->events.size(), 2u);
  EXPECT_EQ(on->events.back().used_milli, 1000);
  EXPECT_EQ(on->events.back().idle_milli, 0);

  ReplayOptions off_options;
  off_options.compression = false;
  absl::StatusOr<RunResult> off = Replay(in, "tessera", seed, 1.3, nullptr, off_options);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->placed, 1u);
  PriorityCounts want_off;
  want_off.high_pods = 1;
  EXPECT_EQ(off->priority, want_off);
  EXPECT_EQ(off->priority.high_unplaced(), 1u);
  EXPECT_EQ(off->events.back().used_milli, 600);
  EXPECT_EQ(off->failed_by_shape.at("share"), 1);
}

TEST(PriorityReplayTest, EveryPolicyCompressesTheSameWay) {
  const ReplayInput in = OneGpuInput(LsHighComputeOnly());
  const uint64_t seed = SeedWithLowFirst(in);
  for (const std::string& policy : core::PolicyNames()) {
    absl::StatusOr<RunResult> r = Replay(in, policy, seed, 1.3);
    ASSERT_TRUE(r.ok()) << policy << ": " << r.status();
    EXPECT_EQ(r->priority.placed_by_compression, 1u) << policy;
    EXPECT_EQ(r->priority.compressed_milli, 300) << policy;
  }
}

// With memory in proportion to the share, a GPU short of compute is as short of memory, and memory is never
// compressed: the high-priority pod stays out even with compression on.
TEST(PriorityReplayTest, ProportionalMemoryLeavesNothingToCompress) {
  WorkloadOptions options;
  options.high_priority_qos = {"LS"};
  const ReplayInput in = OneGpuInput(options);
  const uint64_t seed = SeedWithLowFirst(in);
  absl::StatusOr<RunResult> r = Replay(in, "tessera", seed, 1.3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->placed, 1u);
  EXPECT_EQ(r->priority.high_unplaced(), 1u);
  EXPECT_EQ(r->priority.placed_by_compression, 0u);
  EXPECT_EQ(r->priority.compressed_tenants, 0u);
}

// The high-priority pod first: it takes the idle GPU, and the low-priority one fits beside it uncompressed...
// only if there is room; here 70% + 60% do not fit, so "a" stays out and nothing is compressed (high-priority
// tenants are never compressed).
TEST(PriorityReplayTest, HighPriorityFirstCompressesNobody) {
  const ReplayInput in = OneGpuInput(LsHighComputeOnly());
  uint64_t seed = 0;
  for (uint64_t s = 1; s < 100 && seed == 0; ++s) {
    std::vector<core::PodRequest> clones;
    if ((*ArrivalOrder(in.pods, in.capacity_milli, 1.3, s, clones))[0]->name == "b") seed = s;
  }
  ASSERT_NE(seed, 0u);
  absl::StatusOr<RunResult> r = Replay(in, "tessera", seed, 1.3);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->placed, 1u);
  EXPECT_EQ(r->priority.high_placed, 1u);
  EXPECT_EQ(r->priority.placed_by_compression, 0u);
  EXPECT_EQ(r->priority.compressed_tenants, 0u);
  EXPECT_EQ(r->events.back().used_milli, 700);
}

TEST(PriorityWorkloadTest, QosClassesBecomePriorities) {
  const std::string pods = StrCat(kPodHeader,
                                  "p0,1000,1024,1,500,,LS\np1,1000,1024,1,500,,BE\n"
                                  "p2,1000,1024,1,1000,,Burstable\np3,1000,1024,0,0,,Guaranteed\n");
  absl::StatusOr<std::vector<core::PodRequest>> plain = LoadPods(pods, "pods.csv");
  ASSERT_TRUE(plain.ok()) << plain.status();
  for (const core::PodRequest& p : *plain) EXPECT_EQ(p.priority, core::Priority::kLow) << p.name;

  WorkloadOptions options;
  options.high_priority_qos = {"LS", "Burstable"};
  absl::StatusOr<std::vector<core::PodRequest>> mapped = LoadPods(pods, "pods.csv", options);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(mapped->size(), 4u);
  EXPECT_EQ((*mapped)[0].priority, core::Priority::kHigh);
  EXPECT_EQ((*mapped)[1].priority, core::Priority::kLow);
  EXPECT_EQ((*mapped)[2].priority, core::Priority::kHigh);
  EXPECT_EQ((*mapped)[3].priority, core::Priority::kLow);
}

TEST(PriorityWorkloadTest, ShareMemoryNoneLeavesWholeGpusAlone) {
  const std::string pods = StrCat(kPodHeader, "s,1000,1024,1,250,,BE\nw,1000,1024,2,1000,,LS\n");
  WorkloadOptions options;
  options.share_memory = WorkloadOptions::ShareMemory::kNone;
  absl::StatusOr<std::vector<core::PodRequest>> r = LoadPods(pods, "pods.csv", options);
  ASSERT_TRUE(r.ok()) << r.status();
  const core::VGpuDemand& share = (*r)[0].containers[0].vgpus[0];
  EXPECT_EQ(share.cores.value(), 250);
  EXPECT_EQ(share.memory.kind, core::MemorySpec::Kind::kMiB);
  EXPECT_EQ(share.memory.value, 0);
  for (const core::VGpuDemand& v : (*r)[1].containers[0].vgpus)
    EXPECT_EQ(v.memory.kind, core::MemorySpec::Kind::kDefault);
}

TEST(PriorityWorkloadTest, QosListRefusesClassesTheTraceLacks) {
  absl::StatusOr<std::vector<std::string>> ok = ParseQosList(" LS, Guaranteed,LS ");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, (std::vector<std::string>{"LS", "Guaranteed"}));
  for (const char* bad : {"XX", "ls", "LS,best-effort"}) {
    absl::StatusOr<std::vector<std::string>> r = ParseQosList(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(r.status().message(), HasSubstr("is not one of the trace's; name among: LS, BE, Burstable, "
                                                "Guaranteed"));
  }
  absl::StatusOr<std::vector<std::string>> empty = ParseQosList(" , ");
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("no qos class named"));
}

TEST(PriorityWorkloadTest, QosWithoutAQosColumnIsRefused) {
  WorkloadOptions options;
  options.high_priority_qos = {"LS"};
  absl::StatusOr<std::vector<core::PodRequest>> csv =
      LoadPods("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\np,1,1,1,500,\n", "old.csv", options);
  ASSERT_FALSE(csv.ok());
  EXPECT_THAT(csv.status().message(), HasSubstr("old.csv: the header has no qos column"));
  absl::StatusOr<std::vector<core::PodRequest>> yaml =
      LoadPods("pods:\n  - name: p\n    containers:\n      - {name: c, resources: {tessera.dev/gpu: 1}}\n",
               "w.yaml", options);
  ASSERT_FALSE(yaml.ok());
  EXPECT_THAT(yaml.status().message(), HasSubstr("tessera.dev/priority: high"));
}

TEST(PriorityReportTest, TableAndJsonShowPrioritiesOnlyWhenAsked) {
  const ReplayInput in = OneGpuInput(LsHighComputeOnly());
  const uint64_t seed = SeedWithLowFirst(in);
  std::vector<RunResult> runs = {*Replay(in, "tessera", seed, 1.3)};
  const std::vector<PolicySummary> summaries = Summarize(runs, {"tessera"}, 130);
  ASSERT_EQ(summaries.size(), 1u);
  EXPECT_TRUE(summaries[0].has_priorities());
  ReportInfo info;
  info.seeds = {seed};
  info.high_priority_qos = {"LS"};
  info.share_memory_none = true;
  const std::string table = FormatTable(info, summaries);
  EXPECT_THAT(table,
              HasSubstr("Priority: qos LS high, the rest low; compression on; shares' GPU memory none"));
  EXPECT_THAT(table, HasSubstr("BY COMPRESSION"));
  // POLICY SEED HIGH PODS HIGH PLACED HIGH UNPLACED BY COMPRESSION COMPRESSED TENANTS SHARE GIVEN UP
  std::string row;
  for (std::string_view line : StrSplit(table, '\n')) {
    if (line.starts_with(StrCat("tessera  ", seed, " "))) row = std::string(line);
  }
  ASSERT_FALSE(row.empty()) << table;
  std::vector<std::string> cells;
  for (std::string_view c : StrSplit(row, ' ')) {
    if (!c.empty()) cells.emplace_back(c);
  }
  EXPECT_EQ(cells,
            (std::vector<std::string>{"tessera", StrCat(seed), "1", "1", "0", "1", "1", "0.30", "GPUs"}));
  const std::string json = FormatJson(info, summaries);
  EXPECT_THAT(json, HasSubstr("\"priority_per_seed\""));
  EXPECT_THAT(json, HasSubstr("\"compressed_milli\": 300"));
  EXPECT_THAT(json, HasSubstr("\"share_memory\": \"none\""));

  // No class named and no high-priority pod: the reports are as before.
  const ReplayInput plain = OneGpuInput({});
  std::vector<RunResult> plain_runs = {*Replay(plain, "tessera", seed, 1.3)};
  const std::vector<PolicySummary> plain_summaries = Summarize(plain_runs, {"tessera"}, 130);
  ReportInfo plain_info;
  plain_info.seeds = {seed};
  EXPECT_THAT(FormatTable(plain_info, plain_summaries), Not(HasSubstr("Priority:")));
  EXPECT_THAT(FormatTable(plain_info, plain_summaries), Not(HasSubstr("BY COMPRESSION")));
  EXPECT_THAT(FormatJson(plain_info, plain_summaries), Not(HasSubstr("priority")));
}

}  // namespace
}  // namespace tessera::sim
