// `tessera place`: places pods one after the other through the core Placer and shows every decision.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "common/files.h"
#include "common/log.h"
#include "core/placement/placer.h"
#include "core/placement/policy.h"
#include "core/request_parser.h"
#include "core/strings.h"
#include "formats/cluster_file.h"

namespace tessera::embedded {
extern const char kClusterSmall[];
extern const char kPodsDemo[];
}  // namespace tessera::embedded

namespace tessera::cli {

namespace {

using core::Cluster;
using core::PodRequest;

// Prints rows with columns padded to their widest cell (the last column is not padded).
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.push_back(0);
      width[c] = std::max(width[c], row[c].size());
    }
  }
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
}

std::string Pct(core::MilliGpu m) {
  if (m.value() % 10 == 0) return StrCat(m.value() / 10, "%");
  return fmt::format("{:.1f}%", m.value() / 10.0);
}

std::string DescribeVGpu(const core::VGpuDemand& v) {
  std::string mem;
  switch (v.memory.kind) {
    case core::MemorySpec::Kind::kMiB:
      mem = StrCat(v.memory.value, " MiB");
      break;
    case core::MemorySpec::Kind::kPercent:
      mem = StrCat(v.memory.value, "% memory");
      break;
    case core::MemorySpec::Kind::kDefault:
      break;
  }
  if (v.exclusive()) return mem.empty() ? "whole GPU" : StrCat("whole GPU, ", mem);
  if (v.cores.value() == 0) return StrCat(mem, " (compute in proportion)");
  return mem.empty() ? Pct(v.cores) : StrCat(Pct(v.cores), " + ", mem);
}

// "4 x whole GPU", "2 x whole GPU + 50%", "40% + 6144 MiB".
std::string DescribeAsk(const PodRequest& r) {
  std::vector<std::string> parts;
  for (const core::ContainerRequest& c : r.containers) {
    std::vector<std::pair<std::string, int>> groups;
    for (const core::VGpuDemand& v : c.vgpus) {
      std::string d = DescribeVGpu(v);
      if (!groups.empty() && groups.back().first == d) {
        ++groups.back().second;
      } else {
        groups.emplace_back(d, 1);
      }
    }
    for (const auto& [d, n] : groups) parts.push_back(n == 1 ? d : StrCat(n, " x ", d));
  }
  std::string out = parts.empty() ? "no GPU" : StrJoin(parts, " + ");
  if (r.priority == core::Priority::kHigh) out += " (high priority)";
  return out;
}

std::string DescribePlacement(const core::Placement& p) {
  std::vector<std::string> parts;
  for (const core::ContainerAssignment& c : p.containers) {
    std::vector<std::string> gpus;
    for (const core::VGpuAssignment& v : c.vgpus) {
      gpus.push_back(core::IsWholeGpu(v.cores) ? StrCat("GPU", v.gpu_index)
                                               : StrCat("GPU", v.gpu_index, " ", Pct(v.cores)));
    }
    std::string s = StrJoin(gpus, ", ");
    if (c.numa_node >= 0)
      StrAppend(&s, " (NUMA ", c.numa_node, c.cpus.empty() ? "" : ", CPUs " + c.cpus, ")");
    parts.push_back(s);
  }
  return StrJoin(parts, "; ");
}

std::string ShortTenant(const core::TenantId& t) {
  // Pod UIDs of the demo are "namespace/name".
  return StrCat(t.pod.value(), "/", t.container);
}

absl::StatusOr<std::string> Load(const std::string& path, const char* embedded) {
  if (path.empty()) return std::string(embedded);
  return ReadTextFile(path);
}

}  // namespace

