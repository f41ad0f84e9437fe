// Reports of a simulation: a table for people, JSON for machines, and an SVG plot of the allocation curves.
//
// Thread-safety: pure functions.
#ifndef TESSERA_SIM_REPORT_H_
#define TESSERA_SIM_REPORT_H_

#include <string>
#include <vector>

#include "sim/bound.h"
#include "sim/metrics.h"

namespace tessera::sim {

struct ReportInfo {
  std::string nodes;  // where the cluster came from
  std::string pods;   // where the workload came from
  int node_count = 0;
  int gpu_count = 0;
  size_t pod_count = 0;  // before scaling
  double inflate = 1.3;
  std::vector<uint64_t> seeds;
  std::vector<SeedBound> bounds;  // `--bound`: per seed, the LP bound and the online floor at 100%
  // How pods were given priorities (sim/workload.h) and whether compression was on; shown when a class is
  // named or some run had a high-priority pod.
  std::vector<std::string> high_priority_qos;
  bool compression = true;
  bool share_memory_none = false;  // shares accounted compute only (WorkloadOptions::ShareMemory::kNone)
};

// With priorities (ReportInfo::high_priority_qos, or high-priority pods in the workload), a second table
// gives per policy and seed the high-priority pods placed and unplaced, those placed only by compression, and
// the low-priority tenants compressed at the end and the share they gave up.
std::string FormatTable(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

// JSON with, per policy, unallocated_pct_at_100 and unallocated_pct_at_130 (means over seeds), the per-seed
// values, the curves and the failed pods by shape; with priorities, `priority` (how pods were given them) and
// per policy `priority_per_seed`.
std::string FormatJson(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

// An SVG of two panels: GPU allocation ratio over arrived workload, and unallocated GPU near saturation.
std::string PlotSvg(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_REPORT_H_
