#include "formats/cluster_file.h"

#include <yaml-cpp/yaml.h>

#include <set>

#include "absl/status/status.h"
#include "core/strings.h"
#include "formats/yaml_fields.h"

namespace tessera::formats {

using core::GpuInfo;
using core::GpuUuid;
using core::MiB;
using core::NodeInfo;

namespace {

core::Link ParseLink(const YAML::Node& n) {
  absl::StatusOr<core::Link> l = core::Link::Parse(Str(n, "a link"));
  if (!l.ok()) Fail(n, std::string(l.status().message()));
  return *l;
}

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

std::vector<NodeInfo> ParseNode(const YAML::Node& n) {
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

  std::vector<NodeInfo> out;
  for (int r = 0; r < replicas; ++r) {
    NodeInfo info = base;
    info.name = core::NodeName(replicas == 1 ? name : StrCat(name, "-", r));
    const YAML::Node& gpus = n["gpus"];
    if (gpus && gpus.IsMap()) {
      // Shorthand: {model, count, memoryMiB, numa?}
      CheckKeys(gpus, {"model", "count", "memoryMiB"}, "gpus (shorthand)");
      if (!gpus["model"] || !gpus["count"] || !gpus["memoryMiB"]) {
        Fail(gpus, "the gpus shorthand needs model, count and memoryMiB (or give a list of GPUs)");
      }
      const int count = static_cast<int>(Int(gpus["count"], "count", 0, core::kMaxGpusPerNode));
      for (int i = 0; i < count; ++i) {
        GpuInfo g;
        g.index = i;
        g.uuid = GpuUuid(StrCat("GPU-", info.name.value(), "-", i));
        g.model = Str(gpus["model"], "model");
        g.memory = MiB(Int(gpus["memoryMiB"], "memoryMiB", 1, int64_t{1} << 40));
        info.gpus.push_back(std::move(g));
      }
    } else if (gpus && gpus.IsSequence()) {
      int i = 0;
      for (const YAML::Node& g : gpus) info.gpus.push_back(ParseGpu(g, info.name.value(), i++));
    } else if (gpus) {
      Fail(gpus, "gpus must be a list of GPUs or {model, count, memoryMiB}");
    }
    if (replicas > 1 && gpus && gpus.IsSequence()) {
      for (GpuInfo& g : info.gpus) {
        if (!gpus[static_cast<size_t>(g.index)]["uuid"]) continue;
        g.uuid = GpuUuid(StrCat(g.uuid.value(), "-", r));  // UUIDs stay unique across replicas
      }
    }
    const int count = static_cast<int>(info.gpus.size());
    if (n["topology"] && n["links"])
      Fail(n, "give either topology (nvidia-smi topo -m text) or links, not both");
    if (n["topology"]) {
      absl::StatusOr<core::TopoReport> topo = core::ParseNvidiaSmiTopo(Str(n["topology"], "topology"));
      if (!topo.ok()) Fail(n["topology"], StrCat("topology: ", topo.status().message()));
      if (topo->links.size() != count) {
        Fail(n["topology"],
             StrCat("topology describes ", topo->links.size(), " GPUs but the node has ", count));
      }
      info.links = topo->links;
      for (int g = 0; g < count; ++g) {
        GpuInfo& gpu = info.gpus[static_cast<size_t>(g)];
        if (gpu.numa_node < 0) gpu.numa_node = topo->numa_node[static_cast<size_t>(g)];
        if (gpu.numa_node >= 0 && !topo->cpu_affinity[static_cast<size_t>(g)].empty()) {
          info.numa_cpus.emplace(gpu.numa_node, topo->cpu_affinity[static_cast<size_t>(g)]);
        }
      }
    } else if (n["links"]) {
      std::vector<std::vector<std::string>> rows;
      for (const YAML::Node& row : n["links"]) {
        std::vector<std::string> r2;
        for (const YAML::Node& cell : row) r2.push_back(core::Link(ParseLink(cell)).ToString());
        rows.push_back(std::move(r2));
      }
      absl::StatusOr<core::LinkMatrix> m = core::LinkMatrix::FromRows(rows);
      if (!m.ok()) Fail(n["links"], std::string(m.status().message()));
      if (m->size() != count)
        Fail(n["links"],
             StrCat("links is ", m->size(), "x", m->size(), " but the node has ", count, " GPUs"));
      info.links = *m;
    }
    if (n["numaCpus"]) {
      if (!n["numaCpus"].IsMap())
        Fail(n["numaCpus"], "numaCpus maps a NUMA node to its CPUs, e.g. {0: \"0-15\"}");
      for (const auto& kv : n["numaCpus"]) {
        const int numa = static_cast<int>(Int(kv.first, "a NUMA node", 0, 1024));
        const std::string cpus = Str(kv.second, "numaCpus");
        absl::StatusOr<std::vector<int>> parsed = core::ParseCpuList(cpus);
        if (!parsed.ok()) Fail(kv.second, std::string(parsed.status().message()));
        info.numa_cpus[numa] = cpus;
      }
    }
    out.push_back(std::move(info));
  }
  return out;
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
    YAML::Node doc = YAML::Load(std::string(text));
    if (!doc || doc.IsNull()) Fail(doc, "the file is empty; expected a mapping with a list of nodes");
    CheckKeys(doc, {"apiVersion", "kind", "nodes", "quotas"}, "a cluster file");
    if (doc["kind"] && Str(doc["kind"], "kind") != "Cluster") {
      Fail(doc["kind"],
           StrCat("kind is ", doc["kind"].as<std::string>(), "; a cluster file has kind: Cluster"));
    }
    if (!doc["nodes"] || !doc["nodes"].IsSequence()) Fail(doc, "a cluster file needs a list of nodes");
    ClusterFile file;
    std::set<std::string> names;
    for (const YAML::Node& n : doc["nodes"]) {
      for (NodeInfo& info : ParseNode(n)) {
        if (!names.insert(info.name.value()).second)
          Fail(n, StrCat("node ", info.name.value(), " appears twice"));
        file.nodes.push_back(std::move(info));
      }
    }
    if (doc["quotas"]) file.quotas = ParseQuotas(doc["quotas"]);
    return file;
  });
}

absl::StatusOr<std::vector<QuotaEntry>> ParseQuotaFile(std::string_view text, std::string_view source) {
  return Guard(source, [&]() -> absl::StatusOr<std::vector<QuotaEntry>> {
    YAML::Node doc = YAML::Load(std::string(text));
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
    YAML::Node doc = YAML::Load(std::string(text));
    if (!doc || doc.IsNull()) Fail(doc, "the file is empty; expected a mapping with a list of pods");
    CheckKeys(doc, {"apiVersion", "kind", "pods"}, "a workload file");
    if (!doc["pods"] || !doc["pods"].IsSequence()) Fail(doc, "a workload file needs a list of pods");
    std::vector<core::PodSpec> pods;
    std::set<std::string> uids;
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
      const int replicas = p["replicas"] ? static_cast<int>(Int(p["replicas"], "replicas", 1, 1000000)) : 1;
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
