#include "scheduler/cache/reserve.h"

#include "core/strings.h"

namespace tessera::scheduler {

using core::NodeName;
using core::PodUid;

absl::StatusOr<Reservation> ReservePoint::Reserve(const core::PodRequest& request, const NodeName& node) {
  LedgerLock lock(&ledger_);
  if (auto it = ledger_.pods.find(request.uid); it != ledger_.pods.end()) {
    if (it->second.placement.node == node) {
      return absl::AlreadyExistsError(
          StrCat("pod ", request.FullName(), " already holds GPUs on node ", node.value()));
    }
    return absl::FailedPreconditionError(StrCat("pod ", request.FullName(), " already holds GPUs on node ",
                                                it->second.placement.node.value(), ", not ", node.value()));
  }
  if (ledger_.cluster.FindNode(node) == nullptr) {
    return absl::NotFoundError(
        StrCat("node ", node.value(), " has no Tessera GPU inventory (is tessera-node running there?)"));
  }
  const NodeName candidates[] = {node};
  absl::StatusOr<core::Placement> placement =
      ledger_.placer->Place(ledger_.cluster, request, ledger_.rng, candidates);
  if (!placement.ok()) return placement.status();
  Reservation r;
  r.compressions = placement->compressions;
  if (absl::Status st = ledger_.cluster.Commit(request, *placement); !st.ok()) return st;
  r.placement = *ledger_.cluster.FindPlacement(request.uid);
  ledger_.pods[request.uid] = PodEntry{request, r.placement, true, ledger_.SteadyNow()};
  for (const core::Compression& c : r.compressions) ledger_.FollowShareLocked(c.tenant.pod);
  return r;
}

void ReservePoint::Confirm(const PodUid& uid) {
  LedgerLock lock(&ledger_);
  auto it = ledger_.pods.find(uid);
  if (it != ledger_.pods.end()) it->second.reserved = false;
}

void ReservePoint::Unreserve(const PodUid& uid) {
  LedgerLock lock(&ledger_);
  auto it = ledger_.pods.find(uid);
  if (it == ledger_.pods.end() || !it->second.reserved) return;
  ledger_.ReleaseLocked(uid);
  ledger_.ApplyMovesLocked();
}

int ReservePoint::ExpireReservations(std::chrono::steady_clock::duration age) {
  LedgerLock lock(&ledger_);
  const auto now = ledger_.SteadyNow();
  std::vector<PodUid> expired;
  for (const auto& [uid, entry] : ledger_.pods) {
    if (entry.reserved && now - entry.reserved_at > age) expired.push_back(uid);
  }
  for (const PodUid& uid : expired) ledger_.ReleaseLocked(uid);
  // The parts swapped pods left and no pod took within the bound (the pod deleted meanwhile) are free again.
  (void)ledger_.ExpireMovedPartsLocked(CacheLedger::kMoveHold);
  ledger_.ApplyMovesLocked();  // only when the above made room (CacheLedger tracks whether anything changed)
  return static_cast<int>(expired.size());
}

std::vector<PodEntry> ReservePoint::TakeChangedShares() {
  LedgerLock lock(&ledger_);
  std::vector<PodEntry> out;
  for (const PodUid& uid : ledger_.changed) {
    auto it = ledger_.pods.find(uid);
    if (it != ledger_.pods.end()) out.push_back(it->second);
  }
  ledger_.changed.clear();
  return out;
}

}  // namespace tessera::scheduler
