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
};

std::string FormatTable(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

// JSON with, per policy, unallocated_pct_at_100 and unallocated_pct_at_130 (means over seeds), the per-seed
// values, the curves and the failed pods by shape.
std::string FormatJson(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

// An SVG of two panels: GPU allocation ratio over arrived workload, and unallocated GPU near saturation.
std::string PlotSvg(const ReportInfo& info, const std::vector<PolicySummary>& summaries);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_REPORT_H_
