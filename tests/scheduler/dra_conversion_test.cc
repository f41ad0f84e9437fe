// What --extended-resources-to-dra reads of the cluster (dra_conversion.h): the driver's slices, the nodes'
// allocatable and their agents' inventory and heartbeat. The webhook's rewrite itself is tested in
// admission_test.cc (AdmissionDraTest).
#include "scheduler/dra_conversion.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "formats/inventory.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

// A ResourceSlice as tessera-node publishes it (docs/dra.md, "What the node publishes"): memory in
// kube-apiserver's canonical form.
std::shared_ptr<const json> Slice(const std::string& driver, const std::vector<std::string>& memories) {
  json devices = json::array();
  for (size_t i = 0; i < memories.size(); ++i) {
    devices.push_back({{"name", "gpu-" + std::to_string(i)},
                       {"capacity", {{"cores", {{"value", "100"}}}, {"memory", {{"value", memories[i]}}}}}});
  }
  return std::make_shared<const json>(
      json{{"metadata", {{"name", "n-" + driver}}}, {"spec", {{"driver", driver}, {"devices", devices}}}});
}

TEST(DraConversionTest, OfferFromSlicesReadsOnlyTesserasDriver) {
  DraOffer none = OfferFromSlices({});
  EXPECT_FALSE(none.driver);
  EXPECT_TRUE(none.memory_mib.empty());
  DraOffer other = OfferFromSlices({Slice("gpu.nvidia.com", {"80Gi"})});
  EXPECT_FALSE(other.driver);
  DraOffer ours = OfferFromSlices({Slice("gpu.tessera.dev", {"32Gi", "32Gi"}),
                                   Slice("gpu.tessera.dev", {"15360Mi"}), Slice("x", {"1Gi"})});
  EXPECT_TRUE(ours.driver);
  EXPECT_EQ(ours.memory_mib, (std::set<int64_t>{15360, 32768}));
  // A slice with no devices publishes nothing; garbage is skipped.
  EXPECT_FALSE(OfferFromSlices({Slice("gpu.tessera.dev", {})}).driver);
  auto garbage =
      std::make_shared<const json>(json{{"spec", {{"driver", "gpu.tessera.dev"}, {"devices", 7}}}});
  EXPECT_FALSE(OfferFromSlices({garbage, nullptr}).driver);
}

TEST(DraConversionTest, NodeOffersTheDevicePluginOnlyWithGpusAllocatable) {
  EXPECT_TRUE(NodeOffersDevicePlugin(json::parse(R"({"status":{"allocatable":{"tessera.dev/gpu":"80"}}})")));
  // The kubelet counts only healthy devices: a node whose GPUs all went to DRA says 0 (docs/dra.md).
  EXPECT_FALSE(NodeOffersDevicePlugin(json::parse(R"({"status":{"allocatable":{"tessera.dev/gpu":"0"}}})")));
  EXPECT_FALSE(NodeOffersDevicePlugin(json::parse(R"({"status":{"allocatable":{"cpu":"8"}}})")));
  EXPECT_FALSE(
      NodeOffersDevicePlugin(json::parse(R"({"status":{"allocatable":{"tessera.dev/gpu":"lots"}}})")));
  EXPECT_FALSE(NodeOffersDevicePlugin(json::parse(R"([1,2])")));
}

