// When a pod whose claims Tessera placed cannot bind (docs/dra.md, "When the pod cannot bind"): Tessera wrote
// the allocation and lifted the gate, and kube-scheduler keeps refusing the allocation's node (the node was
// deleted, its CPU or memory was taken meanwhile, or a constraint Tessera does not model, a host port, says
// no). The DRA controller then deallocates the claims and places them again, away from that node.
//
// The decision is pure, in two steps, so that the controller keeps the only state (how long it has seen an
// allocation refused, by its signature):
//
//   Releasable r = FindReleasable(pod, claims);        // Tessera's claims of a placed, unbound pod?
//   if (r.ours) {
//     RebindDecision d = DecideRebind(r, ReadRefusal(pod), node_state(r.node), refused_for(r.signature),
//                                     std::chrono::seconds(30));
//     if (d.kind == RebindDecision::Kind::kRelease) ...deallocate r.claims, saying d.reason
//   }
//
// Never released: a pod that is bound, being deleted, done, gated or not labelled `placed`; a claim shared
// with another consumer (its reservedFor names another pod) or allocated by another allocator (its shareIDs
// are not Tessera's, DraAllocator::AllocatedByTessera); a claim being deleted.
//
// Thread-safety: pure functions.
#ifndef TESSERA_SCHEDULER_DRA_REBIND_H_
#define TESSERA_SCHEDULER_DRA_REBIND_H_

#include <chrono>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace tessera::scheduler::dra {

// What kube-scheduler last said of the pod: its PodScheduled condition False with reason Unschedulable.
struct Refusal {
  bool refused = false;
  std::string message;  // kube-scheduler's ("0/1 nodes are available: 1 node(s) didn't have free ports ...")
};
Refusal ReadRefusal(const nlohmann::json& pod);

// The claims of a pod that Tessera may deallocate.
struct Releasable {
  bool ours = false;
  std::string node;            // where they are allocated
  std::vector<size_t> claims;  // indexes into the claims given
  // The allocation refused: the node and each claim's UID and allocationTimestamp. A claim placed again
  // has another, so the controller's clock starts again.
  std::string signature;
  std::string why_not;  // when !ours
};
// `claims`: the pod's ResourceClaims, in spec.resourceClaims order.
Releasable FindReleasable(const nlohmann::json& pod, const std::vector<nlohmann::json>& claims);

// The allocation's node, as the controller sees it.
struct RebindNode {
  bool exists = true;  // the Node object is known
  bool fits = true;    // it still has the CPU and memory the pod requests, beside the pods bound to it
};

struct RebindDecision {
  enum class Kind {
    kKeep,     // kube-scheduler does not refuse the pod (or releasing is off)
    kWatch,    // refused for less than `after` so far: it may still bind (a pod that frees the node)
    kRelease,  // deallocate the claims now; `reason` says why
  };
  Kind kind = Kind::kKeep;
  std::string reason;
};
// `refused_for`: how long the controller has seen this allocation (its signature) refused. `after`: how long
// a refusal may last (0: never release). A node that is gone or no longer has the pod's CPU or memory is
// released at the first refusal: waiting cannot help there.
RebindDecision DecideRebind(const Releasable& releasable, const Refusal& refusal, RebindNode node,
                            std::chrono::steady_clock::duration refused_for, std::chrono::seconds after);

}  // namespace tessera::scheduler::dra

#endif  // TESSERA_SCHEDULER_DRA_REBIND_H_
