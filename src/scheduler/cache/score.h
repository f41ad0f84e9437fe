// The score extension point of the cluster cache: kube-scheduler's 0-10 priority of each node that can take
// a pod, from the policy's tier and score of the node.
//
//   ScorePoint score(ledger, warmer);
//   std::vector<PositionScore> s = score.PrioritizeAt(request, nodes);   // by position in `nodes`
//
// Thread-safety: thread-safe; takes the ledger's lock to evaluate, and scales outside it.
#ifndef TESSERA_SCHEDULER_CACHE_SCORE_H_
#define TESSERA_SCHEDULER_CACHE_SCORE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/placement/placer.h"
#include "core/request.h"
#include "scheduler/cache/ledger.h"
#include "scheduler/cache/warmer.h"

namespace tessera::scheduler {

// kube-scheduler's extender priority: 0 (worst) to 10 (best).
struct HostScore {
  std::string host;
  int64_t score = 0;
};
inline constexpr int64_t kMaxExtenderPriority = 10;

struct PositionScore {
  uint32_t position;
  int64_t score;
};

// Scores policies' node scores into kube-scheduler's 0-10 range: the best node 10, the worst 0, linear
// between (tiers first: a node of a better SharedGPU tier always scores above one of a worse tier).
std::vector<HostScore> ScaleScores(std::span<const std::pair<std::string, core::NodeFit>> fits);
// The same over (tier, score) pairs: the 0-10 score of each, in order.
struct TierScore {
  int tier = 0;
  double score = 0;
};
std::vector<int64_t> ScaleTierScores(std::span<const TierScore> fits);

class ScorePoint {
 public:
  // Both must outlive the point.
  ScorePoint(CacheLedger& ledger, ShapeWarmer& warmer) : ledger_(ledger), warmer_(warmer) {}

  // The answer is in the verb's order: the fitting nodes as asked, then the others (unknown or not fitting)
  // as asked, with 0.
  std::vector<PositionScore> PrioritizeAt(const core::PodRequest& request,
                                          std::span<const std::string_view> nodes);

 private:
  CacheLedger& ledger_;
  ShapeWarmer& warmer_;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_CACHE_SCORE_H_
