// The quota extension point of the cluster cache: each namespace's share of GPU per model (Gaia's
// heterogeneous cluster quota), which the placer checks on every node it evaluates.
//
//   QuotaPoint quota(ledger);
//   quota.Set(core::Namespace("team-a"), "A100-SXM4-80GB", core::MilliGpu(4000));
//   quota.Replace(quotas_from_file);                    // all at once: no placement sees half of the new set
//   quota.SetHeldElsewhere(dra_holdings);               // what the DRA path's claims hold counts too
//
// Thread-safety: thread-safe; each call holds the ledger's lock.
#ifndef TESSERA_SCHEDULER_CACHE_QUOTA_H_
#define TESSERA_SCHEDULER_CACHE_QUOTA_H_

#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "core/cluster_types.h"
#include "core/ids.h"
#include "core/units.h"
#include "scheduler/cache/ledger.h"

namespace tessera::scheduler {

class QuotaPoint {
 public:
  // `ledger` must outlive the point.
  explicit QuotaPoint(CacheLedger& ledger) : ledger_(ledger) {}

  void Set(const core::Namespace& ns, std::string_view model, core::MilliGpu limit);
  // Replaces every quota at once (a quota file read again).
  void Replace(const std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>>& quotas);
  // Every quota and holding (core::Cluster::QuotaStandings).
  std::vector<core::QuotaStanding> Standings() const;
  // What namespaces hold on GPUs the extender does not place on (Tessera's DRA claims), counted against their
  // quotas: each entry's held_elsewhere; replaces the previous figures.
  void SetHeldElsewhere(std::span<const core::QuotaStanding> held);

 private:
  CacheLedger& ledger_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_QUOTA_H_
