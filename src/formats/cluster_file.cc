#include "formats/cluster_file.h"

#include <yaml-cpp/yaml.h>

#include <set>

#include "absl/status/status.h"
#include "core/quantity.h"
#include "core/strings.h"
#include "formats/gpu_topology.h"
#include "formats/yaml_fields.h"

namespace tessera::formats {

using core::GpuInfo;
using core::GpuUuid;
using core::MiB;
using core::NodeInfo;

namespace {

GpuInfo ParseGpu(const YAML::Node& n, const std::string& node, int index) {
  CheckKeys(n, {"uuid", "model", "memoryMiB", "numa", "healthy"}, "a GPU");
  GpuInfo g;
  g.index = index;
  g.uuid = GpuUuid(n["uuid"] ? Str(n["uuid"], "uuid") : StrCat("GPU-", node, "-", index));
  if (!n["model"]) Fail(n, "a GPU needs a model (e.g. model: A100-SXM4-80GB)");
  g.model = Str(n["model"], "model");
  if (!n["memoryMiB"]) Fail(n, "a GPU needs memoryMiB (e.g. memoryMiB: 81920)");
  g.memory = MiB(Int(n["memoryMiB"], "memoryMiB", 1, int64_t{1} << 40));
  if (n["numa"]) g.numa_node = static_cast<int>(Int(n["numa"], "numa", -1, 1024));
  if (n["healthy"] && !Bool(n["healthy"], "healthy")) g.health = core::GpuHealth::kUnhealthy;
  return g;
}

// Parses one entry of `nodes` (a node, or `replicas` of it) and appends its nodes to `out`, refusing a file
// whose nodes or GPUs would pass the caps (`gpus` counts the file's GPUs so far). What the replicas share is
// parsed once: the topology text used to be parsed again for each replica.
void ParseNode(const YAML::Node& n, std::vector<NodeInfo>& out, int64_t& gpus_total) {
  CheckKeys(
      n,
      {"name", "replicas", "cpuMilli", "memoryMiB", "gpus", "topology", "links", "numaCpus", "schedulable"},
      "a node");
  if (!n["name"]) Fail(n, "a node needs a name");
  NodeInfo base;
  const std::string name = Str(n["name"], "name");
  if (n["cpuMilli"]) base.cpu = core::MilliCpu(Int(n["cpuMilli"], "cpuMilli", 0, int64_t{1} << 40));
  if (n["memoryMiB"]) base.memory = MiB(Int(n["memoryMiB"], "memoryMiB", 0, int64_t{1} << 40));
  if (n["schedulable"]) base.schedulable = Bool(n["schedulable"], "schedulable");
  const int replicas = n["replicas"] ? static_cast<int>(Int(n["replicas"], "replicas", 1, 100000)) : 1;
  if (static_cast<int64_t>(out.size()) + replicas > kMaxFileNodes) {
    Fail(n, StrCat("the file has more than ", kMaxFileNodes, " nodes with this entry's ", replicas,
                   " replicas; a cluster file holds at most ", kMaxFileNodes,
                   ": lower replicas or split the cluster"));
  }
  const auto first_name = [&] { return replicas == 1 ? name : StrCat(name, "-0"); };

  // The GPUs of the first replica; `explicit_uuid` marks those whose uuid the file gives.
  std::vector<bool> explicit_uuid;
  const YAML::Node& gpus = n["gpus"];
  if (gpus && gpus.IsMap()) {
    // Shorthand: {model, count, memoryMiB, numa?}
    CheckKeys(gpus, {"model", "count", "memoryMiB"}, "gpus (shorthand)");
    if (!gpus["model"] || !gpus["count"] || !gpus["memoryMiB"]) {
      Fail(gpus, "the gpus shorthand needs model, count and memoryMiB (or give a list of GPUs)");
    }
    const int count = static_cast<int>(Int(gpus["count"], "count", 0, core::kMaxGpusPerNode));
    const std::string model = Str(gpus["model"], "model");
    const MiB memory(Int(gpus["memoryMiB"], "memoryMiB", 1, int64_t{1} << 40));
    for (int i = 0; i < count; ++i) {
      GpuInfo g;
      g.index = i;
      g.model = model;
      g.memory = memory;
      base.gpus.push_back(std::move(g));
      explicit_uuid.push_back(false);
    }
  } else if (gpus && gpus.IsSequence()) {
    int i = 0;
    for (const YAML::Node& g : gpus) {
      if (i >= core::kMaxGpusPerNode) {
        Fail(g, StrCat("a node has at most ", core::kMaxGpusPerNode, " GPUs"));
      }
      base.gpus.push_back(ParseGpu(g, first_name(), i++));
      explicit_uuid.push_back(static_cast<bool>(g["uuid"]));
    }
  } else if (gpus) {
    Fail(gpus, "gpus must be a list of GPUs or {model, count, memoryMiB}");
  }
  const int count = static_cast<int>(base.gpus.size());
  if (gpus_total + int64_t{count} * replicas > kMaxFileGpus) {
    Fail(n,
         StrCat("the file has more than ", kMaxFileGpus, " GPUs with this entry's ", replicas, " x ", count,
                "; a cluster file holds at most ", kMaxFileGpus, ": lower replicas or split the cluster"));
  }
  gpus_total += int64_t{count} * replicas;
  if (std::optional<GpuTopology> topo = ReadGpuTopology(n, count, "the node has")) {
    base.links = std::move(topo->links);
    for (size_t g = 0; g < topo->numa_node.size(); ++g) {
      GpuInfo& gpu = base.gpus[g];
      if (gpu.numa_node < 0) gpu.numa_node = topo->numa_node[g];
      if (gpu.numa_node >= 0 && !topo->cpu_affinity[g].empty()) {
        base.numa_cpus.emplace(gpu.numa_node, topo->cpu_affinity[g]);
      }
    }
  }
  if (n["numaCpus"]) {
    if (!n["numaCpus"].IsMap())
      Fail(n["numaCpus"], "numaCpus maps a NUMA node to its CPUs, e.g. {0: \"0-15\"}");
    for (const auto& kv : n["numaCpus"]) {
      const int numa = static_cast<int>(Int(kv.first, "a NUMA node", 0, 1024));
      const std::string cpus = Str(kv.second, "numaCpus");
      absl::StatusOr<std::vector<int>> parsed = core::ParseCpuList(cpus);
      if (!parsed.ok()) Fail(kv.second, std::string(parsed.status().message()));
      base.numa_cpus[numa] = cpus;
    }
  }

  for (int r = 0; r < replicas; ++r) {
    NodeInfo info = base;
    info.name = core::NodeName(replicas == 1 ? name : StrCat(name, "-", r));
    for (size_t i = 0; i < info.gpus.size(); ++i) {
      GpuInfo& g = info.gpus[i];
      if (!explicit_uuid[i]) {
        g.uuid = GpuUuid(StrCat("GPU-", info.name.value(), "-", g.index));
      } else if (replicas > 1) {
        g.uuid = GpuUuid(StrCat(base.gpus[i].uuid.value(), "-", r));  // UUIDs stay unique across replicas
      }
    }
    out.push_back(std::move(info));
  }
}

template <typename F>
auto Guard(std::string_view source, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const FileError& e) {
    return absl::InvalidArgumentError(
        StrCat(source, e.line > 0 ? StrCat(" line ", e.line) : "", ": ", e.message));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat(source, " line ", e.mark.line + 1, ": ", e.msg));
  }
}

