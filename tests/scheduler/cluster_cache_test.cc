// The scheduler's cache: rebuilt from the API's pods alone, reservations held and released, nodes that come,
// go and change.
#include "scheduler/cluster_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <thread>

#include "common/clock.h"
#include "formats/assignment.h"
#include "formats/cluster_file.h"
#include "scheduler/quota_file.h"
#include "temp_dir.h"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::tessera::testing::MakeNode;
using ::tessera::testing::MakePod;
using ::tessera::testing::Share;
using ::testing::HasSubstr;

CacheOptions Options() {
  CacheOptions o;
  o.policy = "tessera";
  o.seed = 7;
  return o;
}

// A bound pod as the API shows it: 30% + 2048 MiB on the given GPU.
formats::PodObject BoundPod(const std::string& uid, const std::string& node, const std::string& gpu_uuid,
                            int cores = 30) {
  formats::PodObject pod;
  pod.spec.name = uid;
  pod.spec.uid = uid;
  pod.spec.containers.push_back(
      {"main",
       {{"tessera.dev/gpu-cores", std::to_string(cores)}, {"tessera.dev/gpu-memory", "2048"}},
       {},
       false});
  pod.node_name = node;
  pod.phase = "Running";
  core::Placement p;
  p.node = core::NodeName(node);
  core::ContainerAssignment main;
  main.name = "main";
  main.vgpus.push_back({-1, core::GpuUuid(gpu_uuid), core::MilliGpu(cores * 10), core::MiB(2048)});
  p.containers.push_back(main);
  pod.spec.annotations[formats::kAnnotationAssignment] = formats::FormatAssignment(p);
  return pod;
}

TEST(ClusterCacheTest, RebuildsFromTheApiAlone) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("a", "n1", "GPU-n1-1")).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("b", "n1", "GPU-n1-1", 50)).ok());
  core::Cluster c = cache.Snapshot();
  const core::NodeState* n = c.FindNode(core::NodeName("n1"));
  EXPECT_EQ(n->free_cores(1).value(), 200);
  EXPECT_EQ(n->free_cores(0).value(), 1000);
  // The same pod seen again (a watch update) changes nothing.
  ASSERT_TRUE(cache.ObservePod(BoundPod("a", "n1", "GPU-n1-1")).ok());
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(1).value(), 200);
  // It finishes: its share is free again.
  formats::PodObject done = BoundPod("a", "n1", "GPU-n1-1");
  done.phase = "Succeeded";
  ASSERT_TRUE(cache.ObservePod(done).ok());
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(1).value(), 500);
  cache.ForgetPod(core::PodUid("b"));
  EXPECT_EQ(cache.pod_count(), 0);
}

TEST(ClusterCacheTest, GpuIndicesFollowTheUuids) {
  // The assignment says index 0, but the UUID is the node's GPU 1 (the inventory was reordered).
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  formats::PodObject pod = BoundPod("a", "n1", "GPU-n1-1");
  ASSERT_TRUE(cache.ObservePod(pod).ok());
  EXPECT_EQ(cache.FindPod(core::PodUid("a"))->placement.containers[0].vgpus[0].gpu_index, 1);
}

TEST(ClusterCacheTest, BadAssignmentsAreReportedAndRecordNothing) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  formats::PodObject pod = BoundPod("a", "n1", "GPU-n1-0");
  pod.spec.annotations[formats::kAnnotationAssignment] = "{broken";
  absl::Status st = cache.ObservePod(pod);
  EXPECT_THAT(std::string(st.message()), HasSubstr("not valid JSON"));
  pod = BoundPod("a", "n2", "GPU-n1-0");
  pod.node_name = "n1";
  EXPECT_THAT(std::string(cache.ObservePod(pod).message()), HasSubstr("names node n2"));
  // Two pods that together overcommit a GPU (someone edited the annotations): the second is refused.
  ASSERT_TRUE(cache.ObservePod(BoundPod("x", "n1", "GPU-n1-0", 70)).ok());
  EXPECT_FALSE(cache.ObservePod(BoundPod("y", "n1", "GPU-n1-0", 70)).ok());
  EXPECT_EQ(cache.pod_count(), 1);
}

