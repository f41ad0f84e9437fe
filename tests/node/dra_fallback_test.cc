// The DRA placement fallback (src/node/dra_fallback.h): what it reads of a gated pod and of
// tessera-scheduler's Lease (pure), and whole rounds against the fake API server (tools/fake-apiserver) with
// the time driven by a FakeClock, never by sleeping. The marks are src/formats/dra_placement.h's; the
// Lease's fields are coordination.k8s.io/v1's (k8s.io/api coordination/v1/types.go: renewTime is a MicroTime,
// leaseDurationSeconds an int32); spec.schedulingGates is core/v1's list of {name}.
#include "node/dra_fallback.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include "core/strings.h"
#include "formats/dra_placement.h"
#include "k8s/k8s_test_util.h"
#include "k8s/objects.h"

namespace tessera::node {
namespace {

using k8s::Json;
using k8s::testing::FakeCluster;
using k8s::testing::WaitUntil;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using TimePoint = std::chrono::system_clock::time_point;

constexpr char kKueueGate[] = "kueue.x-k8s.io/admission";

std::string Rfc3339(TimePoint t) {
  return k8s::FormatTime(t);
}

// A pod as the webhook leaves it: the gate (after `gates_before`), the label, the annotation.
Json GatedPodObject(const std::string& name, const std::string& ns, const std::string& gated_at,
                    std::vector<std::string> gates_before = {}, bool with_gate = true) {
  Json pod = k8s::testing::MakePod(name, ns, "", {{formats::kDraPlacementLabel, formats::kDraGated}});
  if (!gated_at.empty()) pod["metadata"]["annotations"][formats::kDraGatedAtAnnotation] = gated_at;
  Json gates = Json::array();
  for (const std::string& g : gates_before) gates.push_back({{"name", g}});
  if (with_gate) gates.push_back({{"name", formats::kDraPlacementGate}});
  if (!gates.empty()) pod["spec"]["schedulingGates"] = gates;
  return pod;
}

Json LeaseObject(TimePoint renewed, int duration_seconds = 15,
                 const std::string& holder = "tessera-scheduler-0") {
  return {{"apiVersion", "coordination.k8s.io/v1"},
          {"kind", "Lease"},
          {"metadata", {{"name", "tessera-scheduler"}, {"namespace", "tessera-system"}}},
          {"spec",
           {{"holderIdentity", holder},
            {"leaseDurationSeconds", duration_seconds},
            {"acquireTime", k8s::FormatTime(renewed, k8s::TimeFormat::kMicro)},
            {"renewTime", k8s::FormatTime(renewed, k8s::TimeFormat::kMicro)},
            {"leaseTransitions", 0}}}};
}

// ---- The pure parts ----

TEST(ReadGatedPodTest, GatedByTheWebhook) {
  Json pod = GatedPodObject("a", "ml", "2024-01-01T00:10:00Z", {kKueueGate});
  pod["metadata"]["creationTimestamp"] = "2024-01-01T00:10:01Z";
  GatedPod g = ReadGatedPod(pod);
  ASSERT_EQ(g.state, GatedPod::State::kGated);
  // Never earlier than the creation: the webhook's second-precision stamp comes just before it.
  EXPECT_EQ(Rfc3339(g.gated_at), "2024-01-01T00:10:01Z");
  EXPECT_FALSE(g.annotation_garbled);
  pod["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z";
  EXPECT_EQ(Rfc3339(ReadGatedPod(pod).gated_at), "2024-01-01T00:10:00Z");
}

TEST(ReadGatedPodTest, ALabelAloneIsNotTesserasToTouch) {
  Json no_gate = GatedPodObject("a", "ml", "2024-01-01T00:00:00Z", {kKueueGate}, /*with_gate=*/false);
  EXPECT_EQ(ReadGatedPod(no_gate).state, GatedPod::State::kIgnored);
  Json no_annotation = GatedPodObject("a", "ml", "");
  no_annotation["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z";
  EXPECT_EQ(ReadGatedPod(no_annotation).state, GatedPod::State::kIgnored);
  Json placed = GatedPodObject("a", "ml", "2024-01-01T00:00:00Z");
  placed["metadata"]["labels"][formats::kDraPlacementLabel] = formats::kDraPlaced;
  EXPECT_EQ(ReadGatedPod(placed).state, GatedPod::State::kIgnored);
  Json deleting = GatedPodObject("a", "ml", "2024-01-01T00:00:00Z");
  deleting["metadata"]["deletionTimestamp"] = "2024-01-01T00:05:00Z";
  EXPECT_EQ(ReadGatedPod(deleting).state, GatedPod::State::kIgnored);
  Json odd_gates = GatedPodObject("a", "ml", "2024-01-01T00:00:00Z", {}, false);
  odd_gates["spec"]["schedulingGates"] = {"tessera.dev/dra-placement", 7, Json::object(), {{"name", 3}}};
  EXPECT_EQ(ReadGatedPod(odd_gates).state, GatedPod::State::kIgnored);
  EXPECT_EQ(ReadGatedPod(Json("not a pod")).state, GatedPod::State::kIgnored);
}

TEST(ReadGatedPodTest, AGarbledStampReadsAsTheCreation) {
  for (const char* stamp :
       {"yesterday", "2024-13-01T00:00:00Z", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z"}) {
    Json pod = GatedPodObject("a", "ml", stamp);
    pod["metadata"]["creationTimestamp"] = "2024-01-01T00:00:00Z";
    GatedPod g = ReadGatedPod(pod);
    ASSERT_EQ(g.state, GatedPod::State::kGated) << stamp;
    EXPECT_TRUE(g.annotation_garbled) << stamp;
    EXPECT_EQ(Rfc3339(g.gated_at), "2024-01-01T00:00:00Z") << stamp;
    pod["metadata"].erase("creationTimestamp");
    EXPECT_EQ(ReadGatedPod(pod).state, GatedPod::State::kIgnored) << stamp << ": nothing to measure from";
  }
  Json annotation_not_a_string = GatedPodObject("a", "ml", "x");
  annotation_not_a_string["metadata"]["annotations"][formats::kDraGatedAtAnnotation] = 12;
  EXPECT_EQ(ReadGatedPod(annotation_not_a_string).state, GatedPod::State::kIgnored);
}

TEST(LeaseTest, LiveWithinTheLongerOfTheWaitAndItsDuration) {
  const TimePoint renewed = *k8s::ParseTime("2024-01-01T00:00:00.250000Z");
  LeaseView lease = ReadLease(LeaseObject(renewed, 15));
  ASSERT_TRUE(lease.renewed.has_value());
  EXPECT_EQ(lease.duration, seconds(15));
  EXPECT_EQ(lease.holder, "tessera-scheduler-0");
  EXPECT_TRUE(LeaseLiveAt(lease, renewed + seconds(60), seconds(60)));
  EXPECT_FALSE(LeaseLiveAt(lease, renewed + seconds(60) + std::chrono::microseconds(1), seconds(60)));
  EXPECT_TRUE(LeaseLiveAt(lease, renewed - hours(1), seconds(60))) << "a renewal in the future is recent";
  // A Lease held for longer than the wait is live for as long as it says.
  LeaseView long_lease = ReadLease(LeaseObject(renewed, 300));
  EXPECT_TRUE(LeaseLiveAt(long_lease, renewed + seconds(299), seconds(60)));
  EXPECT_FALSE(LeaseLiveAt(long_lease, renewed + seconds(301), seconds(60)));
}

TEST(LeaseTest, AbsentNeverRenewedOrGarbledIsNotLive) {
  const TimePoint now = *k8s::ParseTime("2024-01-01T00:00:00Z");
  EXPECT_FALSE(LeaseLiveAt(LeaseView{}, now, seconds(60)));
  Json no_renew = LeaseObject(now);
  no_renew["spec"].erase("renewTime");
  EXPECT_FALSE(LeaseLiveAt(ReadLease(no_renew), now, seconds(60)));
  Json garbled = LeaseObject(now);
  garbled["spec"]["renewTime"] =
      "0001-01-01T00:00:00.000000Z";  // the year a 64-bit nanosecond clock cannot hold
  garbled["spec"]["leaseDurationSeconds"] = int64_t{1} << 62;
  LeaseView g = ReadLease(garbled);
  EXPECT_FALSE(g.renewed.has_value());
  EXPECT_FALSE(LeaseLiveAt(g, now, seconds(60)));
  EXPECT_FALSE(LeaseLiveAt(ReadLease(Json::array()), now, seconds(60)));
}

TEST(LiftedPodTest, RemovesOnlyTheGateAndMarksTheLabel) {
  Json pod = GatedPodObject("a", "ml", "2024-01-01T00:00:00Z", {kKueueGate});
  pod["metadata"]["resourceVersion"] = "42";
  pod["metadata"]["labels"]["app"] = "web";
  Json lifted = LiftedPod(pod);
  EXPECT_EQ(lifted["spec"]["schedulingGates"], Json::array({{{"name", kKueueGate}}}));
  EXPECT_EQ(lifted["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraFallback);
  EXPECT_EQ(lifted["metadata"]["labels"]["app"], "web");
  EXPECT_EQ(lifted["metadata"]["resourceVersion"], "42") << "the write is conditional on it";
  EXPECT_EQ(lifted["metadata"]["annotations"], pod["metadata"]["annotations"]);
  EXPECT_FALSE(LiftedPod(GatedPodObject("b", "ml", "x"))["spec"].contains("schedulingGates"));
}

TEST(StaggerTest, SameForANodeWithinTheWindow) {
  EXPECT_EQ(StaggerFor("gpu-1", milliseconds(10000)), StaggerFor("gpu-1", milliseconds(10000)));
  EXPECT_EQ(StaggerFor("gpu-1", milliseconds(0)), milliseconds(0));
  std::set<int64_t> seen;
  for (int i = 0; i < 100; ++i) {
    milliseconds s = StaggerFor(StrCat("gpu-", i), milliseconds(10000));
    EXPECT_GE(s.count(), 0);
    EXPECT_LT(s.count(), 10000);
    seen.insert(s.count());
  }
  EXPECT_GT(seen.size(), 90u) << "a hash that spreads nodes over the window";
}

TEST(DraFallbackCreateTest, RefusesWhatCannotWork) {
  FakeCluster c;
  auto make = [&](DraFallbackConfig config) {
    return DraFallback::Create(std::move(config), *c.api).status();
  };
  EXPECT_TRUE(make({.node_name = "gpu-1"}).ok());
  EXPECT_THAT(make({.node_name = ""}).message(), HasSubstr("node"));
  EXPECT_THAT(make({.node_name = "gpu-1", .fallback_after = seconds(0)}).message(),
              HasSubstr("turns it off"));
  for (const char* bad : {"tessera-scheduler", "a/b/c", "/x", "x/", "Tessera/x", "ns/UPPER", "n_s/x"}) {
    absl::Status s = make({.node_name = "gpu-1", .scheduler_lease = bad});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(s.message(), HasSubstr("NAMESPACE/NAME")) << bad;
  }
}

// ---- Rounds against the fake API server ----

class DraFallbackTest : public ::testing::Test {
 protected:
  // The fake clock runs a day ahead of the fake API server's (whose creationTimestamps are the real time), so
  // the gated-at stamps the tests write are never earlier than their pods' creation.
  DraFallbackTest()
      : clock_(std::chrono::time_point_cast<seconds>(std::chrono::system_clock::now() + hours(24))) {}

  void SetUp() override {
    ASSERT_NE(c_.server, nullptr);
    ASSERT_NE(c_.api, nullptr);
    MakeFallback();
  }

  void MakeFallback(int max_writes = 50) {
    fallback_.reset();
    auto made = DraFallback::Create({.node_name = "gpu-1",
                                     .fallback_after = seconds(60),
                                     .period = milliseconds(0),
                                     .max_writes_per_round = max_writes,
                                     .clock = &clock_},
                                    *c_.api);
    ASSERT_TRUE(made.ok()) << made.status();
    fallback_ = *std::move(made);
    fallback_->Start();
    ASSERT_TRUE(fallback_->WaitForSync(milliseconds(20000)));
  }

  // Past the wait and this node's stagger.
  seconds Wait() const { return seconds(60) + std::chrono::ceil<seconds>(fallback_->stagger()) + seconds(1); }

  void CreatePod(const Json& pod) { ASSERT_TRUE(c_.server->Create("pods", k8s::Namespace(pod), pod).ok()); }
  void SetLease(TimePoint renewed, int duration = 15, const std::string& holder = "tessera-scheduler-0") {
    (void)c_.server->Delete("leases.coordination.k8s.io", "tessera-system", "tessera-scheduler");
    ASSERT_TRUE(
        c_.server
            ->Create("leases.coordination.k8s.io", "tessera-system", LeaseObject(renewed, duration, holder))
            .ok());
  }
  Json Pod(const std::string& ns, const std::string& name) {
    absl::StatusOr<Json> p = c_.server->Get("pods", ns, name);
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *p : Json();
  }
  std::vector<Json> FallbackEvents(const std::string& ns) {
    fallback_->FlushEvents();
    std::vector<Json> out;
    for (const Json& e : c_.server->List("events", ns)) {
      if (e.value("reason", "") == kDraFallbackReason) out.push_back(e);
    }
    return out;
  }
  bool Watching(size_t n) {
    return WaitUntil([&] { return fallback_->watched() == n; });
  }
  static std::vector<std::string> GateNames(const Json& pod) {
    std::vector<std::string> out;
    for (const Json& g : pod["spec"].value("schedulingGates", Json::array()))
      out.push_back(g.value("name", ""));
    return out;
  }

  FakeClock clock_;
  FakeCluster c_;
  std::unique_ptr<DraFallback> fallback_;
};

TEST_F(DraFallbackTest, StaleLeaseLiftsTheGateOnceKeepingOtherGates) {
  const TimePoint t0 = clock_.Now();
  SetLease(t0);
  CreatePod(GatedPodObject("trainer", "ml", Rfc3339(t0), {kKueueGate}));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());  // the Lease last renewed at t0: more than 60 s ago

  const int64_t updates_before = c_.server->requests("update");
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.due, 1);
  EXPECT_TRUE(r.lease_read);
  EXPECT_FALSE(r.lease_live);
  EXPECT_EQ(r.writes, 1);
  EXPECT_EQ(r.lifted, 1);

  Json pod = Pod("ml", "trainer");
  EXPECT_THAT(GateNames(pod), ::testing::ElementsAre(kKueueGate)) << "Kueue's gate stays";
  EXPECT_EQ(pod["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraFallback);
  EXPECT_EQ(pod["metadata"]["annotations"][formats::kDraGatedAtAnnotation], Rfc3339(t0));

  std::vector<Json> events = FallbackEvents("ml");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["type"], "Warning");
  EXPECT_EQ(events[0]["involvedObject"]["name"], "trainer");
  EXPECT_EQ(events[0]["involvedObject"]["kind"], "Pod");
  const std::string message = events[0].value("message", "");
  EXPECT_THAT(message, HasSubstr(StrCat("tessera-system/tessera-scheduler was last renewed at ",
                                        k8s::FormatTime(t0, k8s::TimeFormat::kMicro))));
  EXPECT_THAT(message, HasSubstr("kube-scheduler's own DRA allocator places its claims"));
  EXPECT_THAT(fallback_->MetricsText(), HasSubstr("\ntessera_node_dra_fallbacks_total 1\n"));
  EXPECT_THAT(fallback_->MetricsText(), HasSubstr("\ntessera_node_dra_fallback_errors_total 0\n"));

  // The pod left the selection (label fallback): later rounds find nothing to do.
  ASSERT_TRUE(Watching(0));
  clock_.Advance(seconds(30));
  r = fallback_->RunRound();
  EXPECT_EQ(r.due, 0);
  EXPECT_FALSE(r.lease_read);
  EXPECT_EQ(c_.server->requests("update") - updates_before, 1) << "lifted exactly once";
  EXPECT_EQ(FallbackEvents("ml").size(), 1u);
  EXPECT_EQ(fallback_->stats().fallbacks, 1);
}

TEST_F(DraFallbackTest, NotDueBeforeTheWaitAndThisNodesStagger) {
  const TimePoint t0 = clock_.Now();
  CreatePod(GatedPodObject("early", "ml", Rfc3339(t0)));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(seconds(60) + fallback_->stagger() - milliseconds(1));
  const int64_t gets_before = c_.server->requests("get");
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.due, 0);
  EXPECT_FALSE(r.lease_read) << "no Lease read without a pod due";
  EXPECT_EQ(c_.server->requests("get"), gets_before);
  clock_.Advance(milliseconds(1));
  r = fallback_->RunRound();
  EXPECT_EQ(r.due, 1);
  EXPECT_EQ(r.lifted, 1) << "no Lease at all";
}

TEST_F(DraFallbackTest, LiveLeaseKeepsThePodGatedUntilItGoesStale) {
  const TimePoint t0 = clock_.Now();
  CreatePod(GatedPodObject("waiting", "ml", Rfc3339(t0)));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  const TimePoint renewed = clock_.Now() - seconds(5);
  SetLease(renewed);  // tessera-scheduler is there; the pod fits nowhere, so it keeps it gated on purpose

  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.due, 1);
  EXPECT_TRUE(r.lease_read);
  EXPECT_TRUE(r.lease_live);
  EXPECT_EQ(r.writes, 0);
  EXPECT_THAT(GateNames(Pod("ml", "waiting")), ::testing::ElementsAre(formats::kDraPlacementGate));
  EXPECT_EQ(Pod("ml", "waiting")["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraGated);

  // The Lease cannot go stale before renewed + 60 s: no read until then.
  clock_.Advance(seconds(50));
  r = fallback_->RunRound();
  EXPECT_FALSE(r.lease_read);
  EXPECT_TRUE(r.lease_live);
  EXPECT_EQ(r.writes, 0);

  // No renewal since: stale.
  clock_.Advance(seconds(6));
  r = fallback_->RunRound();
  EXPECT_TRUE(r.lease_read);
  EXPECT_FALSE(r.lease_live);
  EXPECT_EQ(r.lifted, 1);
  EXPECT_EQ(FallbackEvents("ml").size(), 1u);
  EXPECT_EQ(fallback_->stats().waited_live, 2);
}

TEST_F(DraFallbackTest, AbsentLeaseLifts) {
  CreatePod(GatedPodObject("orphan", "ml", Rfc3339(clock_.Now())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_TRUE(r.lease_read);
  EXPECT_EQ(r.lifted, 1);
  EXPECT_FALSE(Pod("ml", "orphan")["spec"].contains("schedulingGates"));
  std::vector<Json> events = FallbackEvents("ml");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].value("message", ""), HasSubstr("tessera-system/tessera-scheduler does not exist"));
}

TEST_F(DraFallbackTest, ReleasedLeaseLiftsOnceItIsOld) {
  // tessera-scheduler's elector gives the Lease up on SIGTERM (holder "", duration 1 s); no replica took it.
  CreatePod(GatedPodObject("after-release", "ml", Rfc3339(clock_.Now())));
  SetLease(clock_.Now(), 1, "");
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.lifted, 1);
  std::vector<Json> events = FallbackEvents("ml");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].value("message", ""), HasSubstr("(released by its holder)"));
}

TEST_F(DraFallbackTest, ConflictIsDecidedAgainOnTheFreshPod) {
  CreatePod(GatedPodObject("busy", "ml", Rfc3339(clock_.Now())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  // Someone else writes the pod meanwhile, and the first write is answered 409 whichever version it carried.
  ASSERT_TRUE(
      c_.server->MergePatch("pods", "ml", "busy", {{"metadata", {{"labels", {{"team", "vision"}}}}}}).ok());
  fake::FaultRule conflict;
  conflict.verb = "update";
  conflict.path_prefix = "/api/v1/namespaces/ml/pods/busy";
  conflict.status = 409;
  conflict.reason = "Conflict";
  c_.server->FailRequests(conflict);
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.writes, 2);
  EXPECT_EQ(r.rereads, 1);
  EXPECT_EQ(r.lifted, 1);
  Json pod = Pod("ml", "busy");
  EXPECT_EQ(pod["metadata"]["labels"]["team"], "vision") << "the write was made on the pod read again";
  EXPECT_EQ(pod["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraFallback);
  EXPECT_FALSE(pod["spec"].contains("schedulingGates"));
  EXPECT_EQ(fallback_->stats().conflicts, 1);
  EXPECT_EQ(FallbackEvents("ml").size(), 1u);
}

TEST_F(DraFallbackTest, NeverForcesOverTesseraSchedulerPlacingThePod) {
  CreatePod(GatedPodObject("placed", "ml", Rfc3339(clock_.Now())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  // tessera-scheduler came back and placed it: gate gone, label "placed". Whether the informer has seen it
  // yet or the write meets a 409 and reads it again, the pod stays tessera-scheduler's.
  ASSERT_TRUE(
      c_.server
          ->MergePatch("pods", "ml", "placed",
                       {{"metadata", {{"labels", {{formats::kDraPlacementLabel, formats::kDraPlaced}}}}},
                        {"spec", {{"schedulingGates", nullptr}}}})
          .ok());
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.lifted, 0);
  EXPECT_LE(r.writes, 1);
  EXPECT_EQ(Pod("ml", "placed")["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraPlaced);
  EXPECT_TRUE(FallbackEvents("ml").empty());
  EXPECT_EQ(fallback_->stats().fallbacks, 0);
}

TEST_F(DraFallbackTest, ALabelWithoutTheGateOrStampIsLeftAlone) {
  const TimePoint t0 = clock_.Now();
  CreatePod(GatedPodObject("label-only", "tenant", Rfc3339(t0), {kKueueGate}, /*with_gate=*/false));
  CreatePod(GatedPodObject("no-stamp", "tenant", ""));
  ASSERT_TRUE(Watching(2));
  clock_.Advance(hours(1));
  const int64_t requests_before = c_.server->requests("update") + c_.server->requests("get");
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.due, 0);
  EXPECT_EQ(c_.server->requests("update") + c_.server->requests("get"), requests_before)
      << "not even the Lease";
  EXPECT_EQ(Pod("tenant", "label-only")["metadata"]["labels"][formats::kDraPlacementLabel],
            formats::kDraGated);
  EXPECT_THAT(GateNames(Pod("tenant", "no-stamp")), ::testing::ElementsAre(formats::kDraPlacementGate));
}

TEST_F(DraFallbackTest, AGarbledStampWithTheGateCountsFromCreation) {
  // Created now (the API server's clock), stamped with nonsense: due a day later on the fake clock already.
  CreatePod(GatedPodObject("garbled", "ml", "not-a-time"));
  ASSERT_TRUE(Watching(1));
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.due, 1);
  EXPECT_EQ(r.lifted, 1);
}

TEST_F(DraFallbackTest, UnreadableLeaseNeverActs) {
  CreatePod(GatedPodObject("pod", "ml", Rfc3339(clock_.Now())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  fake::FaultRule forbidden;
  forbidden.verb = "get";
  forbidden.path_prefix = "/apis/coordination.k8s.io/v1/namespaces/tessera-system/leases";
  forbidden.status = 403;
  forbidden.count = -1;
  c_.server->FailRequests(forbidden);
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_TRUE(r.lease_read);
  EXPECT_EQ(r.writes, 0);
  EXPECT_THAT(fallback_->MetricsText(), HasSubstr("\ntessera_node_dra_fallback_errors_total 1\n"));
  c_.server->ClearFaults();
  r = fallback_->RunRound();
  EXPECT_EQ(r.lifted, 1) << "absent once readable";
}

TEST_F(DraFallbackTest, ARenewalSeenHappeningIsLiveWhateverTheClocksSay) {
  // This node's clock runs 5 minutes ahead of tessera-scheduler's: by the timestamps alone its Lease looks
  // stale.
  const seconds skew(300);
  CreatePod(GatedPodObject("first", "ml", Rfc3339(clock_.Now())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(Wait());
  SetLease(clock_.Now() - skew);
  DraFallbackRound r = fallback_->RunRound();
  EXPECT_EQ(r.lifted, 1) << "a first look has only the timestamps to go by";

  ASSERT_TRUE(Watching(0));
  // Gated long enough ago to be due at once: the next look at the Lease comes 2 s after the first.
  CreatePod(GatedPodObject("second", "ml", Rfc3339(clock_.Now() - Wait())));
  ASSERT_TRUE(Watching(1));
  clock_.Advance(seconds(2));
  SetLease(clock_.Now() - skew);  // renewed since the last look, which was 2 s ago
  r = fallback_->RunRound();
  EXPECT_EQ(r.due, 1);
  EXPECT_TRUE(r.lease_read);
  EXPECT_TRUE(r.lease_live);
  EXPECT_EQ(r.writes, 0);
  // The same renewal seen again past the wait, with no renewal since: stale.
  clock_.Advance(seconds(61));
  r = fallback_->RunRound();
  EXPECT_TRUE(r.lease_read);
  EXPECT_FALSE(r.lease_live);
  EXPECT_EQ(r.lifted, 1);
}

TEST_F(DraFallbackTest, AFloodOfGatedPodsIsBoundedPerRound) {
  const TimePoint t0 = clock_.Now();
  constexpr int kPods = 1000;
  for (int i = 0; i < kPods; ++i) CreatePod(GatedPodObject(StrCat("flood-", i), "tenant", Rfc3339(t0)));
  // One pod of another namespace, gated later than all of them: it is not behind the whole flood.
  CreatePod(GatedPodObject("victim", "team", Rfc3339(t0 + seconds(1))));
  ASSERT_TRUE(Watching(kPods + 1));
  clock_.Advance(Wait() + seconds(1));

  int lifted = 0, rounds = 0;
  bool victim_in_first_round = false;
  while (lifted < kPods + 1) {
    ASSERT_LT(rounds, 40) << "the flood is drained, 50 a round";
    const int64_t updates = c_.server->requests("update"), gets = c_.server->requests("get");
    DraFallbackRound r = fallback_->RunRound();
    ++rounds;
    EXPECT_LE(r.writes, 50);
    EXPECT_LE(c_.server->requests("update") - updates, 50) << "round " << rounds;
    EXPECT_LE(c_.server->requests("get") - gets, 1) << "one Lease read a round, none per pod";
    EXPECT_EQ(r.lifted, std::min(50, kPods + 1 - lifted));
    lifted += r.lifted;
    if (rounds == 1) {
      victim_in_first_round =
          Pod("team", "victim")["metadata"]["labels"][formats::kDraPlacementLabel] == "fallback";
    }
    // The next round starts from what the API server says (the lifted pods leave the informer).
    ASSERT_TRUE(Watching(static_cast<size_t>(kPods + 1 - lifted)));
  }
  EXPECT_EQ(rounds, (kPods + 1 + 49) / 50);
  EXPECT_TRUE(victim_in_first_round) << "namespaces take turns";
  EXPECT_EQ(fallback_->stats().fallbacks, kPods + 1);
  EXPECT_GT(fallback_->stats().deferred, 0);
  EXPECT_EQ(FallbackEvents("tenant").size(), static_cast<size_t>(kPods));
}

}  // namespace
}  // namespace tessera::node
