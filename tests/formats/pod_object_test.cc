// Pod objects as the API server and kube-scheduler send them.
#include "formats/pod_object.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "test_util.h"

namespace tessera::formats {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

TEST(PodObjectTest, ReadsARealPod) {
  absl::StatusOr<PodObject> pod =
      ParsePodObject(json::parse(testing::ReadTestData("extender/pod-share.json")));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->key(), "serving/infer-7d9f8-x2k4p");
  EXPECT_EQ(pod->spec.uid, "5a0c3f5e-2b7d-4f7e-9a51-7c1d2f3e4a01");
  EXPECT_EQ(pod->scheduler_name, "tessera-scheduler");
  EXPECT_EQ(pod->phase, "Pending");
  EXPECT_TRUE(pod->node_name.empty());
  ASSERT_EQ(pod->spec.containers.size(), 2u);
  EXPECT_EQ(pod->spec.containers[0].limits.at("tessera.dev/gpu-cores"), "30");
  EXPECT_EQ(pod->spec.containers[0].requests.at("cpu"), "1");
  EXPECT_EQ(pod->spec.annotations.at("tessera.dev/gpu-model"), "T4,A100-SXM4-80GB");
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod->spec);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->containers.size(), 1u);
  EXPECT_EQ(request->model_include.size(), 2u);
}

TEST(PodObjectTest, WrongTypesAreNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"([1])", "a JSON object"},
      {R"({"spec":{}})", "metadata is missing"},
      {R"({"metadata":{"name":3}})", "metadata.name must be a string"},
      {R"({"metadata":{"name":"p","annotations":{"a":1}}})", "annotations[\"a\"]"},
      {R"({"metadata":{"name":"p"},"spec":{"containers":{}}})", "spec.containers must be a list"},
      {R"({"metadata":{"name":"p"},"spec":{"containers":[{"name":"c","resources":{"limits":{"cpu":[1]}}}]}})",
       "spec.containers[0].resources.limits[\"cpu\"]"},
      {R"({"metadata":{"name":"p"},"spec":{"containers":[{"securityContext":{"privileged":"yes"}}]}})",
       "privileged"},
  };
  for (const auto& [text, expected] : cases) {
    absl::StatusOr<PodObject> pod = ParsePodObject(json::parse(text));
    ASSERT_FALSE(pod.ok()) << text;
    EXPECT_THAT(std::string(pod.status().message()), HasSubstr(expected)) << text;
  }
  // Numbers where the API writes quantity strings are accepted.
  absl::StatusOr<PodObject> pod = ParsePodObject(
      json::parse(R"({"metadata":{"name":"p","deletionTimestamp":"2026-01-01T00:00:00Z"},)"
                  R"("spec":{"containers":[{"name":"c","resources":{"limits":{"tessera.dev/gpu":1}}}]}})"));
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(pod->spec.containers[0].limits.at("tessera.dev/gpu"), "1");
  EXPECT_TRUE(pod->deleting);
  EXPECT_EQ(pod->spec.ns, "default");
}

}  // namespace
}  // namespace tessera::formats
