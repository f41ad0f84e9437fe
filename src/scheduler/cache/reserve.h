// The reserve extension point of the cluster cache: the bind verb's decision held while the bind is written
// to the API, so that no other decision can take the same share meanwhile; then confirmed (the bind went
// through) or undone (it failed, or never finished). Also the tenants whose shares a decision changed
// (SharedGPU compression, and the share given back), whose assignments must be rewritten.
//
//   ReservePoint reserve(ledger);
//   absl::StatusOr<Reservation> r = reserve.Reserve(request, node);
//   reserve.Confirm(uid) / reserve.Unreserve(uid);
//
// Thread-safety: thread-safe; each call holds the ledger's lock for microseconds.
#ifndef TESSERA_SCHEDULER_CACHE_RESERVE_H_
#define TESSERA_SCHEDULER_CACHE_RESERVE_H_

#include <chrono>
#include <vector>

#include "absl/status/statusor.h"
#include "core/request.h"
#include "scheduler/cache/ledger.h"

namespace tessera::scheduler {

// A decision held while its bind is written to the API.
struct Reservation {
  core::Placement placement;
  // Low-priority tenants whose share this pod's placement cut (SharedGPU compression): their new shares must
  // reach their pods' assignments and their nodes' limits files.
  std::vector<core::Compression> compressions;
};

class ReservePoint {
 public:
  // `ledger` must outlive the point.
  explicit ReservePoint(CacheLedger& ledger) : ledger_(ledger) {}

  // Decides the pod's GPUs on `node` and holds them. AlreadyExists when the pod already holds GPUs on `node`;
  // FailedPrecondition when on another node; NotFound when the node has no inventory.
  absl::StatusOr<Reservation> Reserve(const core::PodRequest& request, const core::NodeName& node);
  // The bind reached the API: the reservation becomes a record.
  void Confirm(const core::PodUid& uid);
  // The bind failed: the share is free again and compressed tenants get their share back.
  void Unreserve(const core::PodUid& uid);
  // Unreserves reservations older than `age` (a bind that never finished). Returns how many.
  int ExpireReservations(std::chrono::steady_clock::duration age);
  // Pods whose shares changed under them since the last call.
  std::vector<PodEntry> TakeChangedShares();

 private:
  CacheLedger& ledger_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_RESERVE_H_
