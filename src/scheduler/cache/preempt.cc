#include "scheduler/cache/preempt.h"

#include <memory>

#include "core/placement/policy.h"

namespace tessera::scheduler {

std::set<std::string> PreemptPoint::FitsAfterEvicting(
    const core::PodRequest& request, const std::map<std::string, std::vector<std::string>>& victims) {
  LedgerLock lock(&ledger_);
  // On a copy, with a policy of its own: the live policy's caches are keyed by the live nodes.
  core::Cluster copy = ledger_.cluster;
  absl::StatusOr<std::unique_ptr<core::Policy>> policy =
      core::MakePolicy(ledger_.policy_name, ledger_.context);
  if (!policy.ok()) return {};
  const core::Placer placer(**policy, ledger_.options().placement);
  for (const auto& [node, uids] : victims) {
    for (const std::string& uid : uids) (void)copy.Release(core::PodUid(uid));
  }
  std::set<std::string> out;
  for (const auto& [node, uids] : victims) {
    const core::NodeState* n = copy.FindNode(core::NodeName(node));
    if (n == nullptr) continue;
    if (placer.Evaluate(copy, *n, request, ledger_.rng).fits()) out.insert(node);
  }
  return out;
}

}  // namespace tessera::scheduler
