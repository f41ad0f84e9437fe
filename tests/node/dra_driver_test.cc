// The DRA driver's pure parts (the ResourceSlice, reading a ResourceClaim's allocation, the CDI spec) and the
// node agent's claims. The whole path against the real kube-apiserver, kube-scheduler and kubelet is in
// tests/cluster/test_dra.py; the field names and shapes here follow resource.k8s.io/v1 (k8s.io/api v0.37.2,
// resource/v1/types.go) and the CDI specification 0.6.0.
#include "node/dra_driver.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "core/strings.h"
#include "hook/common/limits.h"
#include "hook/common/registration.h"
#include "k8s/kube_api.h"
#include "k8s/objects.h"
#include "temp_dir.h"
#include "fake_apiserver.h"

namespace tessera::node {
namespace {

namespace fs = std::filesystem;
using k8s::Json;
using ::testing::HasSubstr;
using tessera::testing::TempDir;

formats::GpuInventory Inventory(int n) {
  formats::GpuInventory inv;
  for (int i = 0; i < n; ++i) {
    formats::InventoryGpu g;
    g.info.uuid = core::GpuUuid(StrCat("GPU-", i));
    g.info.index = i;
    g.info.model = "V100";
    g.info.memory = core::MiB(32768);
    g.info.numa_node = i < n / 2 ? 0 : 1;
    g.cpus = i < n / 2 ? "0-7" : "8-15";
    inv.gpus.push_back(g);
  }
  inv.links = core::LinkMatrix(n, core::Link::Of(core::LinkKind::kSys));
  // GPUs 0-1 and 2-3 joined by NVLink.
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) {
      if (a != b && a / 2 == b / 2) inv.links.Set(a, b, core::Link::NvLink(2));
    }
  }
  inv.source = "test";
  return inv;
}

DraDriverConfig Config() {
  DraDriverConfig c;
  c.node_name = "gpu-1";
  c.gpus = {2, 3};
  return c;
}

// A ResourceClaim as kube-scheduler leaves it: allocated on gpu-1's pool, reserved for one pod.
Json Claim(Json results, Json config = Json::array()) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", "share"}, {"namespace", "ml"}, {"uid", "c1"}}},
          {"status",
           {{"allocation", {{"devices", {{"results", results}, {"config", config}}}}},
            {"reservedFor", Json::array({{{"resource", "pods"}, {"name", "trainer"}, {"uid", "p1"}}})}}}};
}

Json Result(const std::string& device, const std::string& cores, const std::string& memory,
            const std::string& request = "gpu") {
  return {{"request", request},
          {"driver", "gpu.tessera.dev"},
          {"pool", "gpu-1"},
          {"device", device},
          {"shareID", StrCat("share-", device, "-", request)},
          {"consumedCapacity", {{"cores", cores}, {"memory", memory}}}};
}

const kubelet::DraClaim kRef{"ml", "c1", "share"};

TEST(DraDeviceNameTest, RoundTripsAndRefusesLookAlikes) {
  EXPECT_EQ(DraDeviceName(3), "gpu-3");
  EXPECT_EQ(DraDeviceIndex("gpu-3"), 3);
  EXPECT_EQ(DraDeviceIndex("gpu-12"), 12);
  for (const char* bad : {"gpu-", "gpu-01", "gpu-+1", "gpu--1", "gpu-1x", "cpu-1", "", "gpu-99999999999"}) {
    EXPECT_EQ(DraDeviceIndex(bad), -1) << bad;
  }
}

