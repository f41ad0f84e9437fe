#include "scheduler/cache/quota.h"

namespace tessera::scheduler {

void QuotaPoint::Set(const core::Namespace& ns, std::string_view model, core::MilliGpu limit) {
  LedgerLock lock(&ledger_);
  ledger_.cluster.SetQuota(ns, model, limit);
}

void QuotaPoint::Replace(
    const std::vector<std::tuple<core::Namespace, std::string, core::MilliGpu>>& quotas) {
  LedgerLock lock(&ledger_);
  ledger_.cluster.ClearQuotas();
  for (const auto& [ns, model, limit] : quotas) ledger_.cluster.SetQuota(ns, model, limit);
}

std::vector<core::QuotaStanding> QuotaPoint::Standings() const {
  LedgerLock lock(&ledger_);
  return ledger_.cluster.QuotaStandings();
}

void QuotaPoint::SetHeldElsewhere(std::span<const core::QuotaStanding> held) {
  LedgerLock lock(&ledger_);
  ledger_.cluster.SetQuotaHeldElsewhere(held);
}

}  // namespace tessera::scheduler