TEST(ClusterCacheTest, PodsOfAnUnknownNodeWaitForIt) {
  ClusterCache cache(Options());
  EXPECT_TRUE(absl::IsNotFound(cache.ObservePod(BoundPod("a", "late", "GPU-late-0"))));
  EXPECT_EQ(cache.Orphans().size(), 1u);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("late", 1)).ok());
  EXPECT_TRUE(cache.Orphans().empty());
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("late"))->free_cores(0).value(), 700);
  // The node goes away and comes back: its pods come back with it.
  cache.RemoveNode(core::NodeName("late"));
  EXPECT_EQ(cache.node_count(), 0);
  EXPECT_EQ(cache.Orphans().size(), 1u);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("late", 1)).ok());
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("late"))->free_cores(0).value(), 700);
}

// A node that arrives takes the pods that waited for it, and only those: the others keep waiting for theirs.
// (Every waiting pod was tried at every node's arrival, which made a restart that listed 5,000 pods before
// 5,000 nodes quadratic.) A node whose hardware changes takes those that waited for a GPU it now has; before,
// they waited for some other node to arrive.
TEST(ClusterCacheTest, ANodeAdoptsThePodsThatWaitedForIt) {
  ClusterCache cache(Options());
  EXPECT_TRUE(absl::IsNotFound(cache.ObservePod(BoundPod("a", "n1", "GPU-n1-0"))));
  EXPECT_TRUE(absl::IsNotFound(cache.ObservePod(BoundPod("b", "n2", "GPU-n2-0"))));
  EXPECT_TRUE(absl::IsNotFound(cache.ObservePod(BoundPod("c", "n1", "GPU-n1-1"))));
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  EXPECT_TRUE(cache.FindPod(core::PodUid("a")).has_value());
  ASSERT_EQ(cache.Orphans().size(), 2u);  // b's node and c's GPU are not there
  // n1 gets a second GPU: c's.
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  EXPECT_TRUE(cache.FindPod(core::PodUid("c")).has_value());
  ASSERT_EQ(cache.Orphans().size(), 1u);
  EXPECT_THAT(cache.Orphans()[0], HasSubstr("(b)"));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(1).value(), 700);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n2", 1)).ok());
  EXPECT_TRUE(cache.Orphans().empty());
  EXPECT_EQ(cache.pod_count(), 3);
}

TEST(ClusterCacheTest, ChangedHardwareKeepsThePodsThatStillFit) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("a", "n1", "GPU-n1-0")).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("b", "n1", "GPU-n1-1")).ok());
  // GPU 1 is replaced by another card (new UUID): pod b's GPU is gone.
  core::NodeInfo changed = MakeNode("n1", 2);
  changed.gpus[1].uuid = core::GpuUuid("GPU-new");
  ASSERT_TRUE(cache.UpsertNode(changed).ok());
  EXPECT_EQ(cache.pod_count(), 1);
  ASSERT_EQ(cache.Orphans().size(), 1u);
  EXPECT_THAT(cache.Orphans()[0], HasSubstr("(b)"));
  // Health changes in place.
  core::NodeInfo sick = changed;
  sick.gpus[0].health = core::GpuHealth::kUnhealthy;
  ASSERT_TRUE(cache.UpsertNode(sick).ok());
  EXPECT_FALSE(cache.Snapshot().FindNode(core::NodeName("n1"))->healthy().Has(0));
  EXPECT_EQ(cache.pod_count(), 1);
}

TEST(ClusterCacheTest, ReservationsHoldUntilConfirmedOrReleased) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  core::PodRequest a = MakePod("a", {Share(60)});
  core::PodRequest b = MakePod("b", {Share(60)});
  absl::StatusOr<Reservation> r = cache.Reserve(a, core::NodeName("n1"));
  ASSERT_TRUE(r.ok()) << r.status();
  // The share is held: b does not fit while a's bind is in flight.
  EXPECT_FALSE(cache.Reserve(b, core::NodeName("n1")).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(cache.Reserve(a, core::NodeName("n1")).status()));
  cache.Unreserve(a.uid);
  EXPECT_TRUE(cache.Reserve(b, core::NodeName("n1")).ok());
  cache.Confirm(b.uid);
  cache.Unreserve(b.uid);  // confirmed: not a reservation any more
  EXPECT_EQ(cache.pod_count(), 1);
  // A reservation whose bind never finishes expires (time through the clock seam, no sleeping).
  FakeClock clock;
  CacheOptions o = Options();
  o.clock = &clock;
  ClusterCache other(o);
  ASSERT_TRUE(other.UpsertNode(MakeNode("n1", 1)).ok());
  ASSERT_TRUE(other.Reserve(a, core::NodeName("n1")).ok());
  clock.Advance(std::chrono::seconds(59));
  EXPECT_EQ(other.ExpireReservations(std::chrono::seconds(60)), 0);
  clock.Advance(std::chrono::seconds(2));
  EXPECT_EQ(other.ExpireReservations(std::chrono::seconds(60)), 1);
  EXPECT_EQ(other.pod_count(), 0);
}

