// The DRA controller (src/scheduler/dra_controller.h) against the fake API server (tools/fake-apiserver, real
// HTTP): a gated pod placed (claim allocated and reserved, gate lifted), and a placed pod that kube-scheduler
// refuses to bind released and placed again on another node, with the time driven by a FakeClock. There
// is no kube-scheduler here: the test writes the PodScheduled condition as kube-scheduler v1.37 writes it for
// a pod no node takes (False, Unschedulable, its message), and feeds the pods and nodes to the controller as
// tessera-scheduler's informers do (OnPod, OnNode). The slices are what tessera-node publishes
// (src/node/dra_claim.cc), the class deploy/dra/deviceclasses.yaml's gpu.tessera.dev.
#include "scheduler/dra_controller.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <thread>

#include "core/strings.h"
#include "fake_apiserver.h"
#include "formats/assignment.h"
#include "formats/dra_placement.h"
#include "k8s/objects.h"
#include "scheduler/dra_allocator.h"
#include "scheduler/dra_slice.h"

namespace tessera::scheduler {
namespace {

using dra::DraAllocator;
using k8s::Json;
using ::testing::HasSubstr;

const k8s::ResourceType kDeviceClasses{"resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false};

// Two V100s per node.
Json Slice(const std::string& node) {
  return ::tessera::testing::TesseraSlice(node, 2);
}

Json NodeObject(const std::string& name) {
  return {{"apiVersion", "v1"},
          {"kind", "Node"},
          {"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"status", {{"allocatable", {{"cpu", "8"}, {"memory", "32Gi"}}}}}};
}

Json ClaimObject(const std::string& name) {
  return {{"apiVersion", "resource.k8s.io/v1"},
          {"kind", "ResourceClaim"},
          {"metadata", {{"name", name}, {"namespace", "default"}}},
          {"spec",
           {{"devices",
             {{"requests",
               {{{"name", "gpu"},
                 {"exactly",
                  {{"deviceClassName", "gpu.tessera.dev"},
                   {"capacity", {{"requests", {{"cores", "40"}, {"memory", "8Gi"}}}}}}}}}}}}}}};
}

// As the webhook leaves a pod: the gate, the label; the claim named directly.
Json GatedPod(const std::string& name, const std::string& claim) {
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata",
           {{"name", name},
            {"namespace", "default"},
            {"labels", {{formats::kDraPlacementLabel, formats::kDraGated}}}}},
          {"spec",
           {{"schedulingGates", {{{"name", formats::kDraPlacementGate}}}},
            {"resourceClaims", {{{"name", "gpu"}, {"resourceClaimName", claim}}}},
            {"containers",
             {{{"name", "main"},
               {"image", "registry.invalid/app:1"},
               {"resources", {{"requests", {{"cpu", "1"}}}, {"claims", {{{"name", "gpu"}}}}}}}}}}},
          {"status", {{"phase", "Pending"}}}};
}

class DraControllerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<fake::FakeApiServer>> s = fake::FakeApiServer::Start();
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    // resource.k8s.io's other kinds the controller follows (the fake registers slices and claims).
    server_->store().Register({"resource.k8s.io", "v1", "deviceclasses", "DeviceClass", false, false, {}});
    server_->store().Register(
        {"resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", true, false, {}});
    k8s::ClientConfig config;
    config.server = server_->url();
    absl::StatusOr<std::unique_ptr<k8s::KubeApi>> api = k8s::NewKubeApi(config);
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
    ASSERT_TRUE(
        api_->Create(
                kDeviceClasses, "",
                {{"apiVersion", "resource.k8s.io/v1"},
                 {"kind", "DeviceClass"},
                 {"metadata", {{"name", "gpu.tessera.dev"}}},
                 {"spec",
                  {{"selectors", {{{"cel", {{"expression", "device.driver == \"gpu.tessera.dev\""}}}}}}}}})
            .ok());
    for (const char* node : {"node-a", "node-b"}) {
      ASSERT_TRUE(api_->Create(k8s::kResourceSlices, "", Slice(node)).ok());
    }
  }
  void TearDown() override {
    // The controller's thread reads the clock and the quotas until it stops: it stops first.
    if (dra_) dra_->Stop();
    dra_.reset();
    api_.reset();
    if (server_) server_->Stop();
  }
  void StartController(std::chrono::seconds rebind_after, QuotaExchange* quotas = nullptr,
                       std::function<std::optional<int64_t>()> leading_term = nullptr) {
    DraControllerOptions o;
    o.quotas = quotas;
    o.identity = "replica-a";
    o.leading_term = std::move(leading_term);
    o.allocator.seed = 7;
    o.period = std::chrono::milliseconds(10);
    o.rebind_after = rebind_after;
    o.clock = &clock_;
    dra_ = std::make_unique<DraController>(*api_, o, [] { return true; });
    dra_->Start();
    for (const char* node : {"node-a", "node-b"}) dra_->OnNode(NodeObject(node));
  }
  template <typename F>
  bool Eventually(F done) {
    for (int i = 0; i < 2000; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  Json Get(const k8s::ResourceType& type, const std::string& name) {
    absl::StatusOr<Json> got = api_->Get(type, "default", name);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : Json::object();
  }
  static std::string NodeOf(const Json& claim) {
    const Json& results = claim["status"]["allocation"]["devices"]["results"];
    return results.is_array() && !results.empty() ? results[0]["pool"].get<std::string>() : "";
  }
  // A gated pod with its claim, placed by the controller: the claim allocated and reserved, the gate lifted.
  // Returns the pod as the API server has it, fed back to the controller (as the pod informer would).
  Json Place(const std::string& pod_name, const std::string& claim_name) {
    EXPECT_TRUE(api_->Create(k8s::kResourceClaims, "default", ClaimObject(claim_name)).ok());
    absl::StatusOr<Json> pod = api_->Create(k8s::kPods, "default", GatedPod(pod_name, claim_name));
    EXPECT_TRUE(pod.ok()) << pod.status();
    if (!pod.ok()) return Json::object();
    dra_->OnPod(*pod);
    EXPECT_TRUE(Eventually([&] {
      Json p = Get(k8s::kPods, pod_name);
      return p["metadata"]["labels"][formats::kDraPlacementLabel] == formats::kDraPlaced;
    })) << "the controller did not place "
        << pod_name;
    Json placed = Get(k8s::kPods, pod_name);
    dra_->OnPod(placed);
    return placed;
  }
  // kube-scheduler's answer for a pod no node takes (here: a host port taken on the allocation's node).
  Json Refuse(Json pod) {
    pod["status"]["conditions"] = {
        {{"type", "PodScheduled"},
         {"status", "False"},
         {"reason", "Unschedulable"},
         {"message",
          "0/2 nodes are available: 1 node(s) didn't have free ports for the requested pod ports, 1 "
          "node(s) didn't match Pod's node affinity/selector."}}};
    absl::StatusOr<Json> st = api_->Update(k8s::kPods, "default", pod, "status");
    EXPECT_TRUE(st.ok()) << st.status();
    if (!st.ok()) return pod;
    dra_->OnPod(*st);
    return *st;
  }
  std::vector<Json> Events(const std::string& pod, const std::string& reason) {
    std::vector<Json> out;
    absl::StatusOr<k8s::ObjectList> events = api_->List(k8s::kEvents, "default");
    if (!events.ok()) return out;
    for (const Json& e : events->items) {
      if (e["involvedObject"]["name"] == pod && e["reason"] == reason) out.push_back(e);
    }
    return out;
  }
  // Rounds of the controller: enough for anything it would do to be done.
  void LetRoundsPass(int n = 20) {
    const int64_t start = dra_->counters().rounds;
    EXPECT_TRUE(Eventually([&] { return dra_->counters().rounds >= start + n; }));
  }

  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<k8s::KubeApi> api_;
  FakeClock clock_;
  // A test's quotas (the extender's cache, as tessera-scheduler wires it): the fixture's, not the test
  // body's, so they outlive the controller's thread, which TearDown stops (a body's locals are gone before
  // it).
  ClusterCache cache_{CacheOptions{}};
  CacheQuotaExchange exchange_{cache_};
  std::unique_ptr<DraController> dra_;
};

TEST_F(DraControllerTest, ARefusedPodsClaimIsReleasedAfterTheBoundAndPlacedOnAnotherNode) {
  StartController(std::chrono::seconds(30));
  Json pod = Place("p", "c");
  Json claim = Get(k8s::kResourceClaims, "c");
  const std::string first = NodeOf(claim);
  ASSERT_FALSE(first.empty()) << claim.dump();
  EXPECT_TRUE(DraAllocator::AllocatedByTessera(claim)) << claim.dump();
  EXPECT_EQ(claim["status"]["reservedFor"][0]["uid"], pod["metadata"]["uid"]);
  // kube-scheduler's finalizer, without which kube-controller-manager never deallocates the claim
  // (docs/dra.md).
  EXPECT_EQ(claim["metadata"]["finalizers"], Json::array({"resource.kubernetes.io/delete-protection"}))
      << claim.dump();

  pod = Refuse(pod);
  LetRoundsPass();  // the controller's clock for the refusal starts when a round first sees it
  // Refused for less than the bound: kube-scheduler may still bind it (a pod that leaves the node).
  clock_.Advance(std::chrono::seconds(29));
  LetRoundsPass();
  EXPECT_EQ(Get(k8s::kResourceClaims, "c")["metadata"]["resourceVersion"],
            claim["metadata"]["resourceVersion"]);
  EXPECT_EQ(dra_->counters().released, 0);

  clock_.Advance(std::chrono::seconds(2));
  ASSERT_TRUE(Eventually([&] { return dra_->counters().replaced == 1; }))
      << Get(k8s::kResourceClaims, "c").dump();
  Json again = Get(k8s::kResourceClaims, "c");
  const std::string second = NodeOf(again);
  EXPECT_FALSE(second.empty());
  EXPECT_NE(second, first) << "placed again on the node kube-scheduler refused";
  EXPECT_EQ(again["status"]["reservedFor"],
            Json::array({{{"resource", "pods"}, {"name", "p"}, {"uid", pod["metadata"]["uid"]}}}));
  EXPECT_TRUE(DraAllocator::AllocatedByTessera(again));
  EXPECT_EQ(dra_->counters().released, 1);
  // The pod keeps its label and has no gate again (none can be added after creation).
  Json now = Get(k8s::kPods, "p");
  EXPECT_EQ(now["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraPlaced);
  EXPECT_FALSE(now["spec"].contains("schedulingGates") && !now["spec"]["schedulingGates"].empty());
  std::vector<Json> events = Events("p", "TesseraPlacementReleased");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "Warning");
  const std::string message = events[0]["message"];
  EXPECT_THAT(message,
              HasSubstr(StrCat("kube-scheduler has not bound the pod to node ", first, " for 30 s")));
  EXPECT_THAT(message, HasSubstr("didn't have free ports"));
  EXPECT_THAT(message, HasSubstr(StrCat("not on node ", first)));

  // Refused again on the second node (the condition stays as kube-scheduler left it): the clock starts again
  // with the new allocation, and with both nodes refused the claim is released and nothing has room.
  LetRoundsPass();
  EXPECT_EQ(dra_->counters().released, 1);
  clock_.Advance(std::chrono::seconds(31));
  ASSERT_TRUE(Eventually([&] { return dra_->counters().released == 2; }));
  ASSERT_TRUE(Eventually([&] { return !Events("p", "TesseraPlacementWaiting").empty(); }));
  Json waiting = Get(k8s::kResourceClaims, "c");
  EXPECT_FALSE(waiting["status"].contains("allocation")) << waiting.dump();
  EXPECT_FALSE(waiting["status"].contains("reservedFor")) << waiting.dump();
  EXPECT_THAT(Events("p", "TesseraPlacementWaiting")[0]["message"].get<std::string>(),
              HasSubstr("where kube-scheduler would not bind it"));
}

// Where leaders are elected, a claim names the replica and the Lease term before each of its status writes (the
// API server's claim fence, deploy/scheduler/70-leader-fence.yaml, then refuses the status write of a replica
// the Lease has moved past: tests/cluster/test_dra.py); a replica that leads no more writes nothing.
TEST_F(DraControllerTest, ClaimStatusWritesFollowTheLeadersTermAndStopWithTheLeadership) {
  std::atomic<int64_t> term{3};  // -1: leads no more
  StartController(std::chrono::seconds(30), nullptr, [&term]() -> std::optional<int64_t> {
    const int64_t t = term.load();
    return t < 0 ? std::nullopt : std::optional<int64_t>(t);
  });
  Json pod = Place("p", "c");
  Json claim = Get(k8s::kResourceClaims, "c");
  ASSERT_FALSE(NodeOf(claim).empty()) << claim.dump();
  EXPECT_EQ(claim["metadata"]["annotations"][formats::kAnnotationLeader], "replica-a") << claim.dump();
  EXPECT_EQ(claim["metadata"]["annotations"][formats::kAnnotationLeaderTerm], "3") << claim.dump();
  EXPECT_EQ(claim["metadata"]["finalizers"], Json::array({"resource.kubernetes.io/delete-protection"}));
  // Led again in a later term: the release and the new allocation carry that one.
  term = 4;
  pod = Refuse(pod);
  LetRoundsPass();
  clock_.Advance(std::chrono::seconds(31));
  ASSERT_TRUE(Eventually([&] { return dra_->counters().replaced == 1; }));
  Json again = Get(k8s::kResourceClaims, "c");
  EXPECT_FALSE(NodeOf(again).empty());
  EXPECT_EQ(again["metadata"]["annotations"][formats::kAnnotationLeaderTerm], "4") << again.dump();
  // Leading no more (the Lease lost between the round's check and its writes): nothing is allocated.
  term = -1;
  ASSERT_TRUE(api_->Create(k8s::kResourceClaims, "default", ClaimObject("c2")).ok());
  absl::StatusOr<Json> p2 = api_->Create(k8s::kPods, "default", GatedPod("p2", "c2"));
  ASSERT_TRUE(p2.ok()) << p2.status();
  dra_->OnPod(*p2);
  LetRoundsPass();
  Json untouched = Get(k8s::kResourceClaims, "c2");
  EXPECT_FALSE(untouched["status"].contains("allocation")) << untouched.dump();
  EXPECT_FALSE(untouched["metadata"].contains("annotations")) << untouched.dump();
  EXPECT_NE(Get(k8s::kPods, "p2")["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraPlaced);
}

TEST_F(DraControllerTest, ANodeGoneIsReleasedAtOnce) {
  StartController(std::chrono::seconds(300));
  Json pod = Place("p", "c");
  const std::string first = NodeOf(Get(k8s::kResourceClaims, "c"));
  ASSERT_FALSE(first.empty());
  Json node = NodeObject(first);
  dra_->OnNodeDeleted(node);
  LetRoundsPass();
  // Not before kube-scheduler says it cannot bind the pod (the controller's view of nodes may be behind).
  EXPECT_EQ(dra_->counters().released, 0);
  Refuse(pod);
  ASSERT_TRUE(Eventually([&] { return dra_->counters().replaced == 1; }));
  EXPECT_NE(NodeOf(Get(k8s::kResourceClaims, "c")), first);
  ASSERT_EQ(Events("p", "TesseraPlacementReleased").size(), 1u);
  EXPECT_THAT(Events("p", "TesseraPlacementReleased")[0]["message"].get<std::string>(),
              HasSubstr(StrCat("node ", first, " is gone")));
}

TEST_F(DraControllerTest, ClaimsItDidNotAllocateOrThatAreSharedAreNeverTouched) {
  StartController(std::chrono::seconds(30));
  // A claim kube-scheduler allocated (its shareID is random, not Tessera's) for a pod labelled placed.
  ASSERT_TRUE(api_->Create(k8s::kResourceClaims, "default", ClaimObject("theirs")).ok());
  Json pod = GatedPod("q", "theirs");
  pod["spec"].erase("schedulingGates");
  pod["metadata"]["labels"][formats::kDraPlacementLabel] = formats::kDraPlaced;
  absl::StatusOr<Json> q = api_->Create(k8s::kPods, "default", pod);
  ASSERT_TRUE(q.ok()) << q.status();
  Json theirs = Get(k8s::kResourceClaims, "theirs");
  theirs["status"] = {
      {"allocation",
       {{"devices",
         {{"results",
           {{{"request", "gpu"},
             {"driver", "gpu.tessera.dev"},
             {"pool", "node-a"},
             {"device", "gpu-0"},
             {"consumedCapacity", {{"cores", "40"}, {"memory", "8Gi"}}},
             {"shareID", "0b7e4a2c-5c1d-4f6e-9a3b-2d8c7f1e0a94"}}}}}},
        {"nodeSelector",
         {{"nodeSelectorTerms",
           {{{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {"node-a"}}}}}}}}}},
        {"allocationTimestamp", "2026-11-27T05:00:00Z"}}},
      {"reservedFor", {{{"resource", "pods"}, {"name", "q"}, {"uid", (*q)["metadata"]["uid"]}}}}};
  absl::StatusOr<Json> written = api_->Update(k8s::kResourceClaims, "default", theirs, "status");
  ASSERT_TRUE(written.ok()) << written.status();
  Refuse(*q);
  // A claim Tessera allocated, shared with a second pod that reserved it too.
  Json p = Place("p", "shared");
  Json shared = Get(k8s::kResourceClaims, "shared");
  shared["status"]["reservedFor"].push_back({{"resource", "pods"}, {"name", "r"}, {"uid", "r-uid"}});
  absl::StatusOr<Json> shared_written = api_->Update(k8s::kResourceClaims, "default", shared, "status");
  ASSERT_TRUE(shared_written.ok()) << shared_written.status();
  Refuse(p);
  clock_.Advance(std::chrono::seconds(3600));
  LetRoundsPass(40);
  EXPECT_EQ(Get(k8s::kResourceClaims, "theirs")["metadata"]["resourceVersion"],
            (*written)["metadata"]["resourceVersion"]);
  EXPECT_EQ(Get(k8s::kResourceClaims, "shared")["metadata"]["resourceVersion"],
            (*shared_written)["metadata"]["resourceVersion"]);
  EXPECT_EQ(dra_->counters().released, 0);
  EXPECT_TRUE(Events("q", "TesseraPlacementReleased").empty());
  EXPECT_TRUE(Events("p", "TesseraPlacementReleased").empty());
}

TEST_F(DraControllerTest, ZeroTurnsReleasingOff) {
  StartController(std::chrono::seconds(0));
  Json pod = Place("p", "c");
  Json claim = Get(k8s::kResourceClaims, "c");
  dra_->OnNodeDeleted(NodeObject(NodeOf(claim)));
  Refuse(pod);
  clock_.Advance(std::chrono::seconds(3600));
  LetRoundsPass();
  EXPECT_EQ(Get(k8s::kResourceClaims, "c")["metadata"]["resourceVersion"],
            claim["metadata"]["resourceVersion"]);
  EXPECT_EQ(dra_->counters().released, 0);
}

TEST_F(DraControllerTest, OneQuotaCountsBothPathsAndARaisedQuotaPlacesTheWaitingPod) {
  // The extender's cache: "default" may hold 0.6 of a V100.
  const std::string model = "Tesla V100-SXM2-32GB";  // tessera::testing::TesseraSlice's
  cache_.SetQuota(core::Namespace("default"), model, core::MilliGpu(600));
  StartController(std::chrono::seconds(30), &exchange_);
  Place("p1", "c1");  // 40%
  // The device-plugin path now counts the claim's 0.4 against the namespace's quota.
  auto held_by_dra = [&] {
    for (const core::QuotaStanding& q : cache_.QuotaStandings()) {
      if (q.ns == core::Namespace("default") && q.model == model) return q.held_elsewhere;
    }
    return int64_t{-1};
  };
  EXPECT_TRUE(Eventually([&] { return held_by_dra() == 400; })) << held_by_dra();
  // A second 40% claim would make 0.8: it waits, and the pod says why.
  ASSERT_TRUE(api_->Create(k8s::kResourceClaims, "default", ClaimObject("c2")).ok());
  absl::StatusOr<Json> p2 = api_->Create(k8s::kPods, "default", GatedPod("p2", "c2"));
  ASSERT_TRUE(p2.ok()) << p2.status();
  dra_->OnPod(*p2);
  EXPECT_TRUE(Eventually([&] {
    Json p = Get(k8s::kPods, "p2");
    const Json& why = p["metadata"]["annotations"][formats::kDraWaitingAnnotation];
    return why.is_string() && why.get<std::string>().find("(quota)") != std::string::npos;
  })) << Get(k8s::kPods, "p2").dump();
  EXPECT_FALSE(Get(k8s::kResourceClaims, "c2")["status"]["allocation"].is_object());
  // The quota raised (a quota file read again): the pod that waited is placed without another change.
  cache_.SetQuota(core::Namespace("default"), model, core::MilliGpu(1000));
  EXPECT_TRUE(
      Eventually([&] { return Get(k8s::kResourceClaims, "c2")["status"]["allocation"].is_object(); }));
  EXPECT_TRUE(Eventually([&] { return held_by_dra() == 800; })) << held_by_dra();
}

}  // namespace
}  // namespace tessera::scheduler
