// The pod-resources client against the fake kubelet's PodResourcesLister, over a real unix socket.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/strings.h"
#include "fake_kubelet.h"
#include "kubelet/pod_resources_client.h"
#include "temp_dir.h"

namespace tessera::kubelet {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using tessera::testing::TempDir;

PodResources TrainingPod() {
  PodResources p;
  p.name = "train-0";
  p.ns = "research";
  ContainerResources main;
  main.name = "main";
  main.devices.push_back({"tessera.dev/gpu", {"GPU-a::0", "GPU-b::0"}, {0}});
  main.devices.push_back({"example.com/nic", {"nic-1"}, {}});
  main.cpu_ids = {2, 3, 4, 5};
  main.memory.push_back({"memory", uint64_t{1} << 34, {0}});
  ContainerResources sidecar;
  sidecar.name = "sidecar";
  p.containers = {main, sidecar};
  return p;
}

class PodResourcesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeKubeletOptions o;
    o.plugin_dir = dir_.path() + "/device-plugins";
    o.pod_resources_socket = dir_.path() + "/pod-resources/kubelet.sock";
    auto k = FakeKubelet::Start(o);
    ASSERT_TRUE(k.ok()) << k.status();
    kubelet_ = *std::move(k);
    auto c = PodResourcesClient::Connect(o.pod_resources_socket);
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
  }

  TempDir dir_;
  std::unique_ptr<FakeKubelet> kubelet_;
  std::unique_ptr<PodResourcesClient> client_;
};

TEST_F(PodResourcesTest, List) {
  absl::StatusOr<std::vector<PodResources>> empty = client_->List();
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->empty());

  PodResources other;
  other.name = "web";
  other.ns = "default";
  other.containers.push_back({"nginx", {}, {}, {}});
  kubelet_->SetPodResources({TrainingPod(), other});
  absl::StatusOr<std::vector<PodResources>> pods = client_->List();
  ASSERT_TRUE(pods.ok()) << pods.status();
  ASSERT_EQ(pods->size(), 2u);
  EXPECT_EQ((*pods)[0], TrainingPod());
  EXPECT_EQ((*pods)[1], other);
  EXPECT_THAT((*pods)[0].containers[0].DeviceIds("tessera.dev/gpu"), ElementsAre("GPU-a::0", "GPU-b::0"));
  EXPECT_TRUE((*pods)[0].containers[1].DeviceIds("tessera.dev/gpu").empty());
}

TEST_F(PodResourcesTest, Get) {
  kubelet_->SetPodResources({TrainingPod()});
  absl::StatusOr<PodResources> pod = client_->Get("research", "train-0");
  ASSERT_TRUE(pod.ok()) << pod.status();
  EXPECT_EQ(*pod, TrainingPod());
  absl::StatusOr<PodResources> missing = client_->Get("research", "train-9");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(missing.status()), HasSubstr("no pod research/train-9"));
}

TEST_F(PodResourcesTest, GetAllocatableResources) {
  AllocatableResources a;
  a.devices.push_back({"tessera.dev/gpu", {"GPU-a::0", "GPU-a::1"}, {0}});
  a.cpu_ids = {0, 1, 2, 3};
  a.memory.push_back({"hugepages-1Gi", uint64_t{1} << 30, {1}});
  kubelet_->SetAllocatable(a);
  absl::StatusOr<AllocatableResources> got = client_->GetAllocatableResources();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, a);
}

TEST_F(PodResourcesTest, KubeletDown) {
  kubelet_->Stop();
  absl::StatusOr<std::vector<PodResources>> pods = client_->List();
  ASSERT_FALSE(pods.ok());
  EXPECT_EQ(pods.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(Message(pods.status()), HasSubstr("is the kubelet running"));
  EXPECT_THAT(Message(pods.status()), HasSubstr("pod-resources/kubelet.sock"));
  // And back.
  ASSERT_TRUE(kubelet_->Restart().ok());
  kubelet_->SetPodResources({TrainingPod()});
  absl::StatusOr<std::vector<PodResources>> again;
  for (int i = 0; i < 100; ++i) {  // the channel reconnects with backoff; retry like the agent's reconciler
    again = client_->List();
    if (again.ok()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->size(), 1u);
}

TEST(PodResourcesClientTest, RelativePath) {
  EXPECT_THAT(Message(PodResourcesClient::Connect("kubelet.sock").status()), HasSubstr("absolute path"));
}

}  // namespace
}  // namespace tessera::kubelet