TEST(ClusterCacheTest, AReservationSurvivesAWatchEventThatPredatesTheBind) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  core::PodRequest a = MakePod("a", {Share(30, 2048)});
  ASSERT_TRUE(cache.Reserve(a, core::NodeName("n1")).ok());
  // The watch delivers the pod as it was before our bind: pending, no assignment.
  formats::PodObject pending;
  pending.spec.name = "a";
  pending.spec.uid = "a";
  pending.spec.containers.push_back(
      {"main", {{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "2048"}}, {}, false});
  pending.phase = "Pending";
  ASSERT_TRUE(cache.ObservePod(pending).ok());
  EXPECT_EQ(cache.pod_count(), 1);
  // Then as bound: the reservation becomes a record.
  formats::PodObject bound = BoundPod("a", "n1", "GPU-n1-0");
  ASSERT_TRUE(cache.ObservePod(bound).ok());
  EXPECT_FALSE(cache.FindPod(a.uid)->reserved);
}

// Found by the soak (soak_test.cc): the bind is confirmed before the watch delivers the pod's pre-bind state.
// Releasing the share then would let another pod take it while this one holds it.
TEST(ClusterCacheTest, AConfirmedBindSurvivesALateEventFromBeforeIt) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  core::PodRequest a = MakePod("a", {Share(80, 2048)});
  ASSERT_TRUE(cache.Reserve(a, core::NodeName("n1")).ok());
  cache.Confirm(a.uid);
  formats::PodObject pending;
  pending.spec.name = "a";
  pending.spec.uid = "a";
  pending.spec.containers.push_back(
      {"main", {{"tessera.dev/gpu-cores", "80"}, {"tessera.dev/gpu-memory", "2048"}}, {}, false});
  pending.phase = "Pending";
  ASSERT_TRUE(cache.ObservePod(pending).ok());
  EXPECT_EQ(cache.pod_count(), 1);
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 200);
  EXPECT_FALSE(cache.Reserve(MakePod("b", {Share(80, 2048)}), core::NodeName("n1")).ok());
  // A pod that finished does give its share back.
  pending.phase = "Succeeded";
  ASSERT_TRUE(cache.ObservePod(pending).ok());
  EXPECT_EQ(cache.pod_count(), 0);
}

// Found on the cluster tier: a share the cache changed (compressed for a high-priority pod, or given back
// when it left) is written to the API a moment later, and an event about the pod from before that write (a
// status update) carries the old assignment. Taken as the truth, it undid the change: a give-back undone so
// was never written, and the low-priority pod kept 40% of a GPU nobody else used.
TEST(ClusterCacheTest, AShareChangeNotYetWrittenSurvivesEventsFromBeforeIt) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  const formats::PodObject low80 = BoundPod("low", "n1", "GPU-n1-0", 80);
  ASSERT_TRUE(cache.ObservePod(low80).ok());
  const auto cores_of_low = [&] {
    return cache.FindPod(core::PodUid("low"))->placement.containers[0].vgpus[0].cores;
  };
  // A high-priority pod compresses it to 40%.
  core::PodRequest high = MakePod("high", {Share(60, 2048)});
  high.priority = core::Priority::kHigh;
  ASSERT_TRUE(cache.Reserve(high, core::NodeName("n1")).ok());
  cache.Confirm(high.uid);
  ASSERT_EQ(cores_of_low(), core::MilliGpu(400));
  ASSERT_TRUE(cache.ObservePod(low80).ok());  // from before the compression was written
  EXPECT_EQ(cores_of_low(), core::MilliGpu(400));
  std::vector<PodEntry> changed = cache.TakeChangedShares();
  ASSERT_EQ(changed.size(), 1u);
  const core::Placement compressed = changed[0].placement;
  EXPECT_EQ(compressed.containers[0].vgpus[0].requested, core::MilliGpu(800));
  formats::PodObject low40 = low80;
  low40.spec.annotations[formats::kAnnotationAssignment] = formats::FormatAssignment(compressed);
  ASSERT_TRUE(cache.ObservePod(low40).ok());  // the write, seen
  // The high-priority pod goes: the share comes back, and stays back while the API still shows 40%.
  cache.ForgetPod(high.uid);
  ASSERT_EQ(cores_of_low(), core::MilliGpu(800));
  ASSERT_TRUE(cache.ObservePod(low40).ok());
  EXPECT_EQ(cores_of_low(), core::MilliGpu(800));
  changed = cache.TakeChangedShares();
  ASSERT_EQ(changed.size(), 1u);
  EXPECT_EQ(changed[0].placement.containers[0].vgpus[0].cores, core::MilliGpu(800));
  ASSERT_TRUE(cache.ObservePod(low80).ok());  // written and seen
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 200);
  // Once seen, the API is the truth again: a later rewrite by anyone is followed.
  ASSERT_TRUE(cache.ObservePod(BoundPod("low", "n1", "GPU-n1-0", 50)).ok());
  EXPECT_EQ(cores_of_low(), core::MilliGpu(500));
}

