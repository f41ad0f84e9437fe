// When Tessera releases the claims of a pod kube-scheduler does not bind (src/scheduler/dra_rebind.h): which
// claims are Tessera's to release, and when. The objects are written as the API states them: a pod's
// PodScheduled condition as kube-scheduler sets it for a pod no node takes (status False, reason
// Unschedulable, k8s.io/api core/v1 PodReasonUnschedulable; the message is kube-scheduler v1.37's for a host
// port taken), a claim's status.allocation and reservedFor as resource.k8s.io/v1 has them.
#include "scheduler/dra_rebind.h"

#include <gtest/gtest.h>

#include <chrono>

#include "formats/dra_placement.h"
#include "scheduler/dra_allocator.h"

namespace tessera::scheduler::dra {
namespace {

using Json = nlohmann::json;
using std::chrono::seconds;

constexpr char kRefused[] =
    "0/1 nodes are available: 1 node(s) didn't have free ports for the requested pod ports. preemption: 0/1 "
    "nodes are available: 1 No preemption victims found for incoming pod.";

// A pod whose claims Tessera placed (label placed, gate lifted), not bound, refused by kube-scheduler.
Json PlacedPod(bool refused = true) {
  Json pod = {{"metadata",
               {{"name", "p"},
                {"namespace", "default"},
                {"uid", "pod-uid"},
                {"labels", {{formats::kDraPlacementLabel, formats::kDraPlaced}}}}},
              {"spec", {{"resourceClaims", {{{"name", "gpu"}, {"resourceClaimName", "c"}}}}}},
              {"status", {{"phase", "Pending"}}}};
  if (refused) {
    pod["status"]["conditions"] = {
        {{"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}, {"message", kRefused}}};
  }
  return pod;
}

// A claim allocated on `node` and reserved for the pod; by Tessera (its shareIDs) unless told otherwise.
Json Claim(const std::string& uid, const std::string& node, bool by_tessera = true) {
  Json claim = {{"metadata", {{"name", "claim-" + uid}, {"namespace", "default"}, {"uid", uid}}}};
  Json result = {
      {"request", "gpu"},
      {"driver", "gpu.tessera.dev"},
      {"pool", node},
      {"device", "gpu-6"},
      {"consumedCapacity", {{"cores", "40"}, {"memory", "8Gi"}}},
      // kube-scheduler's shareIDs are random UUIDs; this one is not Tessera's for any claim.
      {"shareID", by_tessera ? DraAllocator::ShareIdFor(uid, 0) : "0b7e4a2c-5c1d-4f6e-9a3b-2d8c7f1e0a94"}};
  claim["status"] = {
      {"allocation",
       {{"devices", {{"results", {result}}}},
        {"nodeSelector",
         {{"nodeSelectorTerms",
           {{{"matchFields", {{{"key", "metadata.name"}, {"operator", "In"}, {"values", {node}}}}}}}}}},
        {"allocationTimestamp", "2026-11-27T05:00:00Z"}}},
      {"reservedFor", {{{"resource", "pods"}, {"name", "p"}, {"uid", "pod-uid"}}}}};
  return claim;
}

TEST(DraRebindTest, ShareIdsMarkTesserasAllocations) {
  const std::string id = DraAllocator::ShareIdFor("3f9d", 0);
  // An RFC 4122 version 4 UUID in lower case, as the API validates a shareID.
  ASSERT_EQ(id.size(), 36u);
  EXPECT_EQ(id[14], '4');
  EXPECT_NE(std::string("89ab").find(id[19]), std::string::npos) << id;
  EXPECT_EQ(id, DraAllocator::ShareIdFor("3f9d", 0));  // the same in every replica and round
  EXPECT_NE(id, DraAllocator::ShareIdFor("3f9d", 1));
  EXPECT_NE(id, DraAllocator::ShareIdFor("3f9e", 0));
  EXPECT_TRUE(DraAllocator::AllocatedByTessera(Claim("u1", "node-a")));
  EXPECT_FALSE(DraAllocator::AllocatedByTessera(Claim("u1", "node-a", /*by_tessera=*/false)));
  Json whole = Claim("u1", "node-a");  // a device taken whole has no shareID: it cannot be told apart
  whole["status"]["allocation"]["devices"]["results"][0].erase("shareID");
  EXPECT_FALSE(DraAllocator::AllocatedByTessera(whole));
  Json other_driver = Claim("u1", "node-a");
  other_driver["status"]["allocation"]["devices"]["results"][0]["driver"] = "gpu.nvidia.com";
  EXPECT_FALSE(DraAllocator::AllocatedByTessera(other_driver));
  EXPECT_FALSE(DraAllocator::AllocatedByTessera(Json::object()));
}

TEST(DraRebindTest, ReadsKubeSchedulersRefusal) {
  Refusal r = ReadRefusal(PlacedPod());
  EXPECT_TRUE(r.refused);
  EXPECT_EQ(r.message, kRefused);
  EXPECT_FALSE(ReadRefusal(PlacedPod(/*refused=*/false)).refused);
  // Gated is not refused: kube-scheduler has not tried it.
  Json gated = PlacedPod();
  gated["status"]["conditions"][0]["reason"] = "SchedulingGated";
  EXPECT_FALSE(ReadRefusal(gated).refused);
  Json scheduled = PlacedPod();
  scheduled["status"]["conditions"][0]["status"] = "True";
  EXPECT_FALSE(ReadRefusal(scheduled).refused);
  EXPECT_FALSE(ReadRefusal(Json("not a pod")).refused);
}

TEST(DraRebindTest, ReleasesTesserasClaimsOfARefusedPodAfterTheBound) {
  const Json pod = PlacedPod();
  Releasable r = FindReleasable(pod, {Claim("u1", "node-a")});
  ASSERT_TRUE(r.ours) << r.why_not;
  EXPECT_EQ(r.node, "node-a");
  EXPECT_EQ(r.claims, std::vector<size_t>{0});
  EXPECT_EQ(r.signature, "node-a|u1@2026-11-27T05:00:00Z");
  const Refusal refused = ReadRefusal(pod);
  // Refused, but kube-scheduler may still bind it (a pod leaving the node): watched until the bound.
  EXPECT_EQ(DecideRebind(r, refused, {}, seconds(29), seconds(30)).kind, RebindDecision::Kind::kWatch);
  RebindDecision d = DecideRebind(r, refused, {}, seconds(30), seconds(30));
  EXPECT_EQ(d.kind, RebindDecision::Kind::kRelease);
  EXPECT_EQ(d.reason, "kube-scheduler has not bound the pod to node node-a for 30 s");
  // Not refused (kube-scheduler has not tried yet, or binds it now): kept, whatever the time.
  EXPECT_EQ(DecideRebind(r, ReadRefusal(PlacedPod(false)), {}, seconds(3600), seconds(30)).kind,
            RebindDecision::Kind::kKeep);
  // Releasing turned off.
  EXPECT_EQ(DecideRebind(r, refused, {.exists = false}, seconds(3600), seconds(0)).kind,
            RebindDecision::Kind::kKeep);
}

TEST(DraRebindTest, ANodeGoneOrFullIsReleasedAtTheFirstRefusal) {
  const Json pod = PlacedPod();
  Releasable r = FindReleasable(pod, {Claim("u1", "node-a")});
  ASSERT_TRUE(r.ours);
  RebindDecision gone = DecideRebind(r, ReadRefusal(pod), {.exists = false}, seconds(0), seconds(30));
  EXPECT_EQ(gone.kind, RebindDecision::Kind::kRelease);
  EXPECT_EQ(gone.reason, "node node-a is gone");
  RebindDecision full =
      DecideRebind(r, ReadRefusal(pod), {.exists = true, .fits = false}, seconds(0), seconds(30));
  EXPECT_EQ(full.kind, RebindDecision::Kind::kRelease);
  EXPECT_EQ(full.reason, "node node-a no longer has the CPU or memory the pod requests");
  // But only once kube-scheduler says it cannot bind it: the controller's view may be behind.
  EXPECT_EQ(DecideRebind(r, ReadRefusal(PlacedPod(false)), {.exists = false}, seconds(0), seconds(30)).kind,
            RebindDecision::Kind::kKeep);
}

TEST(DraRebindTest, WhatIsNeverReleased) {
  auto why_not = [](const Json& pod, const std::vector<Json>& claims) {
    Releasable r = FindReleasable(pod, claims);
    EXPECT_FALSE(r.ours);
    EXPECT_TRUE(r.claims.empty());
    return r.why_not;
  };
  // A claim shared with another pod (its reservation keeps the other pod's device).
  Json shared = Claim("u1", "node-a");
  shared["status"]["reservedFor"].push_back({{"resource", "pods"}, {"name", "q"}, {"uid", "other-uid"}});
  EXPECT_EQ(why_not(PlacedPod(), {shared}), "claim claim-u1 is shared with pods q");
  // A claim kube-scheduler allocated (a pod handed over, or kube-scheduler first after a release).
  EXPECT_EQ(why_not(PlacedPod(), {Claim("u1", "node-a", false)}),
            "claim claim-u1 was allocated by another allocator");
  // One such claim among Tessera's keeps the pod on its node: nothing is released.
  EXPECT_EQ(why_not(PlacedPod(), {Claim("u1", "node-a"), Claim("u2", "node-a", false)}),
            "claim claim-u2 was allocated by another allocator");
  Json deleting = Claim("u1", "node-a");
  deleting["metadata"]["deletionTimestamp"] = "2026-11-27T05:01:00Z";
  EXPECT_EQ(why_not(PlacedPod(), {deleting}), "claim claim-u1 is being deleted");
  // The pod: bound (the claims are in use), being deleted, gated, handed over, not Tessera's at all.
  Json bound = PlacedPod();
  bound["spec"]["nodeName"] = "node-a";
  EXPECT_EQ(why_not(bound, {Claim("u1", "node-a")}), "it is bound");
  Json going = PlacedPod();
  going["metadata"]["deletionTimestamp"] = "2026-11-27T05:01:00Z";
  EXPECT_EQ(why_not(going, {Claim("u1", "node-a")}), "it is being deleted or done");
  Json gated = PlacedPod();
  gated["spec"]["schedulingGates"] = {{{"name", "kueue.x-k8s.io/admission"}}};
  EXPECT_EQ(why_not(gated, {Claim("u1", "node-a")}), "it has a scheduling gate");
  Json fallback = PlacedPod();
  fallback["metadata"]["labels"][formats::kDraPlacementLabel] = formats::kDraFallback;
  EXPECT_EQ(why_not(fallback, {Claim("u1", "node-a")}), "its claims were not placed by Tessera");
  // Nothing allocated: nothing to release (placing it again is another path).
  Json unallocated = Claim("u1", "node-a");
  unallocated.erase("status");
  EXPECT_EQ(why_not(PlacedPod(), {unallocated}), "none of its claims is allocated");
  // Whatever it is not, the decision keeps it.
  EXPECT_EQ(DecideRebind(FindReleasable(PlacedPod(), {shared}), ReadRefusal(PlacedPod()), {.exists = false},
                         seconds(3600), seconds(30))
                .kind,
            RebindDecision::Kind::kKeep);
}

TEST(DraRebindTest, APlacementAgainStartsTheClockAgain) {
  // The signature changes with the allocation: the controller's clock for the refusal starts again.
  Json again = Claim("u1", "node-b");
  again["status"]["allocation"]["allocationTimestamp"] = "2026-11-27T05:00:40Z";
  EXPECT_NE(FindReleasable(PlacedPod(), {Claim("u1", "node-a")}).signature,
            FindReleasable(PlacedPod(), {again}).signature);
  // A released claim (reservation gone, allocation kept by a partial write) is still Tessera's.
  Json unreserved = Claim("u1", "node-a");
  unreserved["status"].erase("reservedFor");
  EXPECT_TRUE(FindReleasable(PlacedPod(), {unreserved}).ours);
}

}  // namespace
}  // namespace tessera::scheduler::dra