TEST(ResourceSliceTest, PublishesTheGivenGpusAsShareableDevices) {
  const Json slice = ResourceSliceFor(Config(), Inventory(4), "node-uid", 7);
  EXPECT_EQ(slice["apiVersion"], "resource.k8s.io/v1");
  EXPECT_EQ(slice["metadata"]["name"], "gpu-1-gpu.tessera.dev");
  EXPECT_EQ(slice["metadata"]["ownerReferences"][0]["uid"], "node-uid");
  EXPECT_EQ(slice["spec"]["driver"], "gpu.tessera.dev");
  EXPECT_EQ(slice["spec"]["nodeName"], "gpu-1");
  EXPECT_EQ(slice["spec"]["pool"], Json({{"name", "gpu-1"}, {"generation", 7}, {"resourceSliceCount", 1}}));
  const Json& devices = slice["spec"]["devices"];
  ASSERT_EQ(devices.size(), 2u);
  EXPECT_EQ(devices[0]["name"], "gpu-2");
  EXPECT_EQ(devices[0]["allowMultipleAllocations"], true);
  EXPECT_EQ(devices[0]["attributes"]["uuid"]["string"], "GPU-2");
  EXPECT_EQ(devices[0]["attributes"]["numaNode"]["int"], 1);
  EXPECT_EQ(devices[0]["attributes"]["nvlinkDomain"]["int"], 2);
  EXPECT_EQ(devices[1]["attributes"]["nvlinkDomain"]["int"], 2);
  EXPECT_EQ(devices[1]["attributes"]["pcieSwitch"]["int"], 2);
  // Without NVLink, each GPU is a domain of its own; PIX pairs share a switch.
  formats::GpuInventory pcie = Inventory(4);
  pcie.links = core::LinkMatrix(4, core::Link::Of(core::LinkKind::kSys));
  pcie.links.Set(2, 3, core::Link::Of(core::LinkKind::kPix));
  pcie.links.Set(3, 2, core::Link::Of(core::LinkKind::kPix));
  const Json pcie_slice = ResourceSliceFor(Config(), pcie, "", 1);
  EXPECT_EQ(pcie_slice["spec"]["devices"][1]["attributes"]["nvlinkDomain"]["int"], 3);
  EXPECT_EQ(pcie_slice["spec"]["devices"][1]["attributes"]["pcieSwitch"]["int"], 2);
  EXPECT_EQ(devices[0]["capacity"]["cores"]["value"], "100");
  EXPECT_EQ(devices[0]["capacity"]["cores"]["requestPolicy"]["default"], "100");
  // As kube-apiserver writes it back (canonical form), so that an unchanged slice compares equal.
  EXPECT_EQ(devices[0]["capacity"]["memory"]["value"], "32Gi");
  formats::GpuInventory odd = Inventory(4);
  odd.gpus[2].info.memory = core::MiB(81559);  // an H100's 80 GB as NVML reports it
  EXPECT_EQ(ResourceSliceFor(Config(), odd, "", 1)["spec"]["devices"][0]["capacity"]["memory"]["value"], "81559Mi");
  EXPECT_EQ(devices[0]["capacity"]["memory"]["requestPolicy"]["validRange"]["step"], "1Mi");
  EXPECT_FALSE(devices[0].contains("taints"));
}

TEST(ResourceSliceTest, AnUnhealthyGpuIsTainted) {
  formats::GpuInventory inv = Inventory(4);
  inv.gpus[3].info.health = core::GpuHealth::kUnhealthy;
  const Json slice = ResourceSliceFor(Config(), inv, "", 1);
  EXPECT_FALSE(slice["metadata"].contains("ownerReferences"));
  EXPECT_FALSE(slice["spec"]["devices"][0].contains("taints"));
  EXPECT_EQ(slice["spec"]["devices"][1]["taints"][0]["effect"], "NoSchedule");
}

TEST(ReadClaimTest, ASharesAllocationBecomesTheTenantsLimits) {
  auto c = ReadClaim(Claim(Json::array({Result("gpu-2", "30", "8Gi")})), kRef, Config(), Inventory(4));
  ASSERT_TRUE(c.ok()) << c.status();
  const ContainerRecord& r = c->record;
  ASSERT_TRUE(r.claim.has_value());
  EXPECT_EQ(r.claim->uid, "c1");
  EXPECT_EQ(r.claim->consumers, std::vector<std::string>{"p1"});
  EXPECT_EQ(r.pod_uid, "p1");
  EXPECT_EQ(r.pod_name, "trainer");
  ASSERT_EQ(r.vgpus.size(), 1u);
  EXPECT_EQ(r.vgpus[0].uuid.value(), "GPU-2");
  EXPECT_EQ(r.vgpus[0].cores.value(), 300);
  EXPECT_EQ(r.vgpus[0].memory.value(), 8192);
  EXPECT_EQ(r.numa_node, 1);
  EXPECT_EQ(r.cpus, "8-15");
  EXPECT_EQ(r.compute_policy, core::ComputePolicy::kHard);
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].device, "gpu-2");
  EXPECT_EQ(c->devices[0].pool, "gpu-1");
  EXPECT_EQ(c->devices[0].requests, std::vector<std::string>{"gpu"});
  EXPECT_EQ(c->devices[0].share_id, "share-gpu-2-gpu");
}