// What a replica that takes the lead starts from (ApiBackend::EnsureLedgerCurrent): the pods as the API has
// them, whatever its ledger made of them before, and its own reservations.
TEST(ClusterCacheTest, ReplacedPodsAreTheApisAndReservationsStay) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  const formats::PodObject low80 = BoundPod("low", "n1", "GPU-n1-0", 80);
  ASSERT_TRUE(cache.ObservePod(low80).ok());
  // A high-priority pod reserved here compresses it to 40%; the API has that written.
  core::PodRequest high = MakePod("high", {Share(60, 2048)});
  high.priority = core::Priority::kHigh;
  ASSERT_TRUE(cache.Reserve(high, core::NodeName("n1")).ok());
  formats::PodObject low40 = low80;
  low40.spec.annotations[formats::kAnnotationAssignment] =
      formats::FormatAssignment(cache.FindPod(core::PodUid("low"))->placement);
  // The share change this ledger has to write is the API's already: nothing is left to write.
  const std::vector<formats::PodObject> api = {low40};
  EXPECT_TRUE(cache.ReplacePods(api).empty());
  EXPECT_EQ(cache.FindPod(core::PodUid("low"))->placement.containers[0].vgpus[0].cores, core::MilliGpu(400));
  EXPECT_TRUE(cache.FindPod(high.uid)->reserved);
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 0);
  EXPECT_TRUE(cache.TakeChangedShares().empty());
  // A pod the ledger had and the API has no more is gone; one it lacked is recorded; one that does not fit is
  // named by its index.
  const formats::PodObject other = BoundPod("other", "n1", "GPU-n1-0", 10);
  const std::vector<formats::PodObject> next = {BoundPod("low", "n1", "GPU-n1-0", 30), other,
                                                BoundPod("big", "n1", "GPU-n1-0", 50)};
  std::vector<std::pair<size_t, absl::Status>> errors = cache.ReplacePods(next);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].first, 2u);
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(0).value(), 0);
  EXPECT_TRUE(cache.FindPod(core::PodUid("other")).has_value());
  EXPECT_FALSE(cache.FindPod(core::PodUid("big")).has_value());
}

TEST(ClusterCacheTest, UnknownNodesAreUnresolvableInFilter) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  const std::vector<std::string> nodes = {"n1", "nowhere"};
  FilterOutcome f = cache.Filter(MakePod("a", {Share(30)}), nodes);
  EXPECT_EQ(f.fits, std::vector<std::string>{"n1"});
  EXPECT_TRUE(f.unresolvable.contains("nowhere"));
}