TEST(DraConversionTest, ModeFlag) {
  EXPECT_EQ(*ParseExtendedToDra("auto"), ExtendedToDra::kAuto);
  EXPECT_EQ(*ParseExtendedToDra("always"), ExtendedToDra::kAlways);
  EXPECT_EQ(*ParseExtendedToDra("never"), ExtendedToDra::kNever);
  absl::StatusOr<ExtendedToDra> bad = ParseExtendedToDra("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("auto, always or never"));
  EXPECT_STREQ(ToString(ExtendedToDra::kAuto), "auto");
}

TEST(DraConversionTest, TrackerFollowsNodesAndRereadsSlicesAtMostOnceASecond) {
  FakeClock clock;
  int reads = 0;
  std::vector<std::shared_ptr<const json>> slices;
  DraOfferTracker tracker(
      [&] {
        ++reads;
        return slices;
      },
      std::chrono::seconds(60), clock);
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));  // nothing published yet
  slices.push_back(Slice("gpu.tessera.dev", {"32Gi"}));
  EXPECT_FALSE(tracker.Offer().driver);  // the last reading, within the second
  EXPECT_EQ(reads, 1);
  clock.Advance(std::chrono::milliseconds(1001));
  DraOffer offer = tracker.Offer();
  EXPECT_EQ(reads, 2);
  EXPECT_TRUE(offer.driver);
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, offer));
  // A node that offers the device plugin turns auto off at once; gone (or down to 0 GPUs), on again.
  const json dp =
      json::parse(R"({"metadata":{"name":"a"},"status":{"allocatable":{"tessera.dev/gpu":"8"}}})");
  tracker.OnNode(dp);
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  tracker.OnNode(
      json::parse(R"({"metadata":{"name":"a"},"status":{"allocatable":{"tessera.dev/gpu":"0"}}})"));
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  tracker.OnNode(dp);
  tracker.OnNodeDeleted(dp);
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
}

// A node as tessera-node leaves it: its inventory (GPUs given to DRA marked as gpu_split.cc marks them), its
// heartbeat, and the kubelet's allocatable.
json AgentNode(const std::string& name, int gpus, int given_to_dra,
               std::chrono::system_clock::time_point heartbeat, const std::string& allocatable) {
  core::NodeInfo info = testing::MakeNode(name, gpus);
  formats::GpuInventory inv;
  for (const core::GpuInfo& g : info.gpus) inv.gpus.push_back({g, "", "", ""});
  for (int i = gpus - given_to_dra; i < gpus; ++i) {
    inv.gpus[i].info.health = core::GpuHealth::kUnhealthy;
    inv.gpus[i].health_reason = formats::kDraHealthReason;
  }
  inv.links = core::LinkMatrix(gpus);
  inv.source = "fake:test";
  return {{"metadata",
           {{"name", name},
            {"annotations",
             {{formats::kGpuInventoryAnnotation, formats::SerializeGpuInventory(inv)},
              {formats::kHeartbeatAnnotation, formats::FormatHeartbeat(heartbeat)}}}}},
          {"status", {{"allocatable", {{"tessera.dev/gpu", allocatable}}}}}};
}

TEST(DraConversionTest, ANodeAgentsInventorySaysItServesTheDevicePlugin) {
  const auto now = std::chrono::system_clock::now();
  DevicePluginIntent mixed = NodeDevicePluginIntent(AgentNode("a", 8, 1, now, "0"));
  EXPECT_TRUE(mixed.gpus);
  ASSERT_TRUE(mixed.heartbeat.has_value());
  EXPECT_LT(std::chrono::abs(*mixed.heartbeat - now), std::chrono::milliseconds(1));
  EXPECT_FALSE(NodeDevicePluginIntent(AgentNode("b", 8, 8, now, "0")).gpus);  // --dra-gpus=all
  json garbled = AgentNode("c", 2, 0, now, "0");
  garbled["metadata"]["annotations"][formats::kGpuInventoryAnnotation] = "{not json";
  garbled["metadata"]["annotations"][formats::kHeartbeatAnnotation] = "yesterday";
  DevicePluginIntent none = NodeDevicePluginIntent(garbled);
  EXPECT_FALSE(none.gpus);
  EXPECT_FALSE(none.heartbeat.has_value());
  EXPECT_FALSE(NodeDevicePluginIntent(json::parse(R"({"metadata":{"name":"cpu"}})")).gpus);
}