int RunPlace(const PlaceOptions& options) {
  const std::string cluster_name =
      options.cluster_file.empty() ? "bundled example (examples/cluster-small.yaml)" : options.cluster_file;
  const std::string pods_name =
      options.pods_file.empty() ? "bundled example (examples/pods-demo.yaml)" : options.pods_file;
  absl::StatusOr<std::string> cluster_text = Load(options.cluster_file, embedded::kClusterSmall);
  absl::StatusOr<std::string> pods_text = Load(options.pods_file, embedded::kPodsDemo);
  if (!cluster_text.ok() || !pods_text.ok()) {
    std::cerr << "tessera place: "
              << (!cluster_text.ok() ? cluster_text.status() : pods_text.status()).message() << "\n";
    return 2;
  }
  absl::StatusOr<formats::ClusterFile> file = formats::ParseClusterFile(*cluster_text, cluster_name);
  if (!file.ok()) {
    std::cerr << "tessera place: " << file.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<Cluster> cluster = formats::BuildCluster(*file);
  if (!cluster.ok()) {
    std::cerr << "tessera place: " << cluster_name << ": " << cluster.status().message() << "\n";
    return 2;
  }
  absl::StatusOr<std::vector<core::PodSpec>> pods = formats::ParseWorkloadFile(*pods_text, pods_name);
  if (!pods.ok()) {
    std::cerr << "tessera place: " << pods.status().message() << "\n";
    return 2;
  }
  // Policies that weigh fragmentation learn the workload's typical pods from the pods to place.
  std::vector<core::PodRequest> workload;
  for (const core::PodSpec& spec : *pods) {
    absl::StatusOr<core::PodRequest> r = core::ParsePodRequest(spec);
    if (r.ok()) workload.push_back(*std::move(r));
  }
  absl::StatusOr<std::unique_ptr<core::Policy>> policy =
      core::MakePolicy(options.policy, core::MakePolicyContext(*cluster, workload));
  if (!policy.ok()) {
    std::cerr << "tessera place: " << policy.status().message() << "\n";
    return 2;
  }
  core::Placer placer(**policy);
  core::Rng rng(options.seed);

  int gpus = 0;
  std::map<std::string, int> models;
  for (const core::NodeState& n : cluster->nodes()) {
    for (int g = 0; g < n.gpu_count(); ++g) ++models[n.gpu(g).model];
    gpus += n.gpu_count();
  }
  std::vector<std::string> model_list;
  for (const auto& [m, n] : models) model_list.push_back(StrCat(n, " ", m));
  std::cout << "Cluster: " << cluster_name << ": " << cluster->node_count() << " nodes, " << gpus << " GPUs ("
            << StrJoin(model_list, ", ") << ")\n"
            << "Pods:    " << pods_name << ": " << pods->size() << " pods\n"
            << "Policy:  " << options.policy << ", seed " << options.seed << "\n\n";

  std::vector<std::vector<std::string>> rows = {{"POD", "ASKS", "NODE", "GPUS"}};
  std::vector<std::string> refusals;
  std::vector<std::string> compressions;
  int placed = 0;
  for (const core::PodSpec& spec : *pods) {
    const std::string name = StrCat(spec.ns, "/", spec.name);
    absl::StatusOr<PodRequest> request = core::ParsePodRequest(spec);
    if (!request.ok()) {
      rows.push_back({name, "(invalid request)", "-", "refused, see below"});
      refusals.push_back(StrCat(name, ": ", request.status().message()));
      continue;
    }
    absl::StatusOr<core::Placement> placement = placer.Place(*cluster, *request, rng);
    if (!placement.ok()) {
      rows.push_back({name, DescribeAsk(*request), "-", "refused, see below"});
      refusals.push_back(std::string(placement.status().message()));
      continue;
    }
    absl::Status committed = cluster->Commit(*request, *placement);
    if (!committed.ok()) {
      std::cerr << "tessera place: internal error: a placement the Placer chose could not be committed: "
                << committed.message() << "\n";
      return 1;
    }
    ++placed;
    log::Info("placed pod", {{"pod", name}, {"node", placement->node.value()}});
    rows.push_back({name, DescribeAsk(*request), placement->node.value(), DescribePlacement(*placement)});
    for (const core::Compression& c : placement->compressions) {
      compressions.push_back(StrCat(name, " (high priority) compressed ", ShortTenant(c.tenant), " on ",
                                    placement->node.value(), " GPU", c.gpu_index, " from ", Pct(c.old_cores),
                                    " to ", Pct(c.new_cores)));
    }
  }
  PrintTable(rows);
  std::cout << "\nPlaced " << placed << " of " << pods->size() << " pods.\n";
  if (!compressions.empty()) {
    std::cout << "\nCompressed (SharedGPU priority):\n";
    for (const std::string& c : compressions) std::cout << "  " << c << "\n";
  }
  if (!refusals.empty()) {
    std::cout << "\nRefused:\n";
    for (const std::string& r : refusals) std::cout << "  " << r << "\n";
  }

  std::cout << "\nGPU use:\n";
  std::vector<std::vector<std::string>> use = {{"NODE", "GPU", "MODEL", "COMPUTE", "MEMORY MiB", "TENANTS"}};
  for (const core::NodeState& n : cluster->nodes()) {
    for (int g = 0; g < n.gpu_count(); ++g) {
      std::vector<std::string> tenants;
      for (const core::Tenant& t : n.tenants(g)) {
        std::string share = core::IsWholeGpu(t.cores) ? "whole" : Pct(t.cores);
        if (t.cores < t.requested) share += StrCat(" (asked ", Pct(t.requested), ")");
        tenants.push_back(StrCat(ShortTenant(t.id), " ", share));
      }
      const core::MiB total = n.gpu(g).memory;
      rows.clear();
      use.push_back({n.name().value(), StrCat(g), n.gpu(g).model, Pct(core::kWholeGpu - n.free_cores(g)),
                     StrCat((total - n.free_memory(g)).value(), "/", total.value()),
                     tenants.empty() ? "-" : StrJoin(tenants, ", ")});
    }
  }
  PrintTable(use);
  return 0;
}

}  // namespace tessera::cli