TEST(ReadClaimTest, WholeGpusAndOpaqueSettings) {
  Json whole = Result("gpu-2", "100", "32768Mi");
  Json other = Result("gpu-3", "100", "32768Mi");
  const Json config = Json::array(
      {{{"source", "FromClaim"},
        {"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"computePolicy", "elastic"}, {"priority", "high"}}}}}},
       {{"source", "FromClaim"}, {"opaque", {{"driver", "other.example.com"}, {"parameters", {{"x", 1}}}}}}});
  auto c = ReadClaim(Claim(Json::array({whole, other}), config), kRef, Config(), Inventory(4));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->record.vgpus.size(), 2u);
  EXPECT_EQ(c->record.vgpus[1].cores.value(), 1000);
  EXPECT_EQ(c->record.vgpus[1].memory.value(), 32768);
  EXPECT_EQ(c->record.compute_policy, core::ComputePolicy::kElastic);
  EXPECT_EQ(c->record.priority, core::Priority::kHigh);
}

TEST(ReadClaimTest, ConfigurationForTheParentRequestOfAnAlternativeApplies) {
  const Json config = Json::array(
      {{{"source", "FromClaim"},
        {"requests", {"gpu"}},
        {"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"computePolicy", "elastic"}}}}}},
       {{"source", "FromClaim"},
        {"requests", {"other"}},
        {"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"priority", "high"}}}}}}});
  auto c = ReadClaim(Claim(Json::array({Result("gpu-2", "30", "8Gi", "gpu/small")}), config), kRef, Config(),
                     Inventory(4));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->record.compute_policy, core::ComputePolicy::kElastic);
  EXPECT_EQ(c->record.priority, core::Priority::kLow);  // configured for another request
  // Reported under the top-level request, the name a container's resources.claims[].request can hold (the
  // kubelet matches it against these names to give the container the claim's CDI device).
  EXPECT_EQ(c->devices[0].requests, std::vector<std::string>{"gpu"});
}

TEST(ReadClaimTest, TwoRequestsOnOneGpuAddUp) {
  auto c = ReadClaim(Claim(Json::array({Result("gpu-2", "30", "4Gi", "a"), Result("gpu-2", "20", "2Gi", "b")})),
                     kRef, Config(), Inventory(4));
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->record.vgpus.size(), 1u);
  EXPECT_EQ(c->record.vgpus[0].cores.value(), 500);
  EXPECT_EQ(c->record.vgpus[0].memory.value(), 6144);
  EXPECT_EQ(c->devices.size(), 2u);
}

TEST(ReadClaimTest, OtherDriversAndNodesAreNotOurs) {
  Json foreign = Result("gpu-2", "30", "8Gi");
  foreign["driver"] = "gpu.nvidia.com";
  Json elsewhere = Result("gpu-2", "30", "8Gi");
  elsewhere["pool"] = "gpu-2";
  auto c = ReadClaim(Claim(Json::array({foreign, elsewhere})), kRef, Config(), Inventory(4));
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(c.status().message(), HasSubstr("allocates no device of driver gpu.tessera.dev on node gpu-1"));
}

TEST(ReadClaimTest, RefusesWhatTheNodeCannotHonour) {
  struct Case {
    const char* what;
    Json claim;
    const char* says;
  };
  Json not_published = Claim(Json::array({Result("gpu-0", "30", "8Gi")}));
  Json too_much = Claim(Json::array({Result("gpu-2", "30", "40Gi")}));
  Json zero = Claim(Json::array({Result("gpu-2", "0", "8Gi")}));
  Json garbage = Claim(Json::array({Result("gpu-2", "thirty", "8Gi")}));
  Json unallocated = Claim(Json::array());
  unallocated["status"].erase("allocation");
  Json unreserved = Claim(Json::array({Result("gpu-2", "30", "8Gi")}));
  unreserved["status"]["reservedFor"] = Json::array();
  Json other_uid = Claim(Json::array({Result("gpu-2", "30", "8Gi")}));
  other_uid["metadata"]["uid"] = "c2";
  Json bad_config = Claim(Json::array({Result("gpu-2", "30", "8Gi")}),
                          Json::array({{{"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"cores", 50}}}}}}}));
  Json bad_policy = Claim(Json::array({Result("gpu-2", "30", "8Gi")}),
                          Json::array({{{"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"computePolicy", "soft"}}}}}}}));
  for (const Case& k : std::vector<Case>{
           {"a device not given to DRA", not_published, "does not publish to DRA"},
           {"more memory than the GPU", too_much, "outside 1-100% and 1-32768 MiB"},
           {"no compute", zero, "outside 1-100%"},
           {"a quantity that is not one", garbage, "consumedCapacity cores"},
           {"no allocation", unallocated, "is not allocated"},
           {"no consumer", unreserved, "reserved for no pod"},
           {"another object of the name", other_uid, "is now another object"},
           {"an unknown parameter", bad_config, "unknown parameter \"cores\""},
           {"an unknown policy", bad_policy, "computePolicy must be"},
       }) {
    auto c = ReadClaim(k.claim, kRef, Config(), Inventory(4));
    ASSERT_FALSE(c.ok()) << k.what;
    EXPECT_THAT(c.status().message(), HasSubstr(k.says)) << k.what;
    EXPECT_THAT(c.status().message(), HasSubstr("ml/share")) << k.what;
  }
  // Not even an object, or fields of the wrong type: an error, never a crash.
  for (const Json& junk : {Json(nullptr), Json::array(), Json({{"metadata", 5}}),
                           Json({{"metadata", {{"uid", "c1"}}}, {"status", {{"allocation", {{"devices", {{"results", 7}}}}}}}}),
                           Json({{"metadata", {{"uid", "c1"}}}, {"status", {{"allocation", {{"devices", {{"results", Json::array({1, "x", nullptr})}}}}}, {"reservedFor", 3}}}})}) {
    EXPECT_FALSE(ReadClaim(junk, kRef, Config(), Inventory(4)).ok()) << junk.dump();
  }
}

TEST(CdiSpecTest, CarriesTheTenantsEnvironmentAndMounts) {
  kubelet::ContainerAllocation edits;
  edits.envs["NVIDIA_VISIBLE_DEVICES"] = "GPU-2";
  edits.envs["TESSERA_LIMITS_FILE"] = "/etc/tessera/limits";
  edits.mounts.push_back({"/etc/tessera", "/var/lib/tessera/containers/p1/claim_c1", true});
  edits.mounts.push_back({"/var/lib/tessera/region", "/var/lib/tessera/regions/p1/claim_c1", false});
  edits.devices.push_back({"/dev/nvidia2", "/dev/nvidia2", "rw"});
  const Json spec = Json::parse(CdiSpec("c1", edits));
  EXPECT_EQ(spec["cdiVersion"], "0.6.0");
  EXPECT_EQ(spec["kind"], "tessera.dev/claim");
  ASSERT_EQ(spec["devices"].size(), 1u);
  EXPECT_EQ(spec["devices"][0]["name"], "c1");
  const Json& e = spec["devices"][0]["containerEdits"];
  EXPECT_EQ(e["env"], Json({"NVIDIA_VISIBLE_DEVICES=GPU-2", "TESSERA_LIMITS_FILE=/etc/tessera/limits"}));
  EXPECT_EQ(e["mounts"][0]["containerPath"], "/etc/tessera");
  EXPECT_EQ(e["mounts"][0]["options"][0], "ro");
  EXPECT_EQ(e["mounts"][1]["options"][0], "rw");
  EXPECT_EQ(e["deviceNodes"][0]["path"], "/dev/nvidia2");
  EXPECT_EQ(CdiDeviceId("c1"), "tessera.dev/claim=c1");
  DraDriverConfig config;
  config.cdi_dir = "/run/cdi";
  EXPECT_EQ(CdiSpecPath(config, "c1"), "/run/cdi/tessera.dev-claim_c1.json");
}

class NoApi : public NodeApi {
 public:
  absl::StatusOr<std::vector<NodePod>> ListNodePods() override { return std::vector<NodePod>{}; }
  absl::Status PatchPodAnnotations(const std::string&, const std::string&, const AnnotationPatch&) override {
    return absl::OkStatus();
  }
  absl::Status PatchNodeAnnotations(const AnnotationPatch&) override { return absl::OkStatus(); }
  absl::Status PostEvent(const NodeEvent&) override { return absl::OkStatus(); }
};

NodeAgentConfig AgentConfig(const TempDir& dir) {
  NodeAgentConfig config;
  config.node_name = "gpu-1";
  config.state_dir = dir.path() + "/state";
  config.proc_root = dir.path() + "/proc";
  return config;
}

TEST(AgentClaimTest, APreparedClaimIsATenantUntilUnpreparedAndSurvivesARestart) {
  TempDir dir;
  const NodeAgentConfig config = AgentConfig(dir);
  NoApi api;
  auto c = ReadClaim(Claim(Json::array({Result("gpu-2", "30", "8Gi")})), kRef, Config(), Inventory(4));
  ASSERT_TRUE(c.ok()) << c.status();
  std::string limits_path;
  {
    NodeAgent agent(config, &api, Inventory(4), nullptr);
    ASSERT_TRUE(agent.Start(/*background=*/false).ok());
    auto r = agent.PrepareClaim(c->record);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->container, "claim_c1");
    limits_path = r->dir + "/limits";
    hook::Limits limits;
    hook::Error error;
    ASSERT_TRUE(hook::ReadLimitsFile(limits_path.c_str(), &limits, &error)) << error.text;
    ASSERT_EQ(limits.device_count, 1);
    EXPECT_STREQ(limits.devices[0].uuid, "GPU-2");
    EXPECT_EQ(limits.devices[0].cores_percent, 30u);
    EXPECT_EQ(limits.devices[0].memory_bytes, uint64_t{8192} << 20);
    // Prepared again (the kubelet after a restart): the same record, no second tenant.
    auto again = agent.PrepareClaim(c->record);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(*again, *r);
    EXPECT_EQ(agent.Records().size(), 1u);
    // ... and with a pod that reserved the claim since: that pod's processes may register now.
    ContainerRecord shared = c->record;
    shared.claim->consumers.push_back("p2");
    auto refreshed = agent.PrepareClaim(shared);
    ASSERT_TRUE(refreshed.ok());
    EXPECT_EQ(refreshed->claim->consumers, (std::vector<std::string>{"p1", "p2"}));
    EXPECT_EQ(refreshed->dir, r->dir);
    ASSERT_EQ(agent.Records().size(), 1u);
    EXPECT_EQ(agent.Records()[0].claim->consumers, (std::vector<std::string>{"p1", "p2"}));
    // A reconcile pass with the pod absent from the API does not collect a claim's tenant.
    ASSERT_TRUE(agent.ReconcileOnce().ok());
    EXPECT_EQ(agent.Records().size(), 1u);
    const kubelet::ContainerAllocation edits = agent.Response(*r);
    EXPECT_EQ(edits.envs.at("NVIDIA_VISIBLE_DEVICES"), "GPU-2");
    EXPECT_EQ(edits.mounts[0].host_path, r->dir);
    agent.Stop();
  }
  {
    NodeAgent agent(config, &api, Inventory(4), nullptr);
    ASSERT_TRUE(agent.Start(/*background=*/false).ok());
    ASSERT_EQ(agent.Records().size(), 1u);  // loaded from its record
    EXPECT_EQ(agent.Records()[0].claim->consumers, (std::vector<std::string>{"p1", "p2"}));  // saved
    ASSERT_TRUE(agent.UnprepareClaim("c1").ok());
    EXPECT_TRUE(agent.Records().empty());
    EXPECT_FALSE(fs::exists(limits_path));
    EXPECT_TRUE(agent.UnprepareClaim("c1").ok());  // again: nothing to do, no error
    agent.Stop();
  }
}

TEST(AgentClaimTest, AClaimOnAGpuTheNodeDoesNotHaveIsRefused) {
  TempDir dir;
  const NodeAgentConfig config = AgentConfig(dir);
  NoApi api;
  NodeAgent agent(config, &api, Inventory(2), nullptr);
  ASSERT_TRUE(agent.Start(/*background=*/false).ok());
  auto c = ReadClaim(Claim(Json::array({Result("gpu-2", "30", "8Gi")})), kRef, Config(), Inventory(4));
  ASSERT_TRUE(c.ok());
  auto r = agent.PrepareClaim(c->record);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("is not a GPU of this node"));
  agent.Stop();
}

// Two allocators deciding at once (a pod handed to kube-scheduler while tessera-scheduler places another)
// could allocate more of a GPU than it has: the agent refuses the claim that would go over (docs/dra.md).
TEST(AgentClaimTest, AClaimThatWouldPutAGpuOverItsCapacityIsRefused) {
  TempDir dir;
  const NodeAgentConfig config = AgentConfig(dir);
  NoApi api;
  NodeAgent agent(config, &api, Inventory(4), nullptr);
  ASSERT_TRUE(agent.Start(/*background=*/false).ok());
  auto first = ReadClaim(Claim(Json::array({Result("gpu-2", "60", "8Gi")})), kRef, Config(), Inventory(4));
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(agent.PrepareClaim(first->record).ok());
  Json second_claim = Claim(Json::array({Result("gpu-2", "60", "8Gi")}));
  second_claim["metadata"]["uid"] = "c2";
  second_claim["metadata"]["name"] = "other";
  auto second = ReadClaim(second_claim, kubelet::DraClaim{"ml", "c2", "other"}, Config(), Inventory(4));
  ASSERT_TRUE(second.ok()) << second.status();
  auto r = agent.PrepareClaim(second->record);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("would carry 1200/1000"));
  EXPECT_EQ(agent.Records().size(), 1u);
  // Within the GPU's capacity it is prepared.
  Json third_claim = Claim(Json::array({Result("gpu-2", "40", "8Gi")}));
  third_claim["metadata"]["uid"] = "c3";
  auto third = ReadClaim(third_claim, kubelet::DraClaim{"ml", "c3", "share"}, Config(), Inventory(4));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_TRUE(agent.PrepareClaim(third->record).ok());
  agent.Stop();
}

// The fake API server with node gpu-1 in it, and a client of it.
struct ApiServer {
  std::unique_ptr<fake::FakeApiServer> server;
  std::unique_ptr<k8s::KubeApi> client;
};

absl::StatusOr<ApiServer> StartApiServer() {
  ApiServer a;
  absl::StatusOr<std::unique_ptr<fake::FakeApiServer>> server = fake::FakeApiServer::Start();
  if (!server.ok()) return server.status();
  a.server = *std::move(server);
  if (absl::StatusOr<Json> node = a.server->Create("nodes", "", Json{{"metadata", {{"name", "gpu-1"}}}}); !node.ok())
    return node.status();
  k8s::ClientConfig config;
  config.server = a.server->url();
  absl::StatusOr<std::unique_ptr<k8s::KubeApi>> client = k8s::NewKubeApi(config);
  if (!client.ok()) return client.status();
  a.client = *std::move(client);
  return a;
}

// The driver against an API server (the fake, following kube-apiserver's REST contract; the real one in
// tests/cluster/test_dra.py): the slice published and followed by health, a claim prepared into a CDI spec and
// unprepared.
TEST(DraDriverTest, PublishesFollowsHealthPreparesAndUnprepares) {
  absl::StatusOr<ApiServer> api = StartApiServer();
  ASSERT_TRUE(api.ok()) << api.status();
  fake::FakeApiServer& s = *api->server;
  k8s::KubeApi* kube = api->client.get();
  TempDir dir;
  NoApi node_api;
  NodeAgent agent(AgentConfig(dir), &node_api, Inventory(4), nullptr);
  ASSERT_TRUE(agent.Start(/*background=*/false).ok());
  DraDriverConfig config = Config();
  config.cdi_dir = dir.path() + "/cdi";
  DraDriver driver(config, kube, &agent, Inventory(4));

  ASSERT_TRUE(driver.PublishSlice().ok());
  Json slice = *s.Get("resourceslices.resource.k8s.io", "", "gpu-1-gpu.tessera.dev");
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 1);
  EXPECT_FALSE(slice["metadata"]["ownerReferences"][0]["uid"].get<std::string>().empty());
  ASSERT_TRUE(driver.PublishSlice().ok());  // unchanged: no new generation
  EXPECT_EQ((*s.Get("resourceslices.resource.k8s.io", "", "gpu-1-gpu.tessera.dev"))["spec"]["pool"]["generation"], 1);
  driver.SetGpuHealth(core::GpuUuid("GPU-3"), false);
  ASSERT_TRUE(driver.PublishSlice().ok());
  slice = *s.Get("resourceslices.resource.k8s.io", "", "gpu-1-gpu.tessera.dev");
  EXPECT_EQ(slice["spec"]["pool"]["generation"], 2);
  EXPECT_EQ(slice["spec"]["devices"][1]["taints"][0]["key"], "gpu.tessera.dev/unhealthy");
  // The kubelet deleted the slice (its plugin was gone a while): published again.
  ASSERT_TRUE(s.Delete("resourceslices.resource.k8s.io", "", "gpu-1-gpu.tessera.dev").ok());
  ASSERT_TRUE(driver.PublishSlice().ok());
  EXPECT_TRUE(s.Get("resourceslices.resource.k8s.io", "", "gpu-1-gpu.tessera.dev").ok());

  Json claim = Claim(Json::array({Result("gpu-2", "30", "8Gi")}));
  ASSERT_TRUE(s.Create("resourceclaims.resource.k8s.io", "ml", claim).ok());
  const std::string uid = (*s.Get("resourceclaims.resource.k8s.io", "ml", "share"))["metadata"]["uid"];
  const kubelet::DraClaim ref{"ml", uid, "share"};
  // The fake gives the claim a UID of its own; the allocation must be read for that one.
  absl::StatusOr<std::vector<kubelet::DraPreparedDevice>> devices = driver.Prepare(ref);
  ASSERT_TRUE(devices.ok()) << devices.status();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].cdi_device_ids, std::vector<std::string>{"tessera.dev/claim=" + uid});
  EXPECT_TRUE(fs::exists(CdiSpecPath(config, uid)));
  EXPECT_EQ(driver.Prepare({"ml", "other-uid", "share"}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(driver.Prepare({"ml", "x", "missing"}).status().code(), absl::StatusCode::kUnavailable);
  ASSERT_TRUE(driver.Unprepare(ref).ok());
  EXPECT_FALSE(fs::exists(CdiSpecPath(config, uid)));
  EXPECT_TRUE(agent.Records().empty());
  agent.Stop();
}

// The node's pods as a test sets them (NoApi lists none).
class ListedApi : public NoApi {
 public:
  absl::StatusOr<std::vector<NodePod>> ListNodePods() override {
    MutexLock lock(&mu_);
    return pods_;
  }
  void Set(std::vector<NodePod> pods) {
    MutexLock lock(&mu_);
    pods_ = std::move(pods);
  }

 private:
  Mutex mu_;
  std::vector<NodePod> pods_ ABSL_GUARDED_BY(mu_);
};

// The kubelet calls NodeUnprepareResources only for what its own records say it prepared for a pod (a pod
// deleted while its prepare was in flight, a lost DRA checkpoint: kubernetes/kubernetes#131513, #140212). The
// driver unprepares such a claim itself, and only when nothing can still use it: the claim gone from the API
// server (404, or its name taken by a claim of another UID), no pod of it in the node's pod list, no process of
// it registered, for the whole grace period; a sweep that cannot read the API decides nothing.
TEST(DraDriverTest, AClaimTheKubeletForgotIsUnpreparedOnlyOnceNothingCanUseIt) {
  absl::StatusOr<ApiServer> api = StartApiServer();
  ASSERT_TRUE(api.ok()) << api.status();
  fake::FakeApiServer& s = *api->server;
  k8s::KubeApi* kube = api->client.get();
  TempDir dir;
  ListedApi node_api;
  NodePod consumer;
  consumer.ns = "ml";
  consumer.name = "trainer";
  consumer.uid = "7f3d2c1e-0000-4000-8000-000000000001";  // a UID a pod's cgroup can name
  node_api.Set({consumer});
  NodeAgent agent(AgentConfig(dir), &node_api, Inventory(4), nullptr);
  ASSERT_TRUE(agent.Start(/*background=*/false).ok());
  DraDriverConfig config = Config();
  config.cdi_dir = dir.path() + "/cdi";
  config.forgotten_claim_grace = std::chrono::milliseconds(0);
  DraDriver driver(config, kube, &agent, Inventory(4));
  DraDriverConfig patient_config = config;
  patient_config.forgotten_claim_grace = std::chrono::hours(1);
  DraDriver patient(patient_config, kube, &agent, Inventory(4));

  Json reserved = Claim(Json::array({Result("gpu-2", "30", "8Gi")}));
  reserved["status"]["reservedFor"][0]["uid"] = consumer.uid;
  ASSERT_TRUE(s.Create("resourceclaims.resource.k8s.io", "ml", reserved).ok());
  const std::string uid = (*s.Get("resourceclaims.resource.k8s.io", "ml", "share"))["metadata"]["uid"];
  const kubelet::DraClaim ref{"ml", uid, "share"};
  ASSERT_TRUE(driver.Prepare(ref).ok());
  auto claim_records = [&] {
    int n = 0;
    for (const ContainerRecord& r : agent.Records()) n += r.is_claim();
    return n;
  };

  // Its pod is on the node.
  EXPECT_EQ(driver.SweepForgottenClaims(), 0);
  // The pod gone from the node's list, but the claim stands in the API server: the kubelet will unprepare it.
  node_api.Set({});
  ASSERT_TRUE(agent.ReconcileOnce().ok());
  EXPECT_EQ(driver.SweepForgottenClaims(), 0);
  // The claim gone from the API while its pod is listed on the node (being torn down: the unprepare to come).
  ASSERT_TRUE(s.Delete("resourceclaims.resource.k8s.io", "ml", "share").ok());
  node_api.Set({consumer});
  ASSERT_TRUE(agent.ReconcileOnce().ok());
  EXPECT_EQ(driver.SweepForgottenClaims(), 0);
  // The pod gone too, but a process of the claim registered (a container still running on the GPU).
  node_api.Set({});
  ASSERT_TRUE(agent.ReconcileOnce().ok());
  dir.Write(StrCat("proc/", getpid(), "/cgroup"),
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7f3d2c1e_0000_4000_8000_000000000001"
            ".slice/cri-containerd-"
            "aa11bb22cc33dd44ee55ff66.scope\n");
  {
    hook::AgentConnection conn;
    hook::Hello hello;
    hello.pid = 7;
    hook::CopyString(hello.lib, sizeof(hello.lib), "cuda");
    hook::CopyString(hello.gpus, sizeof(hello.gpus), "GPU-2");
    hello.generation = 1;
    hook::AgentMessage reply;
    hook::Error error;
    ASSERT_TRUE(conn.Register(agent.registration_socket().c_str(), hello, 5000, &reply, &error)) << error.text;
    ASSERT_EQ(agent.TenantPids(consumer.uid, "claim_" + uid), std::vector<int>{getpid()});
    EXPECT_EQ(driver.SweepForgottenClaims(), 0);
    conn.Close();
  }
  // The process gone (the server hears the EOF on its own thread).
  for (int i = 0; i < 5000 && !agent.TenantPids(consumer.uid, "claim_" + uid).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(agent.TenantPids(consumer.uid, "claim_" + uid).empty());
  // Nothing can use it now, but the API cannot be read: nothing is decided.
  fake::FaultRule failing;
  failing.verb = "get";
  failing.count = -1;
  s.FailRequests(failing);
  EXPECT_EQ(driver.SweepForgottenClaims(), 0);
  s.ClearFaults();
  // Forgotten, but not yet for its grace period.
  EXPECT_EQ(patient.SweepForgottenClaims(), 0);
  EXPECT_EQ(claim_records(), 1);
  // Forgotten for the (zero) grace: unprepared as the kubelet would have, CDI spec included.
  EXPECT_EQ(driver.SweepForgottenClaims(), 1);
  EXPECT_EQ(claim_records(), 0);
  EXPECT_FALSE(fs::exists(CdiSpecPath(config, uid)));
  EXPECT_THAT(driver.MetricsText(), HasSubstr("tessera_node_dra_forgotten_claims_unprepared_total 1\n"));
  // The kubelet's own unprepare, should it come after all, finds nothing to do.
  EXPECT_TRUE(driver.Unprepare(ref).ok());

  // A claim whose name is taken by a new claim (another UID) is forgotten the same way.
  ASSERT_TRUE(s.Create("resourceclaims.resource.k8s.io", "ml", Claim(Json::array({Result("gpu-3", "50", "4Gi")})))
                  .ok());
  const std::string old_uid = (*s.Get("resourceclaims.resource.k8s.io", "ml", "share"))["metadata"]["uid"];
  ASSERT_TRUE(driver.Prepare({"ml", old_uid, "share"}).ok());
  EXPECT_EQ(driver.SweepForgottenClaims(), 0);
  ASSERT_TRUE(s.Delete("resourceclaims.resource.k8s.io", "ml", "share").ok());
  ASSERT_TRUE(s.Create("resourceclaims.resource.k8s.io", "ml", Claim(Json::array({Result("gpu-3", "50", "4Gi")})))
                  .ok());
  ASSERT_NE((*s.Get("resourceclaims.resource.k8s.io", "ml", "share"))["metadata"]["uid"], old_uid);
  EXPECT_EQ(driver.SweepForgottenClaims(), 1);
  EXPECT_EQ(claim_records(), 0);
  agent.Stop();
}

}  // namespace
}  // namespace tessera::node
