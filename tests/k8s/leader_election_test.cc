// Leader election over a Lease in the fake API server: rounds driven by hand on a FakeClock (one leader at a
// time, takeover only after the lease expires, release on stop, renew deadline), and two electors on their
// own threads.
#include "k8s/leader_election.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>

#include "k8s/api_status.h"
#include "k8s/k8s_test_util.h"

namespace tessera::k8s {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::FakeCluster;
using testing::WaitUntil;

struct Candidate {
  // Before the elector, which counts into them until its destructor has stopped it.
  std::atomic<int> started{0};
  std::atomic<int> stopped{0};
  std::unique_ptr<LeaderElector> elector;
};

LeaderElectionConfig Config(const std::string& identity, const Clock* clock, Candidate* c) {
  LeaderElectionConfig config;
  config.lease_namespace = "tessera-system";
  config.lease_name = "tessera-scheduler";
  config.identity = identity;
  config.lease_duration = seconds(15);
  config.renew_deadline = seconds(10);
  config.retry_period = seconds(2);
  config.clock = clock;
  config.on_started_leading = [c] { ++c->started; };
  config.on_stopped_leading = [c] { ++c->stopped; };
  return config;
}

class LeaderElectionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    a_.elector = Make("a", &a_);
    b_.elector = Make("b", &b_);
  }
  std::unique_ptr<LeaderElector> Make(const std::string& id, Candidate* c) {
    absl::StatusOr<std::unique_ptr<LeaderElector>> e =
        LeaderElector::Create(*cluster_.api, Config(id, &clock_, c));
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }
  bool Round(Candidate& c) {
    absl::StatusOr<bool> r = c.elector->TryAcquireOrRenew();
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && *r;
  }
  Json Lease() {
    absl::StatusOr<Json> l =
        cluster_.server->Get("leases.coordination.k8s.io", "tessera-system", "tessera-scheduler");
    EXPECT_TRUE(l.ok()) << l.status();
    return l.ok() ? (*l)["spec"] : Json();
  }

  FakeCluster cluster_;
  FakeClock clock_;
  Candidate a_, b_;
};

TEST_F(LeaderElectionTest, OneLeaderAtATimeAndTakeoverAfterExpiry) {
  EXPECT_TRUE(Round(a_));  // creates the Lease
  EXPECT_FALSE(Round(b_));
  EXPECT_TRUE(a_.elector->IsLeader());
  EXPECT_FALSE(b_.elector->IsLeader());
  EXPECT_EQ(b_.elector->leader(), "a");
  EXPECT_EQ(a_.started, 1);
  Json lease = Lease();
  EXPECT_EQ(lease["holderIdentity"], "a");
  EXPECT_EQ(lease["leaseDurationSeconds"], 15);
  EXPECT_EQ(lease["leaseTransitions"], 0);

  // The leader renews; the other keeps waiting, however long, as long as the record changes.
  for (int i = 0; i < 10; ++i) {
    clock_.Advance(seconds(2));
    EXPECT_TRUE(Round(a_));
    EXPECT_FALSE(Round(b_));
  }
  EXPECT_EQ(a_.started, 1);

  // The leader goes quiet. Before lease_duration has passed (on b's clock) b must not take over.
  clock_.Advance(seconds(14));
  EXPECT_FALSE(Round(b_));
  // The old leader's own view: it has not renewed for longer than renew_deadline.
  EXPECT_FALSE(a_.elector->IsLeader());
  clock_.Advance(seconds(2));
  EXPECT_TRUE(Round(b_));
  EXPECT_TRUE(b_.elector->IsLeader());
  EXPECT_EQ(b_.started, 1);
  lease = Lease();
  EXPECT_EQ(lease["holderIdentity"], "b");
  EXPECT_EQ(lease["leaseTransitions"], 1);

  // a comes back, sees b holding a live lease, and steps down.
  EXPECT_FALSE(Round(a_));
  EXPECT_EQ(a_.stopped, 1);
  EXPECT_EQ(a_.elector->leader(), "b");
}

TEST_F(LeaderElectionTest, ReleaseOnStopLetsTheOtherTakeOverAtOnce) {
  EXPECT_TRUE(Round(a_));
  EXPECT_FALSE(Round(b_));
  a_.elector->Stop();  // not started: releases directly
  EXPECT_EQ(a_.stopped, 1);
  EXPECT_EQ(Lease()["holderIdentity"], "");
  EXPECT_TRUE(Round(b_));  // no waiting for lease_duration
  EXPECT_EQ(Lease()["holderIdentity"], "b");
  // Release by a non-holder changes nothing.
  EXPECT_TRUE(a_.elector->Release().ok());
  EXPECT_EQ(Lease()["holderIdentity"], "b");
}

