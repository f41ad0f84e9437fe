// `tessera simulate`: replays a workload on a modelled cluster with several policies and seeds, in parallel.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mutex>
#include <thread>

#include "commands.h"
#include "common/files.h"
#include "common/log.h"
#include "core/placement/policy.h"
#include "core/strings.h"
#include "sim/bound.h"
#include "sim/metrics.h"
#include "sim/replay.h"
#include "sim/report.h"
#include "sim/trace.h"
#include "sim/workload.h"

namespace tessera::embedded {
extern const char kSimNodes[];
extern const char kSimPods[];
}  // namespace tessera::embedded

namespace tessera::cli {

namespace {

// "42-51", "42,43,50", "7".
absl::StatusOr<std::vector<uint64_t>> ParseSeeds(const std::string& text) {
  std::vector<uint64_t> seeds;
  for (std::string_view part : StrSplit(text, ',')) {
    part = StripWhitespace(part);
    std::vector<std::string_view> ends = StrSplit(part, '-');
    int64_t lo = 0;
    int64_t hi = 0;
    if (ends.size() == 1 && ParseInt(ends[0], &lo) && lo >= 0) {
      hi = lo;
    } else if (ends.size() != 2 || !ParseInt(ends[0], &lo) || !ParseInt(ends[1], &hi) || lo < 0 || hi < lo ||
               hi - lo > 10000) {
      return absl::InvalidArgumentError(
          StrCat("--seeds \"", text, "\": write a seed (42), a range (42-51) or a list (42,43,50)"));
    }
    for (int64_t s = lo; s <= hi; ++s) seeds.push_back(static_cast<uint64_t>(s));
  }
  return seeds;
}

absl::StatusOr<std::vector<std::string>> ParsePolicies(const std::string& text, bool allow_none) {
  std::vector<std::string> out;
  if (allow_none && StripWhitespace(text) == "none") return out;
  const std::vector<std::string> known = core::PolicyNames();
  for (std::string_view part : StrSplit(text, ',')) {
    std::string name(StripWhitespace(part));
    if (name.empty()) continue;
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      return absl::InvalidArgumentError(
          StrCat("--policies: unknown policy \"", name, "\"; choose among: ", StrJoin(known, ", ")));
    }
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        "--policies is empty; name at least one policy (or, with --bound, none)");
  }
  return out;
}

// Redraws one line on stderr: "[#######.......]  47%  12/30 runs  8.1 s".
void DrawProgress(double fraction, int runs_done, int runs, double seconds) {
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r[%s] %3d%%  %d/%d runs  %.1f s ", bar.c_str(), static_cast<int>(fraction * 100),
               runs_done, runs, seconds);
  std::fflush(stderr);
}

}  // namespace

