// The DRA kubelet plugin over real gRPC, called the way the kubelet calls it (pkg/kubelet/cm/dra/plugin in
// Kubernetes v1.37.2: GetInfo on the registration socket, the "v1.DRAPlugin" service at the endpoint it names,
// one answer per claim UID). The real kubelet drives it in tests/cluster/test_dra.py.
#include "kubelet/dra_plugin.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <mutex>
#include <thread>

#include "dra-v1-api.grpc.pb.h"
#include "pluginregistration-v1-api.grpc.pb.h"
#include "temp_dir.h"

namespace tessera::kubelet {
namespace {

namespace drapb = ::k8s::io::kubelet::pkg::apis::dra::v1;
using tessera::testing::TempDir;

class RecordingBackend : public DraBackend {
 public:
  absl::StatusOr<std::vector<DraPreparedDevice>> Prepare(const DraClaim& claim) override {
    std::lock_guard<std::mutex> lock(mu);
    prepared.push_back(claim.ns + "/" + claim.name + "/" + claim.uid);
    if (claim.name == "broken") return absl::FailedPreconditionError("claim ml/broken is not allocated");
    return std::vector<DraPreparedDevice>{{{"gpu"}, "node-1", "gpu-2", {"tessera.dev/claim=" + claim.uid}, "s1"}};
  }
  absl::Status Unprepare(const DraClaim& claim) override {
    std::lock_guard<std::mutex> lock(mu);
    unprepared.push_back(claim.uid);
    return absl::OkStatus();
  }
  std::mutex mu;
  std::vector<std::string> prepared;
  std::vector<std::string> unprepared;
};

class DraPluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.plugins_dir = dir_.path() + "/plugins";
    config_.registry_dir = dir_.path() + "/plugins_registry";
    config_.watch_period = std::chrono::milliseconds(50);
    auto p = DraPlugin::Create(config_, &backend_);
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = std::move(*p);
    ASSERT_TRUE(plugin_->Start().ok());
  }

  static std::shared_ptr<grpc::Channel> Dial(const std::string& path) {
    return grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  }

  TempDir dir_;
  DraPluginConfig config_;
  RecordingBackend backend_;
  std::unique_ptr<DraPlugin> plugin_;
};

TEST_F(DraPluginTest, RegistersAsTheKubeletsPluginWatcherExpects) {
  EXPECT_EQ(plugin_->registration_socket(), dir_.path() + "/plugins_registry/gpu.tessera.dev-reg.sock");
  auto reg = ::pluginregistration::Registration::NewStub(Dial(plugin_->registration_socket()));
  grpc::ClientContext ctx;
  ::pluginregistration::PluginInfo info;
  ASSERT_TRUE(reg->GetInfo(&ctx, {}, &info).ok());
  EXPECT_EQ(info.type(), "DRAPlugin");  // k8s.io/kubelet pluginregistration/v1 constants.go
  EXPECT_EQ(info.name(), "gpu.tessera.dev");
  EXPECT_EQ(info.endpoint(), dir_.path() + "/plugins/gpu.tessera.dev/dra.sock");
  ASSERT_EQ(info.supported_versions_size(), 1);
  EXPECT_EQ(info.supported_versions(0), "v1.DRAPlugin");  // k8s.io/kubelet dra/v1 types.go
  EXPECT_FALSE(plugin_->registered());
  grpc::ClientContext ctx2;
  ::pluginregistration::RegistrationStatus status;
  status.set_plugin_registered(true);
  ::pluginregistration::RegistrationStatusResponse none;
  ASSERT_TRUE(reg->NotifyRegistrationStatus(&ctx2, status, &none).ok());
  EXPECT_TRUE(plugin_->registered());
}

TEST_F(DraPluginTest, EachClaimGetsItsOwnAnswer) {
  auto dra = drapb::DRAPlugin::NewStub(Dial(plugin_->service_socket()));
  drapb::NodePrepareResourcesRequest request;
  for (const char* name : {"good", "broken"}) {
    drapb::Claim* c = request.add_claims();
    c->set_namespace_("ml");
    c->set_name(name);
    c->set_uid(std::string("uid-") + name);
  }
  drapb::NodePrepareResourcesResponse response;
  grpc::ClientContext ctx;
  ASSERT_TRUE(dra->NodePrepareResources(&ctx, request, &response).ok());
  ASSERT_EQ(response.claims_size(), 2);
  const drapb::NodePrepareResourceResponse& good = response.claims().at("uid-good");
  EXPECT_EQ(good.error(), "");
  ASSERT_EQ(good.devices_size(), 1);
  EXPECT_EQ(good.devices(0).pool_name(), "node-1");
  EXPECT_EQ(good.devices(0).device_name(), "gpu-2");
  EXPECT_EQ(good.devices(0).request_names(0), "gpu");
  EXPECT_EQ(good.devices(0).cdi_device_ids(0), "tessera.dev/claim=uid-good");
  EXPECT_EQ(good.devices(0).share_id(), "s1");
  EXPECT_EQ(response.claims().at("uid-broken").error(), "claim ml/broken is not allocated");
  EXPECT_EQ(response.claims().at("uid-broken").devices_size(), 0);

  drapb::NodeUnprepareResourcesRequest un;
  un.add_claims()->set_uid("uid-good");
  drapb::NodeUnprepareResourcesResponse unresponse;
  grpc::ClientContext ctx2;
  ASSERT_TRUE(dra->NodeUnprepareResources(&ctx2, un, &unresponse).ok());
  EXPECT_EQ(unresponse.claims().at("uid-good").error(), "");
  EXPECT_EQ(backend_.unprepared, std::vector<std::string>{"uid-good"});
  const DraPluginStats s = plugin_->stats();
  EXPECT_EQ(s.prepared, 1u);
  EXPECT_EQ(s.prepare_errors, 1u);
  EXPECT_EQ(s.unprepared, 1u);
  const std::string metrics = plugin_->MetricsText();
  EXPECT_NE(metrics.find("tessera_dra_claims_prepared_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tessera_dra_prepare_errors_total 1\n"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("tessera_dra_registered 0\n"), std::string::npos) << metrics;
}

TEST_F(DraPluginTest, ASocketRemovedUnderItIsServedAgain) {
  ASSERT_EQ(unlink(plugin_->registration_socket().c_str()), 0);
  // Waits for the watcher (polling every 50 ms here) to notice; bounded, not timed.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (plugin_->stats().server_starts < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(plugin_->stats().server_starts, 2u);
  auto reg = ::pluginregistration::Registration::NewStub(Dial(plugin_->registration_socket()));
  grpc::ClientContext ctx;
  ::pluginregistration::PluginInfo info;
  EXPECT_TRUE(reg->GetInfo(&ctx, {}, &info).ok());
}

TEST(DraPluginCreateTest, RefusesADriverNameThatIsNotOne) {
  RecordingBackend backend;
  DraPluginConfig config;
  config.driver = "a/b";
  EXPECT_FALSE(DraPlugin::Create(config, &backend).ok());
  EXPECT_FALSE(DraPlugin::Create(DraPluginConfig{}, nullptr).ok());
}

}  // namespace
}  // namespace tessera::kubelet