TEST_F(LeaderElectionTest, ARenewalResetsExpiryAndStaleWritesConflict) {
  EXPECT_TRUE(Round(a_));
  EXPECT_FALSE(Round(b_));  // b first sees a's record now
  clock_.Advance(seconds(16));
  // The lease would have expired for b, but a renews just before b looks: b sees a new record, not expired.
  Json before_renewal =
      *cluster_.server->Get("leases.coordination.k8s.io", "tessera-system", "tessera-scheduler");
  ASSERT_TRUE(Round(a_));
  EXPECT_FALSE(Round(b_));
  EXPECT_FALSE(b_.elector->IsLeader());
  // A candidate that read the Lease before a's renewal cannot write it: 409, it reads again next round.
  before_renewal["spec"]["holderIdentity"] = "b";
  absl::Status s = cluster_.api->Update(kLeases, "tessera-system", before_renewal).status();
  EXPECT_TRUE(IsConflict(s)) << s;
  EXPECT_EQ(Lease()["holderIdentity"], "a");
}

TEST_F(LeaderElectionTest, ApiErrorsAreReportedAndLeaderStepsDownAfterDeadline) {
  EXPECT_TRUE(Round(a_));
  cluster_.server->FailRequests({.verb = "", .status = 500, .count = -1});
  absl::StatusOr<bool> r = a_.elector->TryAcquireOrRenew();
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  EXPECT_TRUE(a_.elector->IsLeader());  // still within renew_deadline
  clock_.Advance(seconds(11));
  EXPECT_FALSE(a_.elector->IsLeader());
  cluster_.server->ClearFaults();
}

TEST(LeaderElectionConfigTest, RejectsUnsafeTimings) {
  FakeCluster cluster;
  LeaderElectionConfig c;
  c.lease_name = "l";
  c.identity = "a";
  c.lease_duration = seconds(10);
  c.renew_deadline = seconds(10);
  absl::Status s = LeaderElector::Create(*cluster.api, c).status();
  EXPECT_TRUE(absl::IsInvalidArgument(s));
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("lease_duration"));
  c.renew_deadline = seconds(5);
  c.retry_period = seconds(5);
  EXPECT_TRUE(absl::IsInvalidArgument(LeaderElector::Create(*cluster.api, c).status()));
  c.retry_period = seconds(2);
  c.identity = "";
  EXPECT_TRUE(absl::IsInvalidArgument(LeaderElector::Create(*cluster.api, c).status()));
}

TEST(LeaderElectionThreadsTest, TwoElectorsNeverLeadTogether) {
  FakeCluster cluster;
  std::atomic<int> leaders{0};
  std::atomic<int> max_leaders{0};
  std::atomic<int> a_started{0}, b_started{0}, a_stopped{0};
  auto make = [&](const std::string& id, std::atomic<int>* started, std::atomic<int>* stopped) {
    LeaderElectionConfig c;
    c.lease_name = "tessera-scheduler";
    c.identity = id;
    c.lease_duration = milliseconds(3000);
    c.renew_deadline = milliseconds(2000);
    c.retry_period = milliseconds(20);
    c.on_started_leading = [&, started] {
      int n = ++leaders;
      int m = max_leaders.load();
      while (n > m && !max_leaders.compare_exchange_weak(m, n)) {
      }
      ++*started;
    };
    c.on_stopped_leading = [&, stopped] {
      --leaders;
      if (stopped != nullptr) ++*stopped;
    };
    return std::move(*LeaderElector::Create(*cluster.api, c));
  };
  std::unique_ptr<LeaderElector> a = make("a", &a_started, &a_stopped);
  std::unique_ptr<LeaderElector> b = make("b", &b_started, nullptr);
  a->Start();
  ASSERT_TRUE(WaitUntil([&] { return a->IsLeader(); }));
  b->Start();
  ASSERT_TRUE(WaitUntil([&] { return b->leader() == "a"; }));
  EXPECT_FALSE(b->IsLeader());
  a->Stop();  // releases: b takes over at its next try, long before the lease would expire
  EXPECT_EQ(a_stopped, 1);
  ASSERT_TRUE(WaitUntil([&] { return b->IsLeader(); }));
  b->Stop();
  EXPECT_EQ(max_leaders, 1);
  EXPECT_EQ(leaders, 0);
  EXPECT_EQ(a_started, 1);
  EXPECT_EQ(b_started, 1);
}

}  // namespace
}  // namespace tessera::k8s
