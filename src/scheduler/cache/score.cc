#include "scheduler/cache/score.h"

#include <algorithm>
#include <cmath>

#include "core/placement/compiled_request.h"

namespace tessera::scheduler {

std::vector<int64_t> ScaleTierScores(std::span<const TierScore> fits) {
  std::vector<int64_t> out;
  if (fits.empty()) return out;
  out.reserve(fits.size());
  // Tiers first, then scores: map each fit to one number where any better tier wins.
  int top_tier = fits[0].tier;
  double lo = 0, hi = 0;
  bool first = true;
  for (const TierScore& fit : fits) top_tier = std::max(top_tier, fit.tier);
  for (const TierScore& fit : fits) {
    if (fit.tier != top_tier) continue;
    if (first || fit.score < lo) lo = fit.score;
    if (first || fit.score > hi) hi = fit.score;
    first = false;
  }
  for (const TierScore& fit : fits) {
    int64_t score = 0;
    if (fit.tier == top_tier) {
      // The best tier spans 1-10 (or 10 when all equal); lower tiers get 0.
      score = hi > lo ? 1 + static_cast<int64_t>(std::floor(9.0 * (fit.score - lo) / (hi - lo) + 1e-9))
                      : kMaxExtenderPriority;
    }
    out.push_back(std::clamp<int64_t>(score, 0, kMaxExtenderPriority));
  }
  return out;
}

std::vector<HostScore> ScaleScores(std::span<const std::pair<std::string, core::NodeFit>> fits) {
  std::vector<TierScore> tiers;
  tiers.reserve(fits.size());
  for (const auto& [name, fit] : fits) tiers.push_back({fit.tier, fit.score});
  const std::vector<int64_t> scores = ScaleTierScores(tiers);
  std::vector<HostScore> out;
  for (size_t i = 0; i < fits.size(); ++i) out.push_back({fits[i].first, scores[i]});
  return out;
}

std::vector<PositionScore> ScorePoint::PrioritizeAt(const core::PodRequest& request,
                                                    std::span<const std::string_view> nodes) {
  std::vector<uint32_t> fitting, others;
  std::vector<TierScore> fits;
  fitting.reserve(nodes.size());
  fits.reserve(nodes.size());
  {
    LedgerLock lock(&ledger_);
    ledger_.NoteWorkloadLocked(request);
    ledger_.MaybeRebuildPolicyLocked();
    ledger_.ObserveLocked();
    const core::CompiledRequest compiled(ledger_.cluster, request);
    warmer_.NoteShapeLocked(ledger_, request, compiled.fingerprint());
    core::NodeFit scratch;
    for (uint32_t k = 0; k < nodes.size(); ++k) {
      const core::NodeState* node = ledger_.cluster.FindNode(nodes[k]);
      if (node == nullptr) {
        others.push_back(k);
        continue;
      }
      const core::NodeFit& fit = ledger_.placer->EvaluateCached(ledger_.cluster, *node, compiled, ledger_.rng,
                                                                &ledger_.evaluations, scratch);
      if (fit.fits()) {
        fitting.push_back(k);
        fits.push_back({fit.tier, fit.score});
      } else {
        others.push_back(k);
      }
    }
  }
  // Scaled outside the lock: it needs nothing of the ledger.
  const std::vector<int64_t> scaled = ScaleTierScores(fits);
  std::vector<PositionScore> out;
  out.reserve(nodes.size());
  for (size_t i = 0; i < fitting.size(); ++i) out.push_back({fitting[i], scaled[i]});
  for (uint32_t k : others) out.push_back({k, 0});
  return out;
}

}  // namespace tessera::scheduler