// Filter by position answers as Filter by name does, and Prioritize lists the fitting nodes first.
TEST(ClusterCacheTest, AnswersByPositionNameTheSameNodes) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 1)).ok());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n2", 2)).ok());
  ASSERT_TRUE(cache.Reserve(MakePod("full", {Share(100)}), core::NodeName("n1")).ok());
  const std::vector<std::string_view> nodes = {"nowhere", "n1", "n2", "n2"};
  FilterVerdicts f = cache.FilterAt(MakePod("a", {Share(30)}), nodes);
  EXPECT_EQ(f.fits, (std::vector<uint32_t>{2, 3}));
  ASSERT_EQ(f.unresolvable.size(), 1u);
  EXPECT_EQ(f.unresolvable[0].first, 0u);
  ASSERT_EQ(f.failed.size(), 1u);
  EXPECT_EQ(f.failed[0].first, 1u);
  const std::vector<PositionScore> p = cache.PrioritizeAt(MakePod("a", {Share(30)}), nodes);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].position, 2u);
  EXPECT_EQ(p[1].position, 3u);
  EXPECT_EQ(p[0].score, kMaxExtenderPriority);
  EXPECT_EQ(p[2].position, 0u);
  EXPECT_EQ(p[3].position, 1u);
  EXPECT_EQ(p[3].score, 0);
}

// The warming thread evaluates ahead of the verbs (CacheOptions::warm_shapes) and changes no answer: a cache
// that waits for it after every verb decides as one without it, through policy rebuilds and binds.
TEST(ClusterCacheTest, WarmingChangesNoAnswer) {
  auto options = [](size_t warm) {
    CacheOptions o = Options();
    o.rebuild_after = 3;
    o.warm_shapes = warm;
    return o;
  };
  ClusterCache warmed(options(16)), cold(options(0));
  std::vector<std::string> names;
  for (int i = 0; i < 12; ++i) {
    names.push_back("n" + std::to_string(i));
    for (ClusterCache* c : {&warmed, &cold}) {
      ASSERT_TRUE(
          c->UpsertNode(MakeNode(names.back(), 2 + i % 3, core::MiB(16384), i % 2 ? "T4" : "L4")).ok());
    }
  }
  for (int i = 0; i < 40; ++i) {
    const core::PodRequest pod = MakePod("p" + std::to_string(i), {Share(10 * (1 + i % 4))});
    FilterOutcome a = warmed.Filter(pod, names);
    warmed.WaitForWarming();
    FilterOutcome b = cold.Filter(pod, names);
    ASSERT_EQ(a.fits, b.fits) << i;
    ASSERT_EQ(a.failed, b.failed) << i;
    std::vector<HostScore> sa = warmed.Prioritize(pod, names);
    warmed.WaitForWarming();
    std::vector<HostScore> sb = cold.Prioritize(pod, names);
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t k = 0; k < sa.size(); ++k) {
      ASSERT_EQ(sa[k].host, sb[k].host) << i;
      ASSERT_EQ(sa[k].score, sb[k].score) << i;
    }
    if (i % 2 == 0 && !a.fits.empty()) {
      absl::StatusOr<Reservation> ra = warmed.Reserve(pod, core::NodeName(a.fits[0]));
      absl::StatusOr<Reservation> rb = cold.Reserve(pod, core::NodeName(b.fits[0]));
      ASSERT_EQ(ra.ok(), rb.ok());
      if (ra.ok()) {
        EXPECT_EQ(formats::FormatAssignment(ra->placement), formats::FormatAssignment(rb->placement));
      }
    }
  }
  EXPECT_GT(warmed.warmed_evaluations(), 0u);
  EXPECT_EQ(cold.warmed_evaluations(), 0u);
}

