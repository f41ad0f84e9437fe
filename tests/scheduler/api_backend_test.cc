// ApiBackend against the fake API server (tools/fake-apiserver, over real HTTP): the cache rebuilt from the
// API, binds written as Bindings with the assignment, a retried bind, problems posted as Events, and leader
// election between two replicas.
#include "scheduler/api_backend.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/clock.h"
#include "core/strings.h"
#include "fake_apiserver.h"
#include "formats/assignment.h"
#include "formats/inventory.h"
#include "nlohmann/json.hpp"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

json NodeObject(const std::string& name, int gpus, const std::string& inventory_override = "") {
  formats::GpuInventory inv;
  core::NodeInfo info = testing::MakeNode(name, gpus);
  for (const core::GpuInfo& g : info.gpus) inv.gpus.push_back({g, "", "", ""});
  inv.links = core::LinkMatrix(gpus);
  return {
      {"apiVersion", "v1"},
      {"kind", "Node"},
      {"metadata",
       {{"name", name},
        {"annotations",
         {{formats::kGpuInventoryAnnotation,
           inventory_override.empty() ? formats::SerializeGpuInventory(inv) : inventory_override},
          {formats::kHeartbeatAnnotation, formats::FormatHeartbeat(std::chrono::system_clock::now())}}}}}};
}

json PodObject(const std::string& name, int cores) {
  return {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", name}, {"namespace", "default"}}},
      {"spec",
       {{"containers",
         {{{"name", "main"},
           {"resources",
            {{"limits",
              {{"tessera.dev/gpu-cores", std::to_string(cores)}, {"tessera.dev/gpu-memory", "1024"}}}}}}}}}},
      {"status", {{"phase", "Pending"}}}};
}

// The extender's bind verb's body for pod `name` of the default namespace.
std::string BindArgs(const std::string& name, const std::string& uid, const std::string& node = "n1") {
  return json{{"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", node}}.dump();
}

CacheOptions Options() {
  CacheOptions o;
  o.policy = "binpack";
  o.seed = 3;
  return o;
}

// A backend on the fake API server whose time is a FakeClock, the cache it feeds, and an extender over both.
struct ClockedBackend {
  explicit ClockedBackend(k8s::KubeApi& api) : backend(api, cache, WithClock(&clock)) {}
  static ApiBackendOptions WithClock(const Clock* clock) {
    ApiBackendOptions o;
    o.sync.clock = clock;
    return o;
  }
  ClusterCache cache{Options()};
  FakeClock clock;
  ApiBackend backend;
  Extender extender{cache, backend, &backend};
};

class ApiBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<fake::FakeApiServer>> s = fake::FakeApiServer::Start();
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = *std::move(s);
    k8s::ClientConfig config;
    config.server = server_->url();
    absl::StatusOr<std::unique_ptr<k8s::KubeApi>> api = k8s::NewKubeApi(config);
    ASSERT_TRUE(api.ok()) << api.status();
    api_ = *std::move(api);
  }
  // Waits for the informers to deliver what the test wrote.
  template <typename F>
  bool Eventually(F done) {
    for (int i = 0; i < 1500; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  std::unique_ptr<fake::FakeApiServer> server_;
  std::unique_ptr<k8s::KubeApi> api_;
};

TEST_F(ApiBackendTest, RebuildsFromTheApiAndBindsWithTheAssignment) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  absl::StatusOr<json> a = server_->Create("pods", "default", PodObject("a", 60));
  ASSERT_TRUE(a.ok());
  ClusterCache cache(Options());
  ApiBackend backend(*api_, cache, {});
  ASSERT_TRUE(backend.Start().ok());
  EXPECT_TRUE(backend.Ready());
  EXPECT_EQ(cache.node_count(), 1);

  Extender extender(cache, backend, &backend);
  // Bind without a filter first: the pod is fetched from the API.
  const std::string uid = (*a)["metadata"]["uid"];
  Response r = extender.Bind(BindArgs("a", uid));
  ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  absl::StatusOr<json> bound = server_->Get("pods", "default", "a");
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ((*bound)["spec"]["nodeName"], "n1");
  const json& annotations = (*bound)["metadata"]["annotations"];
  EXPECT_EQ(annotations[formats::kAnnotationPhase], formats::kPhaseBound);
  absl::StatusOr<formats::Assignment> assignment =
      formats::ParseAssignment(annotations[formats::kAnnotationAssignment].get<std::string>());
  ASSERT_TRUE(assignment.ok()) << assignment.status();
  EXPECT_EQ(assignment->containers[0].vgpus[0].uuid.value(), "GPU-n1-0");
  // A retried bind (kube-scheduler timed out on the first) succeeds and takes nothing more.
  r = extender.Bind(BindArgs("a", uid));
  EXPECT_EQ(json::parse(r.body)["Error"], "") << r.body;
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 400);

  // A second scheduler started now sees the same, from the API alone.
  ClusterCache fresh(Options());
  ApiBackend again(*api_, fresh, {});
  ASSERT_TRUE(again.Start().ok());
  EXPECT_EQ(fresh.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 400);
  // The pod goes: both give the share back.
  ASSERT_TRUE(server_->Delete("pods", "default", "a").ok());
  EXPECT_TRUE(Eventually([&] { return fresh.pod_count() == 0 && cache.pod_count() == 0; }));
}

