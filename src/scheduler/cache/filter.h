// The filter extension point of the cluster cache: which of the nodes kube-scheduler names can take a pod,
// and why each other one cannot (where preemption might help, and where nothing could).
//
//   FilterPoint filter(ledger, warmer);
//   FilterVerdicts v = filter.FilterAt(request, nodes);   // by position in `nodes`
//
// Thread-safety: thread-safe; takes the ledger's lock for the whole evaluation (about a millisecond over
// 5,000 nodes).
#ifndef TESSERA_SCHEDULER_CACHE_FILTER_H_
#define TESSERA_SCHEDULER_CACHE_FILTER_H_

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/request.h"
#include "scheduler/cache/ledger.h"
#include "scheduler/cache/warmer.h"

namespace tessera::scheduler {

struct FilterOutcome {
  std::vector<std::string> fits;
  std::map<std::string, std::string> failed;        // node -> why, where preemption might help
  std::map<std::string, std::string> unresolvable;  // node -> why, where nothing could help
};

// The same answers by position in the list of names asked about, for the extender: it writes them from the
// request's own text, so that no node name is copied per node (5,000 per request on a large cluster).
struct FilterVerdicts {
  std::vector<uint32_t> fits;                                  // positions, in the order asked
  std::vector<std::pair<uint32_t, std::string>> failed;        // position, why: preemption might help
  std::vector<std::pair<uint32_t, std::string>> unresolvable;  // position, why: nothing could help
};

class FilterPoint {
 public:
  // Both must outlive the point.
  FilterPoint(CacheLedger& ledger, ShapeWarmer& warmer) : ledger_(ledger), warmer_(warmer) {}

  // Notes the request in the workload, rebuilds the policy when due, and evaluates each node named. A
  // high-priority pod that fits nowhere fits where it could by compressing low-priority tenants (SharedGPU).
  FilterVerdicts FilterAt(const core::PodRequest& request, std::span<const std::string_view> nodes);

 private:
  CacheLedger& ledger_;
  ShapeWarmer& warmer_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_FILTER_H_