void ParseResourceMap(const YAML::Node& n, core::ResourceList& out, std::string_view what) {
  if (!n.IsMap()) Fail(n, StrCat(what, " must map resource names to quantities"));
  for (const auto& kv : n) out[kv.first.as<std::string>()] = Str(kv.second, what);
}

// About what a parsed pod takes in memory: its strings, and a fixed allowance for each object and map entry.
// Only compared with kMaxFilePodBytes, which has room for honest estimates' error.
int64_t ApproximateBytes(const core::PodSpec& pod) {
  constexpr int64_t kObject = 256;
  constexpr int64_t kEntry = 96;
  int64_t n = kObject + static_cast<int64_t>(pod.name.size() + pod.ns.size()) * 2 + 64;
  for (const auto& [k, v] : pod.annotations) n += kEntry + static_cast<int64_t>(k.size() + v.size());
  for (const core::ContainerSpec& c : pod.containers) {
    n += kObject + static_cast<int64_t>(c.name.size());
    for (const core::ResourceList* list : {&c.limits, &c.requests}) {
      for (const auto& [k, v] : *list) n += kEntry + static_cast<int64_t>(k.size() + v.size());
    }
  }
  return n;
}

// A list of {namespace, model, gpus}; one namespace and model at most once.
std::vector<QuotaEntry> ParseQuotas(const YAML::Node& list) {
  if (!list.IsSequence()) Fail(list, "quotas must be a list of {namespace, model, gpus}");
  std::vector<QuotaEntry> out;
  std::set<std::pair<std::string, std::string>> seen;
  for (const YAML::Node& q : list) {
    CheckKeys(q, {"namespace", "model", "gpus"}, "a quota");
    if (!q["namespace"] || !q["model"] || !q["gpus"]) Fail(q, "a quota needs namespace, model and gpus");
    // gpus may be fractional: 2.5 GPUs is 2500 thousandths.
    double gpus = 0;
    try {
      gpus = q["gpus"].as<double>();
    } catch (const YAML::Exception&) {
      Fail(q["gpus"], "gpus must be a number of GPUs, e.g. 4 or 2.5");
    }
    if (!(gpus >= 0 && gpus <= 1e6)) Fail(q["gpus"], "gpus must be a number of GPUs between 0 and 1000000");
    QuotaEntry e{core::Namespace(Str(q["namespace"], "namespace")), Str(q["model"], "model"),
                 core::MilliGpu(static_cast<int32_t>(gpus * 1000 + 0.5))};
    if (!seen.insert({e.ns.value(), e.model}).second) {
      Fail(q, StrCat("namespace ", e.ns.value(), " has two quotas for ", e.model, "; keep one"));
    }
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace

absl::StatusOr<ClusterFile> ParseClusterFile(std::string_view text, std::string_view source) {
  return Guard(source, [&]() -> absl::StatusOr<ClusterFile> {
    YAML::Node doc = LoadBounded(text);
    if (!doc || doc.IsNull()) Fail(doc, "the file is empty; expected a mapping with a list of nodes");
    CheckKeys(doc, {"apiVersion", "kind", "nodes", "quotas"}, "a cluster file");
    if (doc["kind"] && Str(doc["kind"], "kind") != "Cluster") {
      Fail(doc["kind"],
           StrCat("kind is ", doc["kind"].as<std::string>(), "; a cluster file has kind: Cluster"));
    }
    if (!doc["nodes"] || !doc["nodes"].IsSequence()) Fail(doc, "a cluster file needs a list of nodes");
    ClusterFile file;
    std::set<std::string> names;
    int64_t gpus = 0;
    for (const YAML::Node& n : doc["nodes"]) {
      const size_t before = file.nodes.size();
      ParseNode(n, file.nodes, gpus);
      for (size_t i = before; i < file.nodes.size(); ++i) {
        if (!names.insert(file.nodes[i].name.value()).second)
          Fail(n, StrCat("node ", file.nodes[i].name.value(), " appears twice"));
      }
    }
    if (doc["quotas"]) file.quotas = ParseQuotas(doc["quotas"]);
    return file;
  });
}

absl::StatusOr<std::vector<QuotaEntry>> ParseQuotaFile(std::string_view text, std::string_view source) {
  return Guard(source, [&]() -> absl::StatusOr<std::vector<QuotaEntry>> {
    YAML::Node doc = LoadBounded(text);
    if (!doc || doc.IsNull() || !doc.IsMap()) {
      Fail(doc, "expected a mapping: apiVersion: tessera.dev/v1, kind: GpuQuotas, quotas: [...]");
    }
    CheckKeys(doc, {"apiVersion", "kind", "quotas"}, "a quota file");
    if (doc["kind"] && Str(doc["kind"], "kind") != "GpuQuotas") {
      Fail(doc["kind"], StrCat("kind is ", doc["kind"].as<std::string>(), "; a quota file has kind: GpuQuotas"));
    }
    if (!doc["quotas"] || doc["quotas"].IsNull()) return std::vector<QuotaEntry>();
    return ParseQuotas(doc["quotas"]);
  });
}

absl::StatusOr<core::Cluster> BuildCluster(const ClusterFile& file) {
  core::Cluster cluster;
  for (const NodeInfo& n : file.nodes) {
    absl::Status s = cluster.AddNode(n);
    if (!s.ok()) return s;
  }
  for (const QuotaEntry& q : file.quotas) cluster.SetQuota(q.ns, q.model, q.limit);
  return cluster;
}

absl::StatusOr<std::vector<core::PodSpec>> ParseWorkloadFile(std::string_view text, std::string_view source) {
  return Guard(source, [&]() -> absl::StatusOr<std::vector<core::PodSpec>> {
    YAML::Node doc = LoadBounded(text);
    if (!doc || doc.IsNull()) Fail(doc, "the file is empty; expected a mapping with a list of pods");
    CheckKeys(doc, {"apiVersion", "kind", "pods"}, "a workload file");
    if (!doc["pods"] || !doc["pods"].IsSequence()) Fail(doc, "a workload file needs a list of pods");
    std::vector<core::PodSpec> pods;
    std::set<std::string> uids;
    int64_t containers = 0;
    int64_t bytes = 0;
    for (const YAML::Node& p : doc["pods"]) {
      CheckKeys(p, {"name", "namespace", "uid", "replicas", "annotations", "containers"}, "a pod");
      if (!p["name"]) Fail(p, "a pod needs a name");
      core::PodSpec base;
      base.name = Str(p["name"], "name");
      if (p["namespace"]) base.ns = Str(p["namespace"], "namespace");
      if (p["annotations"]) {
        if (!p["annotations"].IsMap()) Fail(p["annotations"], "annotations must map keys to strings");
        for (const auto& kv : p["annotations"])
          base.annotations[kv.first.as<std::string>()] = Str(kv.second, "an annotation");
      }
      if (!p["containers"] || !p["containers"].IsSequence()) Fail(p, "a pod needs a list of containers");
      for (const YAML::Node& c : p["containers"]) {
        CheckKeys(c, {"name", "resources", "privileged"}, "a container");
        core::ContainerSpec spec;
        spec.name = c["name"] ? Str(c["name"], "name") : "main";
        if (c["privileged"]) spec.privileged = Bool(c["privileged"], "privileged");
        if (const YAML::Node& r = c["resources"]) {
          if (r.IsMap() && (r["limits"] || r["requests"])) {
            CheckKeys(r, {"limits", "requests"}, "resources");
            if (r["limits"]) ParseResourceMap(r["limits"], spec.limits, "limits");
            if (r["requests"]) ParseResourceMap(r["requests"], spec.requests, "requests");
          } else {
            ParseResourceMap(r, spec.limits, "resources");  // shorthand: the limits
          }
        }
        base.containers.push_back(std::move(spec));
      }
      const int replicas =
          p["replicas"] ? static_cast<int>(Int(p["replicas"], "replicas", 1, kMaxFilePods)) : 1;
      // Refused before a replica is made: 1,000 aliased containers times a million replicas passed every
      // other check of a 4 KB file and ended in bad_alloc.
      if (static_cast<int64_t>(pods.size()) + replicas > kMaxFilePods) {
        Fail(p, StrCat("the file has more than ", kMaxFilePods, " pods with this entry's ", replicas,
                       " replicas; a workload file holds at most ", kMaxFilePods, ": lower replicas"));
      }
      containers = core::SaturatingAdd(containers, core::SaturatingMul(replicas, base.containers.size()));
      if (containers > kMaxFileContainers) {
        Fail(p, StrCat("the file has more than ", kMaxFileContainers, " containers with this entry's ",
                       replicas, " replicas of ", base.containers.size(), "; a workload file holds at most ",
                       kMaxFileContainers, ": lower replicas or the number of containers"));
      }
      bytes = core::SaturatingAdd(bytes, core::SaturatingMul(replicas, ApproximateBytes(base)));
      if (bytes > kMaxFilePodBytes) {
        Fail(p, StrCat("the file's pods would take more than ", kMaxFilePodBytes >> 20,
                       " MiB in memory with this ", "entry's ", replicas, " replicas (about ",
                       ApproximateBytes(base), " bytes each); lower ",
                       "replicas, or shorten the annotations and names"));
      }
      for (int r = 0; r < replicas; ++r) {
        core::PodSpec pod = base;
        if (replicas > 1) pod.name = StrCat(base.name, "-", r);
        pod.uid = p["uid"] && replicas == 1 ? Str(p["uid"], "uid") : StrCat(pod.ns, "/", pod.name);
        if (!uids.insert(pod.uid).second) Fail(p, StrCat("pod ", pod.ns, "/", pod.name, " appears twice"));
        pods.push_back(std::move(pod));
      }
    }
    return pods;
  });
}

}  // namespace tessera::formats