// tessera-scheduler --quota-file: the quotas in force follow the file; a file that stops parsing keeps them.
TEST(QuotaFileTest, FollowsTheFileAndKeepsTheQuotasWhenItBreaks) {
  ::tessera::testing::TempDir dir;
  std::string path;
  auto write = [&](const std::string& text) { path = dir.Write("quotas.yaml", text); };  // replaced, as ConfigMaps are
  write("apiVersion: tessera.dev/v1\nkind: GpuQuotas\nquotas:\n  - {namespace: team, model: T4, gpus: 0.5}\n");
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  core::PodRequest big = MakePod("a", {Share(60)});
  big.ns = core::Namespace("team");
  QuotaFile quotas(path, &cache, std::chrono::milliseconds(20));
  ASSERT_TRUE(quotas.Load().ok());
  const std::vector<std::string> nodes = {"n1"};
  FilterOutcome f = cache.Filter(big, nodes);
  EXPECT_TRUE(f.fits.empty());
  EXPECT_THAT(f.unresolvable["n1"] + f.failed["n1"], HasSubstr("(quota)"));
  quotas.Start();
  write("apiVersion: tessera.dev/v1\nkind: GpuQuotas\nquotas:\n  - {namespace: team, model: T4, gpus: 1}\n");
  for (int i = 0; i < 500 && quotas.loads() < 2; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(quotas.loads(), 2) << "the changed file was not read again";
  EXPECT_EQ(cache.Filter(big, nodes).fits, nodes);
  // Broken: refused, and the quotas in force (1 GPU) stay: 120% still does not fit.
  write("apiVersion: tessera.dev/v1\nkind: GpuQuotas\nquotas:\n  - {namespace: team, gpus: lots}\n");
  for (int i = 0; i < 500 && quotas.refusals() < 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(quotas.refusals(), 1);
  core::PodRequest bigger = MakePod("b", {Share(60), Share(60)});
  bigger.ns = core::Namespace("team");
  EXPECT_TRUE(cache.Filter(bigger, nodes).fits.empty());
  EXPECT_EQ(cache.Filter(big, nodes).fits, nodes);
}

TEST(QuotaFileTest, BadFilesSayWhatIsWrong) {
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {"kind: Cluster\nquotas: []\n", "a quota file has kind: GpuQuotas"},
           {"kind: GpuQuotas\nquotas:\n  - {namespace: a, model: T4}\n", "needs namespace, model and gpus"},
           {"kind: GpuQuotas\nquotas:\n  - {namespace: a, model: T4, gpus: 1}\n  - {namespace: a, model: T4, gpus: 2}\n",
            "two quotas for T4"},
           {"kind: GpuQuotas\nquotas: {namespace: a}\n", "must be a list"},
           {"- 1\n", "expected a mapping"}}) {
    absl::StatusOr<std::vector<formats::QuotaEntry>> q = formats::ParseQuotaFile(text, "q.yaml");
    ASSERT_FALSE(q.ok()) << text;
    EXPECT_THAT(std::string(q.status().message()), HasSubstr(message)) << text;
    EXPECT_THAT(std::string(q.status().message()), HasSubstr("q.yaml"));
  }
}

TEST(ScaleScoresTest, BestIsTenWorstIsOneLowerTiersZero) {
  std::vector<std::pair<std::string, core::NodeFit>> fits(4);
  fits[0] = {"a", {}};
  fits[0].second.score = 5;
  fits[1] = {"b", {}};
  fits[1].second.score = 1;
  fits[2] = {"c", {}};
  fits[2].second.score = 3;
  fits[3] = {"d", {}};
  fits[3].second.score = 100;
  fits[3].second.tier = -1;
  std::vector<HostScore> s = ScaleScores(fits);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_EQ(s[0].score, 10);
  EXPECT_EQ(s[1].score, 1);
  EXPECT_EQ(s[2].score, 5);
  EXPECT_EQ(s[3].score, 0);
}

// tessera-node corrects an allocation the kubelet swapped between two pods by rewriting both pods'
// assignments (docs/node-agent.md, "Swapped allocations"); the API shows the two writes one at a time. Found
// by the fault harness (docs/faults.md) and the cluster tier: moved alone, the first pod's old GPU was free
// until the second showed up, a whole-GPU pod was bound there, and the second pod, finding its new GPU
// taken, was counted nowhere.
const char* const kGpu0 = "GPU-n1-0";
const char* const kGpu1 = "GPU-n1-1";

std::string GpuOf(const ClusterCache& cache, const std::string& uid) {
  std::optional<PodEntry> e = cache.FindPod(core::PodUid(uid));
  if (!e || e->placement.containers.empty() || e->placement.containers[0].vgpus.empty()) return "";
  return e->placement.containers[0].vgpus[0].uuid.value();
}