// The fault harness (tests/cluster/chaos.py, docs/faults.md): tessera-node killed for 0.1 s, the kubelet's
// allocatable at 0 until the plugin registered again, and a 2-GPU pod admitted then became a claim on a node
// with one DRA GPU, gated for good. A live agent that serves device-plugin GPUs keeps `auto` off.
TEST(DraConversionTest, ARestartingDevicePluginDoesNotTurnPodsIntoClaims) {
  FakeClock clock;
  DraOfferTracker tracker(
      [] { return std::vector<std::shared_ptr<const json>>{Slice("gpu.tessera.dev", {"32Gi"})}; },
      std::chrono::seconds(60), clock);
  tracker.OnNode(AgentNode("a", 8, 1, clock.Now(), "70"));
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  // The plugin restarts: allocatable 0, the heartbeat fresh.
  tracker.OnNode(AgentNode("a", 8, 1, clock.Now(), "0"));
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  clock.Advance(std::chrono::seconds(60));
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));  // within --heartbeat-timeout
  // The agent gone for longer than the extender waits for a heartbeat: its GPUs are no longer offered.
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  // Back, its heartbeat fresh (the inventory unchanged, not read again): off again.
  tracker.OnNode(AgentNode("a", 8, 1, clock.Now(), "0"));
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  // The agent restarted with every GPU given to DRA: the new inventory is read, and auto converts at once.
  tracker.OnNode(AgentNode("a", 8, 8, clock.Now(), "0"));
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  tracker.OnNode(AgentNode("a", 8, 1, clock.Now(), "0"));
  EXPECT_FALSE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
  tracker.OnNodeDeleted(AgentNode("a", 8, 1, clock.Now(), "0"));
  EXPECT_TRUE(ShouldConvert(ExtendedToDra::kAuto, tracker.Offer()));
}

core::ContainerSpec Container(const std::string& name) {
  core::ContainerSpec c;
  c.name = name;
  return c;
}

// More GPUs than a node has cannot be one claim (the parser refuses them first; the conversion holds anyway).
TEST(DraConversionTest, CountsBeyondANodeAreRefused) {
  core::PodRequest request;
  core::ContainerRequest c;
  c.name = "main";
  c.vgpus.assign(65, core::VGpuDemand{core::kWholeGpu, {}});
  request.containers.push_back(c);
  core::PodSpec spec;
  spec.containers.push_back(Container("main"));
  absl::StatusOr<Conversion> out = ConvertToClaims(request, spec, {.driver = true}, {});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("at most 64"));
  c.vgpus.resize(64);
  request.containers[0] = c;
  out = ConvertToClaims(request, spec, {.driver = true}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->templates[0].name, "tessera-gpu-x64");
  EXPECT_EQ(out->templates[0].spec["devices"]["requests"][0]["exactly"]["count"], 64);
}

// A share with neither compute nor memory (the parser never makes one): refused, not read from nothing.
TEST(DraConversionTest, AShareOfNothingIsRefused) {
  core::PodRequest request;
  request.containers.push_back({"main", {core::VGpuDemand{core::MilliGpu(0), {}}}});
  core::PodSpec spec;
  spec.containers.push_back(Container("main"));
  absl::StatusOr<Conversion> out =
      ConvertToClaims(request, spec, {.driver = true, .memory_mib = {32768}}, {});
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()), HasSubstr("neither compute nor memory"));
}

// A container name too long for "gpu-" + name to be a DNS label: the claim is named by its index.
TEST(DraConversionTest, LongContainerNamesGiveIndexedClaimNames) {
  const std::string name(62, 'a');
  core::PodRequest request;
  request.containers.push_back({name, {core::VGpuDemand{core::kWholeGpu, {}}}});
  core::PodSpec spec;
  spec.containers.push_back(Container("other"));
  spec.containers.push_back(Container(name));
  absl::StatusOr<Conversion> out = ConvertToClaims(request, spec, {}, {});
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->claims[0].claim, "gpu-1");
  EXPECT_EQ(out->claims[0].index, 1u);
  EXPECT_FALSE(out->claims[0].init);
}

}  // namespace
}  // namespace tessera::scheduler
