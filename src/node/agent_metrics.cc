// NodeAgent: the Prometheus text exposition (docs/node-agent.md, "Metrics").
#include <algorithm>
#include <filesystem>

#include "common/exposition.h"
#include "common/log.h"
#include "core/strings.h"
#include "hook/common/region_snapshot.h"
#include "node/agent.h"

namespace tessera::node {

namespace {

using exposition::AppendFamily;
using exposition::Families;
using exposition::Family;
using exposition::FormatValue;
using exposition::LabelSet;

uint64_t SaturatingAdd(uint64_t a, uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

}  // namespace

std::map<std::string, hook::RegionSnapshot> NodeAgent::ReadRegionReports() const {
  std::vector<std::pair<std::string, std::string>> paths;  // tenant, region file
  {
    MutexLock lock(&mu_);
    for (const auto& [key, t] : tenants_)
      paths.emplace_back(key, (std::filesystem::path(t.record.region_dir) / "region").string());
  }
  // File I/O, so outside the lock; each read is a bounded copy that never waits (hook/common/region_snapshot.h).
  std::map<std::string, hook::RegionSnapshot> out;
  std::vector<std::pair<std::string, std::string>> refused;  // tenant, why
  for (const auto& [key, path] : paths) {
    hook::RegionSnapshot snap;
    hook::Error error;
    switch (hook::ReadRegionSnapshot(path.c_str(), &snap, &error)) {
      case hook::RegionRead::kRead:
        out.emplace(key, snap);
        break;
      case hook::RegionRead::kMissing:
        break;  // no process of the container has run yet
      case hook::RegionRead::kRefused:
        regions_unreadable_.fetch_add(1);
        refused.emplace_back(key, error.text);
        break;
    }
  }
  MutexLock lock(&mu_);
  for (const auto& [key, why] : refused) {
    // Once per tenant and reason: a container that keeps its region broken must not fill the log.
    if (region_warned_.insert(StrCat(key, "|", why)).second) {
      log::Warn("a container's region is not readable; its use reads as 0 (only its own metrics are affected)",
                {{"tenant", key}, {"error", why}});
    }
  }
  for (auto it = region_warned_.begin(); it != region_warned_.end();) {  // forget the tenants that are gone
    it = tenants_.contains(it->substr(0, it->find('|'))) ? std::next(it) : region_warned_.erase(it);
  }
  return out;
}

std::string NodeAgent::MetricsText() const {
  const std::map<int, std::string> procs = registration_->All();
  std::map<std::string, int> procs_of;
  for (const auto& [pid, tenant] : procs) ++procs_of[tenant];
  const std::map<std::string, hook::RegionSnapshot> reports = ReadRegionReports();
  std::string out;
  MutexLock lock(&mu_);
  struct GpuSum {
    uint64_t mem_used = 0, mem_limit = 0;
    double cores_used = 0, cores_limit = 0;
    int tenants = 0;
  };
  // The labels follow dcgm-exporter's, so that its series and these join: gpu (the index), UUID, Hostname
  // (the node); a container's series add namespace, pod and container. The model is `model`, not dcgm's
  // modelName: promtool's lint refuses camelCase label names (docs/metrics.md).
  const std::string& node = config_.node_name;
  std::map<std::string, const formats::InventoryGpu*> gpu_of;
  for (const formats::InventoryGpu& g : inventory_.gpus) gpu_of[g.info.uuid.value()] = &g;
  std::map<std::string, GpuSum> per_gpu;
  Families families;
  Family& ctr_memory_used =
      families.Add("tessera_container_memory_used_bytes",
                   "GPU memory a container holds on a GPU (its shared region).", "gauge");
  Family& ctr_memory_limit = families.Add("tessera_container_memory_limit_bytes",
                                          "GPU memory limit of a container on a GPU.", "gauge");
  Family& ctr_cores_used = families.Add(
      "tessera_container_cores_used_percent",
      "Compute a container used on a GPU over the hook's last step, percent of the GPU.", "gauge");
  Family& ctr_cores_limit =
      families.Add("tessera_container_cores_limit_percent",
                   "Compute share of a container on a GPU, percent of the GPU.", "gauge");
  Family& ctr_processes = families.Add("tessera_container_processes",
                                       "Processes of a container registered with the agent.", "gauge");
  for (const auto& [key, t] : tenants_) {
    const ContainerRecord& r = t.record;
    for (const core::VGpuAssignment& v : r.vgpus) {
      auto g = gpu_of.find(v.uuid.value());
      const std::string index = StrCat(g != gpu_of.end() ? g->second->info.index : v.gpu_index);
      const std::string model = g != gpu_of.end() ? g->second->info.model : "";
      const std::string labels = LabelSet({{"gpu", index},
                                           {"UUID", v.uuid.value()},
                                           {"Hostname", node},
                                           {"model", model},
                                           {"namespace", r.ns},
                                           {"pod", r.pod_name},
                                           {"container", r.container}});
      const uint64_t limit = static_cast<uint64_t>(v.memory.value()) << 20;
      // What the container's processes report (untrusted: a tenant can make its own figures say anything, so
      // they are held to what could be true, the GPU's memory and its whole time, before any sum).
      uint64_t used = 0;
      double cores_used = 0;
      if (auto rep = reports.find(key); rep != reports.end()) {
        if (const hook::RegionDeviceReport* d = rep->second.Find(v.uuid.value().c_str())) {
          const uint64_t capacity =
              g != gpu_of.end() ? static_cast<uint64_t>(g->second->info.memory.value()) << 20 : limit;
          used = std::min(d->used_bytes, capacity);
          cores_used = d->own_util_ppm / 10000.0;
        }
      }
      const double cores_limit = v.cores.value() / 10.0;
      ctr_memory_used.Add(labels, FormatValue(used));
      ctr_memory_limit.Add(labels, FormatValue(limit));
      ctr_cores_used.Add(labels, FormatValue(cores_used));
      ctr_cores_limit.Add(labels, FormatValue(cores_limit));
      GpuSum& sum = per_gpu[v.uuid.value()];
      sum.mem_used = SaturatingAdd(sum.mem_used, used);
      sum.mem_limit = SaturatingAdd(sum.mem_limit, limit);
      sum.cores_used += cores_used;
      sum.cores_limit += cores_limit;
      sum.tenants += 1;
    }
    ctr_processes.Add(
        {{"Hostname", node}, {"namespace", r.ns}, {"pod", r.pod_name}, {"container", r.container}},
        procs_of[key]);
  }
  Family& gpu_health = families.Add("tessera_gpu_health", "1 when the GPU is healthy, 0 when not.", "gauge");
  Family& gpu_memory_total = families.Add("tessera_gpu_memory_total_bytes", "Memory of the GPU.", "gauge");
  Family& gpu_memory_used = families.Add("tessera_gpu_memory_used_bytes",
                                         "GPU memory held by all Tessera containers on the GPU.", "gauge");
  Family& gpu_memory_limit = families.Add("tessera_gpu_memory_limit_bytes",
                                          "Sum of the memory limits of the containers on the GPU.", "gauge");
  Family& gpu_cores_used =
      families.Add("tessera_gpu_cores_used_percent",
                   "Compute used by all Tessera containers on the GPU, percent.", "gauge");
  Family& gpu_cores_limit = families.Add("tessera_gpu_cores_limit_percent",
                                         "Sum of the compute shares given on the GPU, percent.", "gauge");
  Family& gpu_tenants = families.Add("tessera_gpu_tenants", "Containers sharing the GPU.", "gauge");
  for (const formats::InventoryGpu& g : inventory_.gpus) {
    auto it = per_gpu.find(g.info.uuid.value());
    const GpuSum s = it != per_gpu.end() ? it->second : GpuSum{};
    const std::string index = StrCat(g.info.index);
    const std::string labels = LabelSet(
        {{"gpu", index}, {"UUID", g.info.uuid.value()}, {"Hostname", node}, {"model", g.info.model}});
    gpu_health.Add(labels, FormatValue(g.info.health == core::GpuHealth::kHealthy ? 1 : 0));
    gpu_memory_total.Add(labels, FormatValue(static_cast<uint64_t>(g.info.memory.value()) << 20));
    gpu_memory_used.Add(labels, FormatValue(s.mem_used));
    gpu_memory_limit.Add(labels, FormatValue(s.mem_limit));
    gpu_cores_used.Add(labels, FormatValue(s.cores_used));
    gpu_cores_limit.Add(labels, FormatValue(s.cores_limit));
    gpu_tenants.Add(labels, FormatValue(s.tenants));
  }
  families.Add("tessera_node_tenants", "Containers with a Tessera allocation on this node.", "gauge")
      .Add({{"Hostname", node}}, tenants_.size());
  families.AppendTo(&out);
  struct Counter {
    const char* name;
    const char* help;
    uint64_t value;
  };
  const Counter counters[] = {
      {"tessera_allocations_total", "Allocate calls answered.", stats_.allocations},
      {"tessera_allocation_errors_total", "Allocate calls refused.", stats_.allocation_errors},
      {"tessera_limit_updates_total",
       "Limits files rewritten for a running container (a changed assignment, or its GPUs' tenants).",
       stats_.limit_updates},
      {"tessera_containers_collected_total", "Containers garbage-collected.", stats_.collected},
      {"tessera_registrations_total", "Hooked processes registered.", stats_.registrations},
      {"tessera_registrations_refused_total", "Registrations refused.", stats_.registrations_refused},
      {"tessera_api_errors_total", "Failed API server calls (retried).", stats_.api_errors},
      {"tessera_regions_unreadable_total",
       "Reads of a container's shared region that found no valid region (truncated, replaced or forged from "
       "inside the container).",
       regions_unreadable_.load()},
      {"tessera_record_errors_total", "Record files that could not be saved or removed.",
       stats_.record_errors}};
  for (const Counter& c : counters) {
    AppendFamily(&out, c.name, c.help, "counter", StrCat(c.name, " ", c.value, "\n"));
  }
  exposition::AppendBuildInfo(&out);
  return out;
}

}  // namespace tessera::node
