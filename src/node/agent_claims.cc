// NodeAgent: DRA claims as tenants (docs/dra.md). The DRA driver (node/dra_driver.h) reads the claim's
// allocation from the API server; here it becomes a record, a limits file and a region directory, exactly as
// an allocated container's, so that the hooks, the registration socket and the tenancy counts treat both paths
// alike.
#include <algorithm>
#include <optional>

#include "common/log.h"
#include "core/strings.h"
#include "node/agent.h"

namespace tessera::node {

absl::StatusOr<ContainerRecord> NodeAgent::PrepareClaim(ContainerRecord record) {
  if (!record.claim) return absl::InvalidArgumentError("PrepareClaim needs a record of a claim");
  if (!SafePathName(record.claim->uid) || !SafePathName(record.pod_uid)) {
    return absl::InvalidArgumentError(
        StrCat("claim UID \"", record.claim->uid, "\" or pod UID \"", record.pod_uid,
               "\" cannot name a directory; Kubernetes UIDs always can"));
  }
  if (record.vgpus.empty()) return absl::InvalidArgumentError("the claim's allocation names no GPU of this node");
  record.container = StrCat("claim_", record.claim->uid);
  const std::string key = record.key();
  Tenant t;
  std::optional<ContainerRecord> refreshed;  // an existing record whose consumers changed, to save
  {
    MutexLock lock(&mu_);
    for (auto& [k, existing] : tenants_) {
      if (!existing.record.is_claim() || existing.record.claim->uid != record.claim->uid) continue;
      // Prepared already (the kubelet prepares again after its restart): the same tenant. The pods that have
      // reserved the claim since may register from now on.
      if (existing.record.claim->consumers == record.claim->consumers) return existing.record;
      existing.record.claim->consumers = record.claim->consumers;
      refreshed = existing.record;
      break;
    }
  }
  if (refreshed) {
    if (absl::Status s = records_.Save(*refreshed); !s.ok()) {
      log::Warn("cannot save a claim's record", {{"tenant", refreshed->key()}, {"error", Message(s)}});
    }
    return *refreshed;
  }
  {
    MutexLock lock(&mu_);
    if (claims_.contains(key)) {
      return absl::UnavailableError(StrCat("claim ", record.claim->ns, "/", record.claim->name,
                                           " is being prepared right now; the kubelet will retry"));
    }
    for (core::VGpuAssignment& v : record.vgpus) {
      auto it = std::find_if(inventory_.gpus.begin(), inventory_.gpus.end(),
                             [&](const formats::InventoryGpu& g) { return g.info.uuid == v.uuid; });
      if (it == inventory_.gpus.end()) {
        return absl::NotFoundError(StrCat("GPU ", v.uuid.value(), " of claim ", record.claim->ns, "/",
                                          record.claim->name, " is not a GPU of this node"));
      }
      v.gpu_index = it->info.index;
    }
    // Never more than a GPU holds, whoever allocated the claims on it (two allocators deciding at once): the
    // claim is refused, the kubelet retries and the pod does not start (docs/dra.md).
    if (std::string over = OvercommitLocked(key, record.vgpus, {}, {}); !over.empty()) {
      ++stats_.allocation_errors;
      return absl::FailedPreconditionError(
          StrCat("claim ", record.claim->ns, "/", record.claim->name, ": ", over));
    }
    record.gpu_tenants = GpuTenantsLocked(record);
    claims_.insert(key);
    in_flight_[key] = record.vgpus;
  }
  record.dir = ContainerDir(record.pod_uid, record.container);
  record.region_dir = RegionDir(record.pod_uid, record.container);
  record.allocated_at = formats::FormatHeartbeat(WallNow());
  // Nothing writes a phase or waits for pod-resources for a claim: it is settled once prepared, so its GPUs'
  // co-tenants are told of it on the next pass (tenants=).
  record.reported = true;
  record.confirmed = true;
  t.record = record;
  absl::Status s = Materialize(&t);
  {
    MutexLock lock(&mu_);
    claims_.erase(key);
    in_flight_.erase(key);
    if (!s.ok()) {
      ++stats_.allocation_errors;
      return s;
    }
    ++stats_.allocations;
    t.allocation = ++allocations_;
    tenants_[key] = std::move(t);
  }
  Nudge();  // the co-tenants' counts
  log::Info("claim prepared", {{"claim", StrCat(record.claim->ns, "/", record.claim->name)},
                               {"tenant", key}});
  return record;
}

absl::Status NodeAgent::UnprepareClaim(const std::string& claim_uid) {
  std::optional<ContainerRecord> gone;
  {
    MutexLock lock(&mu_);
    for (auto it = tenants_.begin(); it != tenants_.end(); ++it) {
      const ContainerRecord& r = it->second.record;
      if (!r.is_claim() || r.claim->uid != claim_uid) continue;
      gone = r;
      tenants_.erase(it);
      ++stats_.collected;
      break;
    }
  }
  if (!gone) return absl::OkStatus();
  const bool removed = RemoveOrKeep(*gone);
  Nudge();  // the co-tenants' counts
  if (removed)
    log::Info("claim unprepared; its directory and region were removed", {{"tenant", gone->key()}});
  return absl::OkStatus();
}

}  // namespace tessera::node
