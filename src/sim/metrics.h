// Turns runs into the FGD study's figures: per arrived-workload step (whole percent of the cluster's GPU
// capacity), the GPU allocation ratio, unallocated GPU %, and the fragmentation amount and ratio.
//
// As in the study's analysis, a step's value is the mean over the arrivals whose arrived share rounds to that
// percent (half to even), or, when none does, over those within one percent of it. Nothing is interpolated.
//
//   Curve c = BinRun(run, 130);
//   double unallocated_at_100 = 100 - c.allocated_pct[100];
//
// Thread-safety: pure functions.
#ifndef TESSERA_SIM_METRICS_H_
#define TESSERA_SIM_METRICS_H_

#include <map>
#include <string>
#include <vector>

#include "sim/replay.h"

namespace tessera::sim {

// Per whole percent of arrived workload, 0..max_pct. NaN where no arrival falls near the step.
struct Curve {
  std::vector<double> allocated_pct;   // GPU allocated, % of capacity
  std::vector<double> frag_gpus;       // fragmentation amount, in GPUs
  std::vector<double> frag_ratio_pct;  // fragmentation over idle GPU, %
};

Curve BinRun(const RunResult& run, int max_pct);

// A policy over several seeds.
struct PolicySummary {
  std::string policy;
  std::vector<uint64_t> seeds;
  std::vector<double> unallocated_at_100;         // per seed, %
  std::vector<double> unallocated_at_130;         // per seed, % (at the last step when max_pct is not 130)
  Curve mean;                                     // mean over seeds
  std::map<std::string, double> failed_by_shape;  // mean over seeds
  std::map<std::string, double> failed_by_cause;  // mean over seeds
  double placed = 0;                              // mean over seeds
  double pods = 0;                                // mean over seeds
  double seconds = 0;                             // mean over seeds
  std::vector<PriorityCounts> priority;           // per seed
  // Whether some run had a high-priority pod (then the reports show what priorities did).
  bool has_priorities() const;
  double Mean100() const;
  double Mean130() const;
  double Std100() const;
};

// Groups runs by policy (in the order of `policies`) and averages their curves.
std::vector<PolicySummary> Summarize(const std::vector<RunResult>& runs,
                                     const std::vector<std::string>& policies, int max_pct);

}  // namespace tessera::sim

#endif  // TESSERA_SIM_METRICS_H_
