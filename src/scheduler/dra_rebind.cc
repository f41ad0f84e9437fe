#include "scheduler/dra_rebind.h"

#include <set>
#include <utility>

#include "core/strings.h"
#include "formats/dra_placement.h"
#include "scheduler/dra_allocator.h"

namespace tessera::scheduler::dra {

Refusal ReadRefusal(const Json& pod) {
  Refusal r;
  const Json& conditions = Path(pod, {"status", "conditions"});
  if (!conditions.is_array()) return r;
  for (const Json& c : conditions) {
    if (Str(c, "type") == "PodScheduled" && Str(c, "status") == "False" &&
        Str(c, "reason") == "Unschedulable") {
      r.refused = true;
      r.message = Str(c, "message");
    }
  }
  return r;
}

Releasable FindReleasable(const Json& pod, const std::vector<Json>& claims) {
  Releasable r;
  const Json& meta = Field(pod, "metadata");
  const std::string uid = Str(meta, "uid");
  const std::string phase = Str(Field(pod, "status"), "phase");
  const Json& gates = Path(pod, {"spec", "schedulingGates"});
  if (Str(Field(meta, "labels"), formats::kDraPlacementLabel) != formats::kDraPlaced) {
    r.why_not = "its claims were not placed by Tessera";
  } else if (!Str(Field(pod, "spec"), "nodeName").empty()) {
    r.why_not = "it is bound";
  } else if (!Field(meta, "deletionTimestamp").is_null() || phase == "Succeeded" || phase == "Failed") {
    r.why_not = "it is being deleted or done";
  } else if (gates.is_array() && !gates.empty()) {
    r.why_not = "it has a scheduling gate";
  } else if (uid.empty()) {
    r.why_not = "it has no UID";
  }
  if (!r.why_not.empty()) return r;
  auto never = [&r](std::string why) {
    r.why_not = std::move(why);
    r.claims.clear();
    return r;
  };
  std::set<std::string> nodes;
  std::string signature;
  for (size_t i = 0; i < claims.size(); ++i) {
    const Json& claim = claims[i];
    const std::string name = Str(Field(claim, "metadata"), "name");
    const Json& allocation = Path(claim, {"status", "allocation"});
    if (!allocation.is_object()) continue;
    if (!Path(claim, {"metadata", "deletionTimestamp"}).is_null())
      return never(StrCat("claim ", name, " is being deleted"));
    const Json& reserved = Path(claim, {"status", "reservedFor"});
    if (reserved.is_array()) {
      for (const Json& consumer : reserved) {
        if (Str(consumer, "uid") != uid) {
          r.why_not = StrCat("claim ", name, " is shared with ", Str(consumer, "resource"), " ",
                             Str(consumer, "name"));
          return r;
        }
      }
    }
    if (!DraAllocator::AllocatedByTessera(claim)) {
      return never(StrCat("claim ", name, " was allocated by another allocator"));
    }
    for (const Json& result : Path(allocation, {"devices", "results"})) nodes.insert(Str(result, "pool"));
    r.claims.push_back(i);
    StrAppend(&signature, "|", Str(Field(claim, "metadata"), "uid"), "@",
              Str(allocation, "allocationTimestamp"));
  }
  if (r.claims.empty()) return never("none of its claims is allocated");
  if (nodes.size() != 1) return never("its claims are allocated on several nodes");
  r.ours = true;
  r.node = *nodes.begin();
  r.signature = r.node + signature;
  return r;
}

RebindDecision DecideRebind(const Releasable& releasable, const Refusal& refusal, RebindNode node,
                            std::chrono::steady_clock::duration refused_for, std::chrono::seconds after) {
  RebindDecision d;
  if (!releasable.ours || after.count() <= 0 || !refusal.refused) return d;
  if (!node.exists) {
    d.kind = RebindDecision::Kind::kRelease;
    d.reason = StrCat("node ", releasable.node, " is gone");
  } else if (!node.fits) {
    d.kind = RebindDecision::Kind::kRelease;
    d.reason = StrCat("node ", releasable.node, " no longer has the CPU or memory the pod requests");
  } else if (refused_for >= after) {
    d.kind = RebindDecision::Kind::kRelease;
    d.reason = StrCat("kube-scheduler has not bound the pod to node ", releasable.node, " for ",
                      after.count(), " s");
  } else {
    d.kind = RebindDecision::Kind::kWatch;
  }
  return d;
}

}  // namespace tessera::scheduler::dra
