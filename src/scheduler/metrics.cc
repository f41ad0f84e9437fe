// ExtenderServer::MetricsText: tessera-scheduler's /metrics (docs/metrics.md). The per-GPU and per-node
// series carry dcgm-exporter's label names (gpu = the index, UUID, Hostname = the node; the model as
// `model`), as the node agent's do, so that the scheduler's books, the agents' and dcgm-exporter's join on
// them.
#include "common/exposition.h"
#include "core/strings.h"
#include "scheduler/http_server.h"

namespace tessera::scheduler {

using exposition::AppendFamily;
using exposition::AppendSample;
using exposition::FormatValue;
using exposition::LabelSet;

std::string ExtenderServer::MetricsText() const {
  const Extender::Counters c = extender_.counters();
  std::string out;
  std::string samples;
  const char* verbs[] = {"filter", "prioritize", "bind", "preempt"};
  const uint64_t requests[] = {c.filter, c.prioritize, c.bind, c.preempt};
  for (size_t i = 0; i < 4; ++i) {
    AppendSample(&samples, "tessera_scheduler_requests_total", {{"verb", verbs[i]}}, requests[i]);
  }
  AppendFamily(&out, "tessera_scheduler_requests_total", "Extender requests by verb.", "counter", samples);
  AppendFamily(&out, "tessera_scheduler_bind_failures_total", "Binds that returned an error.", "counter",
               StrCat("tessera_scheduler_bind_failures_total ", c.bind_failed, "\n"));
  AppendFamily(&out, "tessera_scheduler_bad_requests_total", "Requests refused as malformed (HTTP 400).",
               "counter", StrCat("tessera_scheduler_bad_requests_total ", c.bad_request, "\n"));
  samples.clear();
  for (size_t i = 0; i < latency_.size(); ++i) {
    samples += latency_[i].Format("tessera_scheduler_request_seconds", verbs[i]);
  }
  AppendFamily(&out, "tessera_scheduler_request_seconds", "Time to answer an extender request.", "histogram",
               samples);

  samples.clear();
  if (admission_ != nullptr) {
    for (size_t v = 0; v < Admission::kVerbNames.size(); ++v) {
      for (size_t d = 0; d < Admission::kDecisionNames.size(); ++d) {
        const auto verb = static_cast<Admission::Verb>(v);
        const auto decision = static_cast<Admission::Decision>(d);
        // Validate never patches: no series that can only be 0.
        if (verb == Admission::Verb::kValidate && decision == Admission::Decision::kPatched) continue;
        AppendSample(&samples, "tessera_scheduler_webhook_decisions_total",
                     {{"verb", Admission::kVerbNames[v]}, {"decision", Admission::kDecisionNames[d]}},
                     admission_->decisions(verb, decision));
      }
    }
  }
  AppendFamily(&out, "tessera_scheduler_webhook_decisions_total",
               "Admission webhook answers by verb (mutate, validate) and decision (allowed, patched, denied, "
               "error).",
               "counter", samples);

  AppendFamily(&out, "tessera_scheduler_leader",
               "1 while this replica is the leader (the one that binds), 0 while it stands by.", "gauge",
               StrCat("tessera_scheduler_leader ", !leader_ || leader_() ? 1 : 0, "\n"));
  AppendFamily(&out, "tessera_scheduler_nodes", "Nodes with a Tessera GPU inventory.", "gauge",
               StrCat("tessera_scheduler_nodes ", cache_.node_count(), "\n"));
  AppendFamily(&out, "tessera_scheduler_pods", "Pods holding GPU shares.", "gauge",
               StrCat("tessera_scheduler_pods ", cache_.pod_count(), "\n"));

  if (gpu_metrics_) {
    // One series per GPU (and per node) and family: bounded by the cluster's GPUs, never by its pods.
    const core::Cluster cluster = cache_.Snapshot();
    constexpr int kGpuFamilies = 4;
    std::string gpu_lines[kGpuFamilies];
    std::string node_lines[2];
    const char* gpu_names[kGpuFamilies] = {
        "tessera_scheduler_gpu_cores_allocated_percent", "tessera_scheduler_gpu_memory_allocated_bytes",
        "tessera_scheduler_gpu_memory_total_bytes", "tessera_scheduler_gpu_tenants"};
    for (const core::NodeState& n : cluster.nodes()) {
      const std::string& node = n.name().value();
      for (int g = 0; g < n.gpu_count(); ++g) {
        const core::GpuInfo& info = n.gpu(g);
        const std::string labels = LabelSet({{"gpu", StrCat(info.index)},
                                             {"UUID", info.uuid.value()},
                                             {"Hostname", node},
                                             {"model", info.model}});
        const int64_t memory_used = (info.memory - n.free_memory(g)).value();
        const std::string values[kGpuFamilies] = {
            FormatValue(static_cast<double>((core::kWholeGpu - n.free_cores(g)).value()) / 10.0),
            FormatValue(memory_used << 20), FormatValue(static_cast<int64_t>(info.memory.value()) << 20),
            FormatValue(static_cast<int64_t>(n.tenants(g).size()))};
        for (int i = 0; i < kGpuFamilies; ++i) AppendSample(&gpu_lines[i], gpu_names[i], labels, values[i]);
      }
      AppendSample(&node_lines[0], "tessera_scheduler_node_schedulable", {{"Hostname", node}},
                   n.schedulable() ? 1 : 0);
      AppendSample(&node_lines[1], "tessera_scheduler_node_tenants", {{"Hostname", node}}, n.tenant_count());
    }
    const char* gpu_help[kGpuFamilies] = {
        "Compute share committed on the GPU by the scheduler (its tenants' shares and reservations), "
        "percent.",
        "GPU memory committed on the GPU by the scheduler (its tenants' limits and reservations).",
        "Memory of the GPU, as the node agent's inventory reports it.",
        "Containers the scheduler has placed on the GPU (tenants and reservations)."};
    for (int i = 0; i < kGpuFamilies; ++i)
      AppendFamily(&out, gpu_names[i], gpu_help[i], "gauge", gpu_lines[i]);
    AppendFamily(&out, "tessera_scheduler_node_schedulable",
                 "1 while the node takes new GPU pods, 0 when cordoned or its agent's heartbeat is stale.",
                 "gauge", node_lines[0]);
    AppendFamily(&out, "tessera_scheduler_node_tenants",
                 "Tenancies on the node's GPUs (a container on two GPUs counts twice): the node's "
                 "tessera_scheduler_gpu_tenants summed.",
                 "gauge", node_lines[1]);
  }
  exposition::AppendBuildInfo(&out);
  return out;
}

}  // namespace tessera::scheduler
