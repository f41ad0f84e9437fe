// The event recorder against the fake API server: Events are created about the object, repeats are folded
// into one Event's count, a failed send is counted and never blocks the caller.
#include "k8s/event_recorder.h"

#include <gtest/gtest.h>

#include "k8s/k8s_test_util.h"

namespace tessera::k8s {
namespace {

using testing::FakeCluster;
using testing::MakeNodeObject;
using testing::MakePod;

TEST(EventRecorderTest, CreatesAndAggregatesEvents) {
  FakeCluster c;
  FakeClock clock;
  absl::StatusOr<Json> pod = c.api->Create(kPods, "team", MakePod("web-0", "team"));
  absl::StatusOr<Json> node = c.api->Create(kNodes, "", MakeNodeObject("gpu-1"));
  ASSERT_TRUE(pod.ok() && node.ok());
  EventRecorder events(*c.api, {.component = "tessera-node",
                                .instance = "gpu-1",
                                .host = "gpu-1",
                                .aggregate_window = std::chrono::seconds(600),
                                .clock = &clock});
  ObjectReference ref = ReferenceTo(*pod, kPods);
  events.Record(ref, "Warning", "FailedAllocate", "no free vGPU");
  events.Record(ref, "Warning", "FailedAllocate", "no free vGPU");
  events.Record(ref, "Normal", "Allocated", "vGPU 0 on GPU-1234");
  events.Record(ReferenceTo(*node, kNodes), "Normal", "InventoryPublished", "8 GPUs");
  events.Flush();
  EventRecorderStats s = events.stats();
  EXPECT_EQ(s.created, 3);
  EXPECT_EQ(s.aggregated, 1);
  EXPECT_EQ(s.failed, 0);

  std::vector<Json> in_team = c.server->List("events", "team");
  ASSERT_EQ(in_team.size(), 2u);
  int failed_count = 0;
  for (const Json& e : in_team) {
    EXPECT_EQ(e["involvedObject"]["uid"], Uid(*pod));
    EXPECT_EQ(e["source"]["component"], "tessera-node");
    EXPECT_EQ(e["source"]["host"], "gpu-1");
    if (e["reason"] == "FailedAllocate") failed_count = e["count"].get<int>();
  }
  EXPECT_EQ(failed_count, 2);
  // An event about a cluster-scoped object goes to "default".
  std::vector<Json> in_default = c.server->List("events", "default");
  ASSERT_EQ(in_default.size(), 1u);
  EXPECT_EQ(in_default[0]["involvedObject"]["kind"], "Node");

  // After the aggregation window a repeat is a new Event.
  clock.Advance(std::chrono::seconds(601));
  events.Record(ref, "Warning", "FailedAllocate", "no free vGPU");
  events.Flush();
  EXPECT_EQ(events.stats().created, 4);
}

TEST(EventRecorderTest, FailuresAreCountedNotRetried) {
  FakeCluster c;
  EventRecorder events(*c.api, {.component = "tessera-scheduler"});
  c.server->FailRequests({.verb = "create", .status = 403, .count = 1, .reason = "Forbidden"});
  ObjectReference ref{.kind = "Pod", .api_version = "v1", .ns = "default", .name = "p", .uid = "u"};
  events.Record(ref, "Normal", "Bound", "to gpu-1");
  events.Record(ref, "Normal", "Bound", "to gpu-2");
  events.Flush();
  EXPECT_EQ(events.stats().failed, 1);
  EXPECT_EQ(events.stats().created, 1);
  EXPECT_EQ(c.server->List("events", "default").size(), 1u);
}

}  // namespace
}  // namespace tessera::k8s