int RunSimulate(const SimulateOptions& options) {
  const bool bundled = options.nodes_file.empty() && options.pods_file.empty();
  if (options.nodes_file.empty() != options.pods_file.empty()) {
    std::cerr << "tessera simulate: give both --nodes and --pods, or neither (the bundled example)\n";
    return 2;
  }
  const std::string nodes_name = bundled ? "bundled example (examples/sim/nodes.csv)" : options.nodes_file;
  const std::string pods_name = bundled ? "bundled example (examples/sim/pods.csv)" : options.pods_file;
  absl::StatusOr<std::string> nodes_text =
      bundled ? absl::StatusOr<std::string>(embedded::kSimNodes) : ReadTextFile(options.nodes_file);
  absl::StatusOr<std::string> pods_text =
      bundled ? absl::StatusOr<std::string>(embedded::kSimPods) : ReadTextFile(options.pods_file);
  if (!nodes_text.ok() || !pods_text.ok()) {
    std::cerr << "tessera simulate: "
              << (!nodes_text.ok() ? nodes_text.status() : pods_text.status()).message() << "\n";
    return 2;
  }
  const std::string policy_text = !options.policies.empty()
                                      ? options.policies
                                      : (bundled ? "tessera,fgd,bestfit,packing,random" : "tessera");
  const std::string seed_text = !options.seeds.empty() ? options.seeds : (bundled ? "42-46" : "42");
  absl::StatusOr<std::vector<std::string>> policies = ParsePolicies(policy_text, options.bound);
  absl::StatusOr<std::vector<uint64_t>> seeds = ParseSeeds(seed_text);
  if (!policies.ok() || !seeds.ok()) {
    std::cerr << "tessera simulate: " << (!policies.ok() ? policies.status() : seeds.status()).message()
              << "\n";
    return 2;
  }
  if (!(options.inflate > 0 && options.inflate <= 10)) {
    std::cerr << "tessera simulate: --inflate " << options.inflate
              << " is outside (0, 10]; 1.3 scales the workload to 130% of the cluster's GPUs\n";
    return 2;
  }
  if (options.threads < 0 || options.threads > 1024) {
    std::cerr << "tessera simulate: --threads " << options.threads
              << " is outside [0, 1024]; 0 runs one thread per core\n";
    return 2;
  }
  if (!options.plot_file.empty() && !options.plot_file.ends_with(".svg")) {
    std::cerr << "tessera simulate: --plot writes SVG; give a file name ending in .svg\n";
    return 2;
  }

  sim::WorkloadOptions workload;
  if (!options.high_priority_qos.empty()) {
    absl::StatusOr<std::vector<std::string>> qos = sim::ParseQosList(options.high_priority_qos);
    if (!qos.ok()) {
      std::cerr << "tessera simulate: --high-priority-qos \"" << options.high_priority_qos
                << "\": " << qos.status().message() << "\n";
      return 2;
    }
    workload.high_priority_qos = *std::move(qos);
  }
  if (options.share_memory == "none") {
    workload.share_memory = sim::WorkloadOptions::ShareMemory::kNone;
  } else if (options.share_memory != "proportional") {
    std::cerr << "tessera simulate: --share-memory \"" << options.share_memory
              << "\": write proportional (memory in proportion to the share) or none (compute only)\n";
    return 2;
  }

  absl::StatusOr<core::Cluster> cluster = sim::LoadCluster(*nodes_text, nodes_name);
  if (!cluster.ok()) {
    std::cerr << "tessera simulate: " << cluster.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<core::PodRequest>> pods = sim::LoadPods(*pods_text, pods_name, workload);
  if (!pods.ok()) {
    std::cerr << "tessera simulate: " << pods.status().message() << "\n";
    return 2;
  }
  if (cluster->node_count() == 0 || pods->empty()) {
    std::cerr << "tessera simulate: " << (cluster->node_count() == 0 ? nodes_name : pods_name)
              << " is empty; there is nothing to simulate\n";
    return 2;
  }
  sim::ReportInfo info;
  info.nodes = nodes_name;
  info.pods = pods_name;
  info.node_count = cluster->node_count();
  for (const core::NodeState& n : cluster->nodes()) info.gpu_count += n.gpu_count();
  info.pod_count = pods->size();
  if (info.gpu_count == 0) {
    std::cerr << "tessera simulate: " << nodes_name
              << " has no GPU; the simulator measures GPU allocation, so give a cluster with GPU nodes\n";
    return 2;
  }
  info.inflate = options.inflate;
  info.seeds = *seeds;
  info.high_priority_qos = workload.high_priority_qos;
  info.compression = !options.no_compression;
  info.share_memory_none = workload.share_memory == sim::WorkloadOptions::ShareMemory::kNone;
  const sim::ReplayInput input = sim::ReplayInput::Make(*std::move(cluster), *std::move(pods));
  if (absl::Status s = sim::CheckArrivals(input.pods, input.capacity_milli, options.inflate); !s.ok()) {
    std::cerr << "tessera simulate: " << s.message() << "\n";
    return 2;
  }
  log::Info("simulating", {{"nodes", StrCat(info.node_count)},
                           {"pods", StrCat(info.pod_count)},
                           {"policies", StrJoin(*policies, ",")},
                           {"seeds", seed_text}});

  // Every (policy, seed) run is a job; threads take jobs in turn.
  struct Job {
    std::string policy;
    uint64_t seed;
  };
  std::vector<Job> jobs;
  for (const std::string& p : *policies) {
    for (uint64_t s : *seeds) jobs.push_back({p, s});
  }
  const unsigned wanted_threads = options.threads > 0 ? static_cast<unsigned>(options.threads)
                                                      : std::max(1u, std::thread::hardware_concurrency());
  const unsigned threads =
      std::max(1u, std::min<unsigned>(wanted_threads, static_cast<unsigned>(jobs.size())));
  std::vector<sim::RunResult> results(jobs.size());
  std::vector<std::string> errors;
  bool input_error = false;
  std::mutex mu;
  std::atomic<size_t> next{0};
  std::atomic<int> done{0};
  std::atomic<int64_t> arrivals{0};
  // Progress is measured in arrivals; each run has about inflate x the original pods.
  const double expected = static_cast<double>(jobs.size()) *
                          std::max(1.0, options.inflate * static_cast<double>(info.pod_count) * 0.98);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (size_t j = next++; j < jobs.size(); j = next++) {
        sim::ReplayOptions replay;
        replay.compression = !options.no_compression;
        absl::StatusOr<sim::RunResult> r =
            sim::Replay(input, jobs[j].policy, jobs[j].seed, options.inflate, &arrivals, replay);
        std::lock_guard<std::mutex> lock(mu);
        if (r.ok()) {
          results[j] = *std::move(r);
        } else {
          // Too many arrivals is the input's fault (exit 2), found while cloning when CheckArrivals could not
          // tell in advance.
          input_error = input_error || absl::IsResourceExhausted(r.status());
          errors.push_back(StrCat(jobs[j].policy, ": ", r.status().message()));
        }
        ++done;
      }
    });
  }
  const bool show = isatty(STDERR_FILENO) != 0 && !options.json;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  while (done.load() < static_cast<int>(jobs.size())) {
    if (show) {
      DrawProgress(std::min(0.99, static_cast<double>(arrivals.load()) / expected), done.load(),
                   static_cast<int>(jobs.size()), elapsed());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  for (std::thread& t : pool) t.join();
  if (show && !jobs.empty()) {  // --policies none: no runs, only the bound
    DrawProgress(1.0, done.load(), static_cast<int>(jobs.size()), elapsed());
    std::fprintf(stderr, "\n");
  }
  if (!errors.empty()) {
    std::cerr << "tessera simulate: " << errors.front() << "\n";
    return input_error ? 2 : 1;
  }

  if (options.bound) {
    // Two LPs per seed, offline and with the early pods forced: well under a second each on the shared
    // traces, minutes where the shares take hundreds of sizes (sim/bound.h), hence the progress line.
    info.bounds.resize(seeds->size());
    std::vector<absl::Status> failures(seeds->size());
    std::vector<std::thread> workers;
    std::atomic<size_t> next_seed{0};
    std::atomic<int> seeds_done{0};
    // As many as the seeds, not the runs: under --policies none there are no runs.
    const unsigned bound_threads =
        std::max(1u, std::min<unsigned>(wanted_threads, static_cast<unsigned>(seeds->size())));
    for (unsigned t = 0; t < bound_threads; ++t) {
      workers.emplace_back([&] {
        for (size_t i = next_seed++; i < seeds->size(); i = next_seed++) {
          absl::StatusOr<sim::SeedBound> b = sim::BoundForSeed(
              input.cluster, input.pods, input.capacity_milli, (*seeds)[i], options.inflate);
          if (b.ok()) {
            info.bounds[i] = *b;
          } else {
            failures[i] = b.status();
          }
          ++seeds_done;
        }
      });
    }
    const auto bound_start = std::chrono::steady_clock::now();
    auto draw = [&] {
      std::fprintf(stderr, "\rLP bound: %d/%zu seeds  %.0f s ", seeds_done.load(), seeds->size(),
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - bound_start).count());
    };
    while (show && seeds_done.load() < static_cast<int>(seeds->size())) {
      draw();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (std::thread& t : workers) t.join();
    if (show) {
      draw();
      std::fprintf(stderr, "\n");
    }
    for (const absl::Status& s : failures) {
      if (!s.ok()) {
        std::cerr << "tessera simulate: --bound: " << s.message() << "\n";
        return 1;
      }
    }
  }
  const int max_pct = static_cast<int>(std::ceil(options.inflate * 100 - 1e-9));
  const std::vector<sim::PolicySummary> summaries = sim::Summarize(results, *policies, max_pct);
  if (options.json) {
    std::cout << sim::FormatJson(info, summaries);
  } else {
    std::cout << sim::FormatTable(info, summaries);
  }
  if (!options.plot_file.empty()) {
    std::ofstream out(options.plot_file);
    out << sim::PlotSvg(info, summaries);
    if (!out) {
      std::cerr << "tessera simulate: cannot write " << options.plot_file << "\n";
      return 1;
    }
    if (!options.json) std::cout << "Plot: " << options.plot_file << "\n";
  }
  return 0;
}

}  // namespace tessera::cli
