// The preempt extension point of the cluster cache: of the nodes where kube-scheduler would evict pods to
// make room, those where the pod's GPUs would then fit.
//
//   PreemptPoint preempt(ledger);
//   std::set<std::string> keep = preempt.FitsAfterEvicting(request, {{"node-1", {"uid-a", "uid-b"}}});
//
// Thread-safety: thread-safe; holds the ledger's lock while it evaluates on a copy of the cluster.
#ifndef TESSERA_SCHEDULER_CACHE_PREEMPT_H_
#define TESSERA_SCHEDULER_CACHE_PREEMPT_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "core/request.h"
#include "scheduler/cache/ledger.h"

namespace tessera::scheduler {

class PreemptPoint {
 public:
  // `ledger` must outlive the point.
  explicit PreemptPoint(CacheLedger& ledger) : ledger_(ledger) {}

  // The nodes of `victims` (node -> pod UIDs to evict) where the pod would fit once those pods are gone.
  std::set<std::string> FitsAfterEvicting(const core::PodRequest& request,
                                          const std::map<std::string, std::vector<std::string>>& victims);

 private:
  CacheLedger& ledger_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_PREEMPT_H_
