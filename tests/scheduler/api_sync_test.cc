// ApiSync: Kubernetes objects (as the informers deliver them) into the cluster cache. The node objects carry
// the annotations tessera-node writes (src/formats/inventory.h), the pods the ones the extender's bind writes
// (src/formats/assignment.h).
#include "scheduler/api_sync.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "formats/assignment.h"
#include "formats/inventory.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;
using Clock = std::chrono::system_clock;

CacheOptions Options() {
  CacheOptions o;
  o.policy = "binpack";
  o.seed = 7;
  return o;
}

formats::GpuInventory Inventory(const std::string& node, int gpus) {
  core::NodeInfo info = testing::MakeNode(node, gpus);
  formats::GpuInventory inv;
  for (const core::GpuInfo& g : info.gpus) inv.gpus.push_back({g, "", "", ""});
  inv.links = core::LinkMatrix(gpus);
  inv.source = "fake:test";
  return inv;
}

json Node(const std::string& name, const std::string& inventory, Clock::time_point heartbeat,
          bool cordoned = false) {
  json node = {{"metadata", {{"name", name}, {"uid", "uid-" + name}, {"annotations", json::object()}}},
               {"spec", {{"unschedulable", cordoned}}}};
  if (!inventory.empty()) node["metadata"]["annotations"][formats::kGpuInventoryAnnotation] = inventory;
  node["metadata"]["annotations"][formats::kHeartbeatAnnotation] = formats::FormatHeartbeat(heartbeat);
  return node;
}

json Pod(const std::string& name, const std::string& node, const std::string& assignment,
         const std::string& phase = "Running") {
  json pod = {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
              {"spec",
               {{"nodeName", node},
                {"containers",
                 {{{"name", "main"},
                   {"resources",
                    {{"limits", {{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "1024"}}}}}}}}}},
              {"status", {{"phase", phase}}}};
  if (!assignment.empty()) pod["metadata"]["annotations"][formats::kAnnotationAssignment] = assignment;
  return pod;
}

std::string AssignmentOn(const std::string& node, const std::string& uuid) {
  core::Placement p;
  p.node = core::NodeName(node);
  core::ContainerAssignment c;
  c.name = "main";
  c.vgpus.push_back({-1, core::GpuUuid(uuid), core::MilliGpu(300), core::MiB(1024)});
  p.containers.push_back(c);
  return formats::FormatAssignment(p);
}

TEST(ApiSyncTest, NodesFromTheAgentsAnnotations) {
  ClusterCache cache(Options());
  ApiSync sync(cache, {});
  const std::string inv = formats::SerializeGpuInventory(Inventory("n1", 2));
  sync.OnNode(Node("n1", inv, Clock::now()));
  sync.OnNode(Node("cpu-only", "", Clock::now()));
  EXPECT_EQ(cache.node_count(), 1);
  const core::Cluster snap = cache.Snapshot();
  ASSERT_NE(snap.FindNode(core::NodeName("n1")), nullptr);
  EXPECT_TRUE(snap.FindNode(core::NodeName("n1"))->schedulable());
  // Cordoned: kept, but no new pods.
  sync.OnNode(Node("n1", inv, Clock::now(), /*cordoned=*/true));
  EXPECT_FALSE(cache.Snapshot().FindNode(core::NodeName("n1"))->schedulable());
  // The agent stops publishing (the node is no longer a GPU node): removed.
  sync.OnNode(Node("n1", "", Clock::now()));
  EXPECT_EQ(cache.node_count(), 0);
}

TEST(ApiSyncTest, AStaleHeartbeatStopsNewPodsUntilItIsFresh) {
  ClusterCache cache(Options());
  ApiSync sync(cache, {.heartbeat_timeout = std::chrono::seconds(60)});
  const auto t0 = Clock::now();
  sync.OnNode(Node("n1", formats::SerializeGpuInventory(Inventory("n1", 1)), t0));
  sync.CheckHeartbeats(t0 + std::chrono::seconds(30));
  EXPECT_TRUE(cache.Snapshot().FindNode(core::NodeName("n1"))->schedulable());
  sync.CheckHeartbeats(t0 + std::chrono::seconds(61));
  EXPECT_FALSE(cache.Snapshot().FindNode(core::NodeName("n1"))->schedulable());
  EXPECT_EQ(sync.counters().stale_nodes, 1);
  sync.OnNode(Node("n1", formats::SerializeGpuInventory(Inventory("n1", 1)), Clock::now()));
  sync.CheckHeartbeats(Clock::now());
  EXPECT_TRUE(cache.Snapshot().FindNode(core::NodeName("n1"))->schedulable());
}

