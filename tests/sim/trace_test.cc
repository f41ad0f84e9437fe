#include "sim/trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tessera::sim {
namespace {

using ::testing::HasSubstr;

TEST(TraceTest, Nodes) {
  absl::StatusOr<std::vector<TraceNode>> n = ParseNodeCsv(
      "sn,cpu_milli,memory_mib,gpu,model\nnode-1,64000,262144,2,P100\ncpu-node,32000,1000,0,\n", "n.csv");
  ASSERT_TRUE(n.ok()) << n.status();
  ASSERT_EQ(n->size(), 2u);
  EXPECT_EQ((*n)[0].gpus, 2);
  EXPECT_EQ((*n)[0].model, "P100");
  core::NodeInfo info = ToNodeInfo((*n)[0]);
  EXPECT_EQ(info.cpu.value(), 64000);
  EXPECT_EQ(info.gpus.size(), 2u);
  EXPECT_EQ(info.gpus[1].uuid.value(), "node-1-gpu1");
}

TEST(TraceTest, PodsWithAndWithoutSpecColumns) {
  absl::StatusOr<std::vector<TracePod>> full = ParsePodCsv(
      "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
      "scheduled_time\n"
      "p0,12000,16384,1,460,V100M16|V100M32,LS,Running,0,10,0\np1,6000,100,0,0,,BE,Running,0,1,0\n",
      "p.csv");
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ((*full)[0].gpu_spec, (std::vector<std::string>{"V100M16", "V100M32"}));
  core::PodRequest r = ToPodRequest((*full)[0], "p0");
  ASSERT_EQ(r.containers.size(), 1u);
  EXPECT_EQ(r.containers[0].vgpus[0].cores.value(), 460);
  EXPECT_EQ(r.model_include.size(), 2u);
  EXPECT_FALSE(ToPodRequest((*full)[1], "p1").wants_gpu());
  // The multigpu files have only the first five columns.
  absl::StatusOr<std::vector<TracePod>> five =
      ParsePodCsv("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,32000,1024,8,1000\n", "m.csv");
  ASSERT_TRUE(five.ok());
  EXPECT_EQ(ToPodRequest((*five)[0], "p").containers[0].vgpus.size(), 8u);
}

TEST(TraceTest, ErrorsNameTheLine) {
  auto pod_error = [](const std::string& text) {
    absl::StatusOr<std::vector<TracePod>> p = ParsePodCsv(text, "p.csv");
    EXPECT_FALSE(p.ok());
    return p.ok() ? std::string() : std::string(p.status().message());
  };
  EXPECT_THAT(pod_error(""), HasSubstr("the file is empty"));
  EXPECT_THAT(pod_error("name,cpu\n"),
              HasSubstr("line 1: the header lacks cpu_milli, memory_mib, num_gpu, gpu_milli"));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,x,1,1,100\n"),
              HasSubstr("p.csv line 2: cpu_milli is \"x\""));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,2,500\n"),
              HasSubstr("several GPUs must be whole"));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,0\n"), HasSubstr("both are 0"));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1,1,1,2000\n"),
              HasSubstr("0 to 1000"));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli,name\np,1,1,1,100\n"),
              HasSubstr("column \"name\" appears twice"));
  EXPECT_THAT(pod_error("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n,1,1,1,100\n"), HasSubstr("no name"));
  absl::StatusOr<std::vector<TraceNode>> n =
      ParseNodeCsv("sn,cpu_milli,memory_mib,gpu,model\nn,1,1,4,\n", "n.csv");
  ASSERT_FALSE(n.ok());
  EXPECT_THAT(std::string(n.status().message()), HasSubstr("n.csv line 2: node n has 4 GPUs but no model"));
  // Too large for a replay: a message, not bad_alloc later.
  std::string big = "sn,cpu_milli,memory_mib,gpu,model\n";
  for (size_t i = 0; i <= kMaxTraceNodes; ++i) big += "n" + std::to_string(i) + ",1,1,1,T4\n";
  absl::StatusOr<std::vector<TraceNode>> too_many = ParseNodeCsv(big, "n.csv");
  ASSERT_FALSE(too_many.ok());
  EXPECT_THAT(std::string(too_many.status().message()), HasSubstr("at most 50000"));
}

}  // namespace
}  // namespace tessera::sim