TEST(ClusterCacheTest, PodsSwappedByTheNodeAgentMoveTogetherWithNoGpuFreeBetween) {
  for (const bool p_first : {true, false}) {
    SCOPED_TRACE(p_first ? "p's write lands first" : "q's write lands first");
    ClusterCache cache(Options());
    ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
    ASSERT_TRUE(cache.ObservePod(BoundPod("p", "n1", kGpu0, 100)).ok());
    ASSERT_TRUE(cache.ObservePod(BoundPod("q", "n1", kGpu1, 100)).ok());
    const core::PodRequest z = MakePod("z", {Share(100)});
    const formats::PodObject p_moved = BoundPod("p", "n1", kGpu1, 100);
    const formats::PodObject q_moved = BoundPod("q", "n1", kGpu0, 100);
    EXPECT_TRUE(cache.ObservePod(p_first ? p_moved : q_moved).ok());
    EXPECT_FALSE(cache.Reserve(z, core::NodeName("n1")).ok()) << "a GPU was free between the two writes";
    EXPECT_TRUE(cache.ObservePod(p_first ? q_moved : p_moved).ok());
    EXPECT_EQ(GpuOf(cache, "p"), kGpu1);
    EXPECT_EQ(GpuOf(cache, "q"), kGpu0);
    EXPECT_FALSE(cache.Reserve(z, core::NodeName("n1")).ok());
    cache.ForgetPod(core::PodUid("p"));
    ASSERT_TRUE(cache.Reserve(z, core::NodeName("n1")).ok());
    EXPECT_EQ(GpuOf(cache, "z"), kGpu1);
  }
}

// Pods of different shapes: the whole GPU's pod takes the 20% part and the 20% pod the whole GPU. The first
// write fits alone, so it is made at once; the whole GPU it left stays held for the pod that takes it.
TEST(ClusterCacheTest, APartASwappedPodLeftIsHeldForThePodThatTakesIt) {
  FakeClock clock;
  CacheOptions o = Options();
  o.clock = &clock;
  ClusterCache cache(o);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("whole", "n1", kGpu0, 100)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("small", "n1", kGpu1, 20)).ok());
  const core::PodRequest z = MakePod("z", {Share(100)});
  ASSERT_TRUE(cache.ObservePod(BoundPod("whole", "n1", kGpu1, 20)).ok());
  EXPECT_EQ(GpuOf(cache, "whole"), kGpu1);
  EXPECT_FALSE(cache.Reserve(z, core::NodeName("n1")).ok()) << "the whole GPU left was handed out";
  ASSERT_TRUE(cache.ObservePod(BoundPod("small", "n1", kGpu0, 100)).ok());
  EXPECT_EQ(GpuOf(cache, "small"), kGpu0);
  const core::Cluster snap = cache.Snapshot();
  const core::NodeState* n = snap.FindNode(core::NodeName("n1"));
  // small at 100%, the hold gone with it; whole at 20%, nothing held for the part small left (whole has it).
  EXPECT_EQ(n->free_cores(0).value(), 0);
  EXPECT_EQ(n->free_cores(1).value(), 800);
  // A part left that no pod takes (its taker deleted meanwhile) is free again after the hold's bound.
  ASSERT_TRUE(cache.ObservePod(BoundPod("whole", "n1", kGpu0, 20)).ok());  // a rewrite no counterpart follows
  cache.ForgetPod(core::PodUid("small"));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(1).value(), 800);  // held
  clock.Advance(CacheLedger::kMoveHold + std::chrono::seconds(1));
  cache.ExpireReservations(std::chrono::seconds(60));
  EXPECT_EQ(cache.Snapshot().FindNode(core::NodeName("n1"))->free_cores(1).value(), 1000);
}

// A move that does not fit (its new part held by a pod the API still shows there) waits, the pod counted
// where it was, and is made once room is made.
TEST(ClusterCacheTest, AMoveThatDoesNotFitYetWaitsCountedWhereItWas) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("n1", 2)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("p", "n1", kGpu0, 100)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("r", "n1", kGpu1, 100)).ok());
  ASSERT_TRUE(cache.ObservePod(BoundPod("p", "n1", kGpu1, 100)).ok());
  EXPECT_EQ(GpuOf(cache, "p"), kGpu0);
  EXPECT_EQ(cache.pod_count(), 2);
  cache.ForgetPod(core::PodUid("r"));
  EXPECT_EQ(GpuOf(cache, "p"), kGpu1);
  const core::Cluster snap = cache.Snapshot();
  const core::NodeState* n = snap.FindNode(core::NodeName("n1"));
  EXPECT_EQ(n->free_cores(1).value(), 0);
  EXPECT_EQ(n->free_cores(0).value(), 0);  // held for a taker, up to CacheLedger::kMoveHold
}

}  // namespace
}  // namespace tessera::scheduler