// The nodes are listed whole before the pods. Listed side by side, a pods' list that ended first (here the
// nodes' first list fails and is retried after a backoff; on a loaded machine a slow page of 5,000 nodes did
// the same) found no node for any bound pod: each was reported as assigned to a node the scheduler does not
// know, with an Event telling the operator to delete it, though its node came a moment later.
TEST_F(ApiBackendTest, ARestartListsTheNodesBeforeThePods) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  absl::StatusOr<json> a = server_->Create("pods", "default", PodObject("a", 60));
  ASSERT_TRUE(a.ok());
  {
    ClusterCache cache(Options());
    ApiBackend backend(*api_, cache, {});
    ASSERT_TRUE(backend.Start().ok());
    Extender extender(cache, backend, &backend);
    Response r = extender.Bind(BindArgs("a", (*a)["metadata"]["uid"]));
    ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  }
  fake::FaultRule fail_nodes_list;
  fail_nodes_list.verb = "list";
  fail_nodes_list.path_prefix = "/api/v1/nodes";
  server_->FailRequests(fail_nodes_list);
  ClusterCache cache(Options());
  ApiBackend backend(*api_, cache, {});
  ASSERT_TRUE(backend.Start().ok());
  backend.Housekeeping();
  for (const json& e : server_->List("events", "default")) {
    EXPECT_NE(e["reason"], "TesseraBadAssignment") << e["message"];
  }
  EXPECT_TRUE(cache.Orphans().empty());
  EXPECT_EQ(cache.pod_count(), 1);
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 400);
}

// A pod the ledger holds whose deletion was never seen (here one the API never had, which is what such a miss
// leaves) is looked up in the API once the informer has lacked it for a whole period, and released: the fault
// harness found a deleted pod held past its run's end (docs/faults.md). The pods the API has stay.
TEST_F(ApiBackendTest, APodTheApiNoLongerHasIsReleasedAfterAPeriodWithoutIt) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  absl::StatusOr<json> a = server_->Create("pods", "default", PodObject("a", 40));
  ASSERT_TRUE(a.ok());
  ClockedBackend b(*api_);
  ASSERT_TRUE(b.backend.Start().ok());
  const std::string uid = (*a)["metadata"]["uid"];
  Response r = b.extender.Bind(BindArgs("a", uid));
  ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  absl::StatusOr<json> bound = server_->Get("pods", "default", "a");
  ASSERT_TRUE(bound.ok());
  json ghost = *bound;
  ghost["metadata"]["name"] = "ghost";
  ghost["metadata"]["uid"] = "uid-ghost";
  b.backend.sync().OnPod(ghost);
  ASSERT_EQ(b.cache.pod_count(), 2);

  EXPECT_EQ(b.backend.ReconcileLedger(), 0);  // first seen lacking: the informer may be behind
  b.clock.Advance(ApiBackend::kReconcilePeriod - std::chrono::seconds(1));
  EXPECT_EQ(b.backend.ReconcileLedger(), 0);  // not due yet
  b.clock.Advance(std::chrono::seconds(1));
  EXPECT_EQ(b.backend.ReconcileLedger(), 1);  // lacking a whole period, and the API has no such pod
  EXPECT_EQ(b.cache.pod_count(), 1);
  EXPECT_TRUE(b.cache.FindPod(core::PodUid(uid)).has_value());
  EXPECT_EQ(b.cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 600);
}