TEST(ApiSyncTest, ABadInventoryKeepsTheLastGoodOneAndIsReportedOnce) {
  ClusterCache cache(Options());
  ApiSync sync(cache, {});
  sync.OnNode(Node("n1", formats::SerializeGpuInventory(Inventory("n1", 2)), Clock::now()));
  sync.OnPod(Pod("a", "n1", AssignmentOn("n1", "GPU-n1-0")));
  sync.OnNode(Node("n1", R"({"version":1,"gpus":"oops"})", Clock::now()));
  sync.OnNode(Node("n1", R"({"version":1,"gpus":"oops"})", Clock::now()));
  EXPECT_EQ(cache.node_count(), 1);
  EXPECT_EQ(cache.pod_count(), 1);
  std::vector<Problem> problems = sync.TakeProblems();
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].kind, "Node");
  EXPECT_EQ(problems[0].reason, "TesseraBadInventory");
  EXPECT_THAT(problems[0].message, HasSubstr("last good inventory"));
  // A node never seen with a good inventory is not added.
  sync.OnNode(Node("n2", "{", Clock::now()));
  EXPECT_EQ(cache.node_count(), 1);
  EXPECT_THAT(sync.TakeProblems().at(0).message, HasSubstr("no GPU pods"));
}

TEST(ApiSyncTest, PodsHoldTheirGpusUntilTheyFinishOrGo) {
  ClusterCache cache(Options());
  ApiSync sync(cache, {});
  sync.OnNode(Node("n1", formats::SerializeGpuInventory(Inventory("n1", 1)), Clock::now()));
  sync.OnPod(Pod("a", "n1", AssignmentOn("n1", "GPU-n1-0")));
  sync.OnPod(Pod("b", "n1", AssignmentOn("n1", "GPU-n1-0")));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 400);
  sync.OnPod(Pod("a", "n1", AssignmentOn("n1", "GPU-n1-0"), "Succeeded"));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 700);
  sync.OnPodDeleted(Pod("b", "n1", ""));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 1000);
  // Pods without GPUs pass through.
  json plain = {{"metadata", {{"name", "web"}, {"namespace", "default"}, {"uid", "w"}}},
                {"spec", {{"nodeName", "n1"}, {"containers", {{{"name", "c"}}}}}}};
  sync.OnPod(plain);
  EXPECT_EQ(cache.pod_count(), 0);
  EXPECT_TRUE(sync.TakeProblems().empty());
}

TEST(ApiSyncTest, AnUnreadableAssignmentIsReportedOnThePodAndCountsNothing) {
  ClusterCache cache(Options());
  ApiSync sync(cache, {});
  sync.OnNode(Node("n1", formats::SerializeGpuInventory(Inventory("n1", 1)), Clock::now()));
  sync.OnPod(Pod("a", "n1", R"({"version":1,"node":"n1","containers":[{"name":"main","vgpus":[{}]}]})"));
  sync.OnPod(Pod("b", "n1", AssignmentOn("n1", "GPU-nope")));
  EXPECT_EQ(cache.pod_count(), 0);
  std::vector<Problem> problems = sync.TakeProblems();
  ASSERT_EQ(problems.size(), 2u);
  EXPECT_EQ(problems[0].kind, "Pod");
  EXPECT_EQ(problems[0].name, "a");
  EXPECT_THAT(problems[0].message, HasSubstr("uuid"));
  EXPECT_THAT(problems[1].message, HasSubstr("GPU-nope"));
  EXPECT_EQ(sync.counters().bad_assignments, 2);
}

}  // namespace
}  // namespace tessera::scheduler
