#include "scheduler/cache/filter.h"

#include <algorithm>

#include "core/placement/compiled_request.h"
#include "core/strings.h"

namespace tessera::scheduler {

FilterVerdicts FilterPoint::FilterAt(const core::PodRequest& request,
                                     std::span<const std::string_view> nodes) {
  LedgerLock lock(&ledger_);
  ledger_.NoteWorkloadLocked(request);
  ledger_.MaybeRebuildPolicyLocked();
  ledger_.ObserveLocked();
  FilterVerdicts out;
  const core::CompiledRequest compiled(ledger_.cluster, request);
  warmer_.NoteShapeLocked(ledger_, request, compiled.fingerprint());
  core::NodeFit scratch;
  bool any_known = false;
  out.fits.reserve(nodes.size());
  for (uint32_t k = 0; k < nodes.size(); ++k) {
    const core::NodeState* node = ledger_.cluster.FindNode(nodes[k]);
    if (node == nullptr) {
      out.unresolvable.emplace_back(
          k, StrCat("node ", nodes[k], ": no Tessera GPU inventory (is tessera-node running there?)"));
      continue;
    }
    any_known = true;
    const core::NodeFit& fit = ledger_.placer->EvaluateCached(ledger_.cluster, *node, compiled, ledger_.rng,
                                                              &ledger_.evaluations, scratch);
    if (fit.fits()) {
      out.fits.push_back(k);
      continue;
    }
    core::Explanation why = ledger_.placer->Explain(ledger_.cluster, *node, request);
    (why.unresolvable ? out.unresolvable : out.failed).emplace_back(k, std::move(why.message));
  }
  // A high-priority pod that fits nowhere may still fit by compressing low-priority tenants (SharedGPU).
  if (out.fits.empty() && request.priority == core::Priority::kHigh && any_known) {
    std::vector<core::NodeName> names;
    for (std::string_view n : nodes) {
      if (ledger_.cluster.FindNode(n) != nullptr) names.emplace_back(n);
    }
    absl::StatusOr<core::Placement> p = ledger_.placer->Place(ledger_.cluster, request, ledger_.rng, names);
    if (p.ok() && !p->compressions.empty()) {
      const std::string_view node = p->node.value();
      auto named = [&](const std::pair<uint32_t, std::string>& v) { return nodes[v.first] == node; };
      std::erase_if(out.failed, named);
      std::erase_if(out.unresolvable, named);
      for (uint32_t k = 0; k < nodes.size(); ++k) {
        if (nodes[k] == node) {
          out.fits.push_back(k);
          break;
        }
      }
    }
  }
  return out;
}

}  // namespace tessera::scheduler
