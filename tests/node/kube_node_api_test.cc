// KubeNodeApi against the fake API server (tools/fake-apiserver, real HTTP): the node's pods through the
// field selector, annotation merge patches on pods and the node, events.
#include "node/kube_node_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "fake_apiserver.h"
#include "nlohmann/json.hpp"

namespace tessera::node {
namespace {

using ::nlohmann::json;

json Pod(const std::string& name, const std::string& node) {
  json pod = {{"apiVersion", "v1"},
              {"kind", "Pod"},
              {"metadata", {{"name", name}, {"namespace", "default"}, {"annotations", {{"keep", "me"}}}}},
              {"spec", {{"containers", {{{"name", "main"}, {"image", "busybox"}}}}}}};
  if (!node.empty()) pod["spec"]["nodeName"] = node;
  return pod;
}

TEST(KubeNodeApiTest, SeesItsNodesPodsAndWritesAnnotationsAndEvents) {
  absl::StatusOr<std::unique_ptr<fake::FakeApiServer>> server = fake::FakeApiServer::Start();
  ASSERT_TRUE(server.ok()) << server.status();
  fake::FakeApiServer& s = **server;
  ASSERT_TRUE(s.Create("nodes", "", json{{"metadata", {{"name", "gpu-1"}}}}).ok());
  ASSERT_TRUE(s.Create("pods", "default", Pod("mine", "gpu-1")).ok());
  ASSERT_TRUE(s.Create("pods", "default", Pod("other", "gpu-2")).ok());
  k8s::ClientConfig config;
  config.server = s.url();
  absl::StatusOr<std::unique_ptr<k8s::KubeApi>> kube = k8s::NewKubeApi(config);
  ASSERT_TRUE(kube.ok());
  auto api = std::make_unique<KubeNodeApi>(**kube, "gpu-1");

  absl::StatusOr<std::vector<NodePod>> pods = api->ListNodePods();
  ASSERT_TRUE(pods.ok());
  ASSERT_EQ(pods->size(), 1u);
  EXPECT_EQ((*pods)[0].name, "mine");

  ASSERT_TRUE(api->PatchPodAnnotations("default", "mine",
                                       {{"tessera.dev/phase", "allocated"}, {"keep", std::nullopt}})
                  .ok());
  json mine = *s.Get("pods", "default", "mine");
  EXPECT_EQ(mine["metadata"]["annotations"]["tessera.dev/phase"], "allocated");
  EXPECT_FALSE(mine["metadata"]["annotations"].contains("keep"));
  EXPECT_TRUE(absl::IsNotFound(api->PatchPodAnnotations("default", "gone", {{"a", "b"}})));

  ASSERT_TRUE(api->PatchNodeAnnotations({{"tessera.dev/heartbeat", "2026-11-22T12:00:00.000Z"}}).ok());
  EXPECT_EQ((*s.Get("nodes", "", "gpu-1"))["metadata"]["annotations"]["tessera.dev/heartbeat"],
            "2026-11-22T12:00:00.000Z");

  ASSERT_TRUE(api->PostEvent({"default", "mine", "", "Warning", "MalformedAssignment", "bad"}).ok());
  std::vector<json> events = s.List("events", "default");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["involvedObject"]["name"], "mine");
  EXPECT_EQ(events[0]["source"]["host"], "gpu-1");

  // A pod scheduled to the node later shows up in the next list.
  ASSERT_TRUE(s.Create("pods", "default", Pod("late", "gpu-1")).ok());
  bool seen = false;
  for (int i = 0; i < 500 && !seen; ++i) {
    pods = api->ListNodePods();
    seen = pods.ok() && pods->size() == 2;
    if (!seen) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(seen);
}

}  // namespace
}  // namespace tessera::node