// An informer blind to a busy API must not make the scheduler send it a GET per pod at once: at most
// kReconcileLookups pods are looked up a period, the rest in the next.
TEST_F(ApiBackendTest, TheLedgerCheckLooksUpABoundedNumberOfPodsAPeriod) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  absl::StatusOr<json> a = server_->Create("pods", "default", PodObject("a", 1));
  ASSERT_TRUE(a.ok());
  ClockedBackend b(*api_);
  ASSERT_TRUE(b.backend.Start().ok());
  Response r = b.extender.Bind(BindArgs("a", (*a)["metadata"]["uid"]));
  ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  json ghost = server_->Get("pods", "default", "a").value();
  // 1 MiB each, so that they all fit the GPU's memory.
  std::string& assignment = ghost["metadata"]["annotations"][formats::kAnnotationAssignment].get_ref<std::string&>();
  const size_t at = assignment.find(R"("memoryMiB":1024)");
  ASSERT_NE(at, std::string::npos) << assignment;
  assignment.replace(at, 16, R"("memoryMiB":1)");
  const int ghosts = ApiBackend::kReconcileLookups + 6;
  for (int i = 0; i < ghosts; ++i) {
    ghost["metadata"]["name"] = StrCat("ghost-", i);
    ghost["metadata"]["uid"] = StrCat("uid-ghost-", i);
    b.backend.sync().OnPod(ghost);
  }
  ASSERT_EQ(b.cache.pod_count(), ghosts + 1);
  const int64_t gets = server_->requests("get");
  EXPECT_EQ(b.backend.ReconcileLedger(), 0);
  b.clock.Advance(ApiBackend::kReconcilePeriod);
  EXPECT_EQ(b.backend.ReconcileLedger(), ApiBackend::kReconcileLookups);
  EXPECT_EQ(server_->requests("get") - gets, ApiBackend::kReconcileLookups);
  b.clock.Advance(ApiBackend::kReconcilePeriod);
  EXPECT_EQ(b.backend.ReconcileLedger(), 6);
  EXPECT_EQ(b.cache.pod_count(), 1);
}

// The case that made the informer alone unfit to release on: a pod bound and confirmed by this replica while
// its informer is blind (its watches failing) is in the ledger and not in the informer's store for as long as
// that lasts. The API has it, so it stays, period after period; once the API shows it finished, it goes.
// (A release on the informer's word alone let SchedulerSoakTest catch a GPU at 110%.)
TEST_F(ApiBackendTest, APodOurBindConfirmedStaysWhileTheInformerIsBlind) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  ClockedBackend b(*api_);
  ASSERT_TRUE(b.backend.Start().ok());
  fake::FaultRule blind;
  blind.verb = "watch";
  blind.count = -1;
  server_->FailRequests(blind);
  server_->DropWatches();
  absl::StatusOr<json> pod_b = server_->Create("pods", "default", PodObject("b", 60));
  ASSERT_TRUE(pod_b.ok());
  const std::string uid = (*pod_b)["metadata"]["uid"];
  Response r = b.extender.Bind(BindArgs("b", uid));
  ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  ASSERT_TRUE(b.cache.FindPod(core::PodUid(uid)).has_value());
  for (int period = 0; period < 4; ++period) {
    EXPECT_EQ(b.backend.ReconcileLedger(), 0) << "period " << period;
    b.clock.Advance(ApiBackend::kReconcilePeriod);
  }
  EXPECT_EQ(b.cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 400);

  ASSERT_TRUE(api_->Patch(k8s::kPods, "default", "b", k8s::PatchType::kMerge,
                          json{{"status", {{"phase", "Failed"}}}}, "status")
                  .ok());
  ASSERT_EQ(server_->Get("pods", "default", "b").value()["status"]["phase"], "Failed");
  int released = 0;
  for (int period = 0; period < 3 && released == 0; ++period) {
    released = b.backend.ReconcileLedger();
    b.clock.Advance(ApiBackend::kReconcilePeriod);
  }
  EXPECT_EQ(released, 1);
  EXPECT_EQ(b.cache.pod_count(), 0);
  EXPECT_EQ(b.cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 1000);
}

TEST_F(ApiBackendTest, ProblemsBecomeEventsOnTheirObjects) {
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("broken", 1, R"({"version":7})")).ok());
  ClusterCache cache(Options());
  ApiBackend backend(*api_, cache, {});
  ASSERT_TRUE(backend.Start().ok());
  backend.Housekeeping();
  std::vector<json> events = server_->List("events", "default");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["reason"], "TesseraBadInventory");
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["involvedObject"]["name"], "broken");
  EXPECT_THAT(events[0]["message"].get<std::string>(), HasSubstr("version 7"));
  EXPECT_EQ(cache.node_count(), 0);
}

