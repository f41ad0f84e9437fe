#include "sim/metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace tessera::sim {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double Round2(double x) {
  return std::nearbyint(x * 100.0) / 100.0;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return kNaN;
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

Curve BinRun(const RunResult& run, int max_pct) {
  const size_t steps = static_cast<size_t>(max_pct) + 1;
  const double capacity = static_cast<double>(run.capacity_milli);
  if (run.capacity_milli <= 0) {
    // A cluster without GPUs has no arrived share to bin by.
    Curve empty;
    empty.allocated_pct.assign(steps, std::numeric_limits<double>::quiet_NaN());
    empty.frag_gpus = empty.frag_ratio_pct = empty.allocated_pct;
    return empty;
  }
  // Per step: sums and counts of the arrivals that round to it.
  std::vector<double> alloc_sum(steps, 0), frag_sum(steps, 0), ratio_sum(steps, 0);
  std::vector<int> count(steps, 0);
  for (const Event& e : run.events) {
    const double arrived = std::nearbyint(static_cast<double>(e.arrived_milli) / capacity * 100.0);
    if (arrived < 0 || arrived > max_pct) continue;
    const size_t a = static_cast<size_t>(arrived);
    alloc_sum[a] += Round2(static_cast<double>(e.used_milli) / capacity * 100.0);
    frag_sum[a] += e.frag_milli / 1000.0;
    ratio_sum[a] += e.idle_milli > 0 ? 100.0 * e.frag_milli / static_cast<double>(e.idle_milli) : 0.0;
    ++count[a];
  }
  Curve c;
  c.allocated_pct.assign(steps, kNaN);
  c.frag_gpus.assign(steps, kNaN);
  c.frag_ratio_pct.assign(steps, kNaN);
  for (size_t a = 0; a < steps; ++a) {
    double alloc = 0, frag = 0, ratio = 0;
    int n = 0;
    // The step itself, or its neighbours when no arrival rounds to it.
    const size_t lo = count[a] > 0 ? a : (a == 0 ? 0 : a - 1);
    const size_t hi = count[a] > 0 ? a : std::min(steps - 1, a + 1);
    for (size_t b = lo; b <= hi; ++b) {
      alloc += alloc_sum[b];
      frag += frag_sum[b];
      ratio += ratio_sum[b];
      n += count[b];
    }
    if (n == 0) continue;
    c.allocated_pct[a] = Round2(alloc / n);
    c.frag_gpus[a] = frag / n;
    c.frag_ratio_pct[a] = ratio / n;
  }
  return c;
}

bool PolicySummary::has_priorities() const {
  return std::any_of(priority.begin(), priority.end(),
                     [](const PriorityCounts& p) { return p.high_pods > 0; });
}

double PolicySummary::Mean100() const {
  return Mean(unallocated_at_100);
}
double PolicySummary::Mean130() const {
  return Mean(unallocated_at_130);
}
double PolicySummary::Std100() const {
  if (unallocated_at_100.size() < 2) return 0;
  const double m = Mean100();
  double ss = 0;
  for (double x : unallocated_at_100) ss += (x - m) * (x - m);
  return std::sqrt(ss / static_cast<double>(unallocated_at_100.size() - 1));
}

std::vector<PolicySummary> Summarize(const std::vector<RunResult>& runs,
                                     const std::vector<std::string>& policies, int max_pct) {
  std::vector<PolicySummary> out;
  const size_t steps = static_cast<size_t>(max_pct) + 1;
  for (const std::string& policy : policies) {
    PolicySummary s;
    s.policy = policy;
    std::vector<Curve> curves;
    for (const RunResult& r : runs) {
      if (r.policy != policy) continue;
      Curve c = BinRun(r, max_pct);
      s.seeds.push_back(r.seed);
      const double at100 = max_pct >= 100 ? c.allocated_pct[100] : kNaN;
      s.unallocated_at_100.push_back(100.0 - at100);
      s.unallocated_at_130.push_back(100.0 - c.allocated_pct[std::min<size_t>(130, steps - 1)]);
      for (const auto& [shape, n] : r.failed_by_shape) s.failed_by_shape[shape] += n;
      for (const auto& [cause, n] : r.failed_by_cause) s.failed_by_cause[cause] += n;
      s.placed += static_cast<double>(r.placed);
      s.pods += static_cast<double>(r.pods);
      s.seconds += r.seconds;
      s.priority.push_back(r.priority);
      curves.push_back(std::move(c));
    }
    const double n = static_cast<double>(curves.size());
    if (curves.empty()) {
      out.push_back(std::move(s));
      continue;
    }
    for (auto& [shape, count] : s.failed_by_shape) count /= n;
    for (auto& [cause, count] : s.failed_by_cause) count /= n;
    s.placed /= n;
    s.pods /= n;
    s.seconds /= n;
    s.mean.allocated_pct.assign(steps, kNaN);
    s.mean.frag_gpus.assign(steps, kNaN);
    s.mean.frag_ratio_pct.assign(steps, kNaN);
    for (size_t a = 0; a < steps; ++a) {
      double alloc = 0, frag = 0, ratio = 0;
      int have = 0;
      for (const Curve& c : curves) {
        if (std::isnan(c.allocated_pct[a])) continue;
        alloc += c.allocated_pct[a];
        frag += c.frag_gpus[a];
        ratio += c.frag_ratio_pct[a];
        ++have;
      }
      if (have == 0) continue;
      s.mean.allocated_pct[a] = alloc / have;
      s.mean.frag_gpus[a] = frag / have;
      s.mean.frag_ratio_pct[a] = ratio / have;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace tessera::sim
