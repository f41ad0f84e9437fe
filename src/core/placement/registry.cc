// The policies by name.
#include <array>

#include "absl/status/status.h"
#include "core/placement/policies_internal.h"
#include "core/strings.h"

namespace tessera::core {

namespace {

struct Entry {
  const char* name;
  bool needs_workload;  // needs PolicyContext::fragmentation
  std::unique_ptr<Policy> (*make)(const PolicyContext&);
};

constexpr std::array<Entry, 11> kPolicies = {{
    {"tessera", true, [](const PolicyContext& c) { return NewTesseraPolicy(c); }},
    {"gaia", false, [](const PolicyContext&) { return NewGaiaPolicy(); }},
    {"binpack", false, [](const PolicyContext&) { return NewBinpackPolicy(); }},
    {"spread", false, [](const PolicyContext&) { return NewSpreadPolicy(); }},
    {"gpushare", false, [](const PolicyContext&) { return NewGpusharePolicy(); }},
    {"fgd", true, [](const PolicyContext& c) { return NewFgdPolicy(c); }},
    {"random", false, [](const PolicyContext&) { return NewRandomPolicy(); }},
    {"bestfit", false, [](const PolicyContext& c) { return NewBestFitPolicy(c); }},
    {"dotprod", false, [](const PolicyContext& c) { return NewDotProductPolicy(c); }},
    {"packing", false, [](const PolicyContext&) { return NewPackingPolicy(); }},
    {"clustering", false, [](const PolicyContext& c) { return NewClusteringPolicy(c); }},
}};

}  // namespace

std::vector<std::string> PolicyNames() {
  std::vector<std::string> names;
  for (const Entry& e : kPolicies) names.emplace_back(e.name);
  return names;
}

absl::StatusOr<std::unique_ptr<Policy>> MakePolicy(std::string_view name, const PolicyContext& context) {
  for (const Entry& e : kPolicies) {
    if (name != e.name) continue;
    if (e.needs_workload && context.fragmentation == nullptr) {
      return absl::FailedPreconditionError(StrCat(
          "policy ", name, " needs the workload's typical pods (PolicyContext::fragmentation); build the ",
          "context with MakePolicyContext"));
    }
    return e.make(context);
  }
  return absl::InvalidArgumentError(
      StrCat("unknown placement policy \"", name, "\"; choose one of: ", StrJoin(PolicyNames(), ", ")));
}

PolicyContext MakePolicyContext(const Cluster& cluster, std::span<const PodRequest> workload) {
  PolicyContext c;
  MilliCpu cpu(0);
  int gpus = 0;
  for (const NodeState& n : cluster.nodes()) {
    cpu = std::max(cpu, n.info().cpu);
    gpus = std::max(gpus, n.gpu_count());
  }
  if (cpu.value() > 0) c.max_node_cpu = cpu;
  if (gpus > 0) c.max_node_gpus = gpus;
  c.fragmentation = std::make_shared<FragmentationModel>(WorkloadProfile::FromPods(workload), cluster);
  int64_t pod_cpu = 0;
  int64_t pod_memory = 0;
  int64_t pod_gpu = 0;  // thousandths
  for (const PodRequest& p : workload) {
    int64_t g = 0;
    for (const ContainerRequest& cr : p.containers) {
      for (const VGpuDemand& v : cr.vgpus) g += v.cores.value();
    }
    if (g == 0) continue;
    pod_cpu += p.cpu.value();
    pod_memory += p.memory.value();
    pod_gpu += g;
  }
  if (pod_gpu > 0) {
    c.cpu_per_gpu = MilliCpu(pod_cpu * 1000 / pod_gpu);
    c.memory_per_gpu = MiB(pod_memory * 1000 / pod_gpu);
  }
  // Model pressure: constrained demand (split evenly over the models a pod allows) over supply.
  std::vector<double> supply(static_cast<size_t>(cluster.model_count()), 0);
  for (const NodeState& n : cluster.nodes()) {
    for (int g = 0; g < n.gpu_count(); ++g) supply[static_cast<size_t>(n.model_id(g))] += 1;
  }
  std::vector<double> demand(supply.size(), 0);
  for (const PodRequest& p : workload) {
    if (p.model_include.empty()) continue;
    std::vector<int> present;
    for (const std::string& m : p.model_include) {
      for (int id : cluster.ModelIds(m, p.model_include_substring)) {
        if (supply[static_cast<size_t>(id)] > 0) present.push_back(id);
      }
    }
    double pod_gpus = 0;
    for (const ContainerRequest& cr : p.containers) {
      for (const VGpuDemand& v : cr.vgpus) pod_gpus += v.cores.value() / 1000.0;
    }
    for (int id : present) demand[static_cast<size_t>(id)] += pod_gpus / static_cast<double>(present.size());
  }
  c.model_demand_share.assign(supply.size(), 0);
  for (size_t m = 0; m < supply.size(); ++m) {
    if (pod_gpu > 0) c.model_demand_share[m] = demand[m] * 1000.0 / static_cast<double>(pod_gpu);
  }
  c.model_supply = supply;
  return c;
}

}  // namespace tessera::core