TEST_F(ApiBackendTest, OnlyTheLeaderBinds) {
  ASSERT_TRUE(server_->Create("namespaces", "", json{{"metadata", {{"name", "tessera-system"}}}}).ok());
  ASSERT_TRUE(server_->Create("nodes", "", NodeObject("n1", 1)).ok());
  ASSERT_TRUE(server_->Create("pods", "default", PodObject("a", 10)).ok());
  ClusterCache cache_a(Options()), cache_b(Options());
  ApiBackendOptions options;
  options.lease_name = "tessera-scheduler";
  options.identity = "replica-a";
  ApiBackend a(*api_, cache_a, options);
  options.identity = "replica-b";
  ApiBackend b(*api_, cache_b, options);
  ASSERT_TRUE(a.Start().ok());
  ASSERT_TRUE(Eventually([&] { return a.IsLeader(); }));
  ASSERT_TRUE(b.Start().ok());
  EXPECT_FALSE(b.IsLeader());
  EXPECT_FALSE(b.Ready());
  EXPECT_TRUE(a.Ready());
  core::Placement p;  // 10% of n1's GPU
  p.node = core::NodeName("n1");
  core::VGpuAssignment share;
  share.gpu_index = 0;
  share.uuid = core::GpuUuid("GPU-n1-0");
  share.cores = core::MilliGpu(100);
  share.memory = core::MiB(1024);
  p.containers.emplace_back();
  p.containers[0].name = "main";
  p.containers[0].vgpus.push_back(share);
  absl::Status refused = b.Bind({"default", "a", "", "n1"}, p);
  EXPECT_TRUE(absl::IsUnavailable(refused));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("not the leader"));
  // Nor does a standby rewrite a pod's share (its ledger follows the leader's instead: Extender).
  const std::string before = server_->Get("pods", "default", "a").value().dump();
  refused = b.UpdateAssignment({"default", "a", "", "n1"}, p);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_EQ(server_->Get("pods", "default", "a").value().dump(), before);
  // The leader's bind carries who made it and the Lease's term (deploy/scheduler/70-leader-fence.yaml checks them
  // against the Lease).
  ASSERT_TRUE(a.Bind({"default", "a", "", "n1"}, p).ok());
  json lease = server_->Get("leases.coordination.k8s.io", "tessera-system", "tessera-scheduler").value();
  const json bound = server_->Get("pods", "default", "a").value()["metadata"]["annotations"];
  EXPECT_EQ(bound[formats::kAnnotationLeader], "replica-a");
  EXPECT_EQ(bound[formats::kAnnotationLeaderTerm], std::to_string(lease["spec"].value("leaseTransitions", 0)));
  // So does its rewrite of a share (tessera-share-fence checks it).
  const json old_term = {{"metadata", {{"annotations", {{formats::kAnnotationLeaderTerm, "-1"}}}}}};
  ASSERT_TRUE(server_->MergePatch("pods", "default", "a", old_term).ok());
  p.containers[0].vgpus[0].cores = core::MilliGpu(50);
  ASSERT_TRUE(a.UpdateAssignment({"default", "a", "", "n1"}, p).ok());
  const json rewritten = server_->Get("pods", "default", "a").value()["metadata"]["annotations"];
  EXPECT_EQ(rewritten[formats::kAnnotationLeader], "replica-a");
  EXPECT_EQ(rewritten[formats::kAnnotationLeaderTerm], bound[formats::kAnnotationLeaderTerm]);
  EXPECT_EQ(rewritten[formats::kAnnotationAssignment], formats::FormatAssignment(p));
  // The standby's ledger strays from the pods (as one that followed the leader's writes event by event beside
  // its own changes of shares can): here it lacks pod a, and no event of pod a comes again.
  const core::PodUid uid_a(server_->Get("pods", "default", "a").value()["metadata"]["uid"].get<std::string>());
  ASSERT_TRUE(Eventually([&] { return cache_b.FindPod(uid_a).has_value(); }));
  cache_b.ForgetPod(uid_a);
  // The leader steps down (it stops and gives the Lease up): the other takes over, in the next term, with its
  // ledger recorded again from the pods before it is ready.
  a.Stop();
  EXPECT_TRUE(Eventually([&] { return b.IsLeader(); }));
  EXPECT_TRUE(Eventually([&] { return b.Ready(); }));
  EXPECT_TRUE(cache_b.FindPod(uid_a).has_value());
  EXPECT_EQ(cache_b.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 950);
  ASSERT_TRUE(server_->Create("pods", "default", PodObject("c", 10)).ok());
  ASSERT_TRUE(b.Bind({"default", "c", "", "n1"}, p).ok());
  const json next = server_->Get("pods", "default", "c").value()["metadata"]["annotations"];
  EXPECT_EQ(next[formats::kAnnotationLeader], "replica-b");
  EXPECT_EQ(next[formats::kAnnotationLeaderTerm], std::to_string(lease["spec"].value("leaseTransitions", 0) + 1));
}

}  // namespace
}  // namespace tessera::scheduler
