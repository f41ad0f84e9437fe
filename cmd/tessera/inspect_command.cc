// tessera inspect: who holds what, per node and per GPU, and a cluster summary.
//
// Three sources, one picture: the API server (nodes' inventories and pods' assignments, read through the same
// ApiSync the scheduler uses, so it shows what the scheduler would rebuild), a running tessera-scheduler's
// /inspect (what it holds right now, reservations included), or a saved /inspect JSON.
#include <httplib.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "commands.h"
#include "common/files.h"
#include "core/strings.h"
#include "formats/bounded_json.h"
#include "k8s/config.h"
#include "k8s/kube_api.h"
#include "nlohmann/json.hpp"
#include "scheduler/api_sync.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/http_server.h"

namespace tessera::cli {

namespace {

using nlohmann::json;

int Fail(const std::string& message) {
  std::cerr << "tessera inspect: " << message << "\n";
  return 2;
}

// The cluster from the API server, through the scheduler's own ApiSync.
absl::StatusOr<std::string> FromApi(const InspectOptions& o) {
  absl::StatusOr<k8s::ClientConfig> config =
      o.kubeconfig.empty() && k8s::InCluster()
          ? k8s::LoadInClusterConfig()
          : k8s::LoadKubeconfig({.paths = o.kubeconfig, .context = o.context});
  if (!config.ok()) return config.status();
  config->user_agent = "tessera-inspect";
  absl::StatusOr<std::unique_ptr<k8s::KubeApi>> api = k8s::NewKubeApi(*config);
  if (!api.ok()) return api.status();
  scheduler::ClusterCache cache(scheduler::CacheOptions{});
  scheduler::ApiSync sync(cache, {});
  absl::StatusOr<k8s::ObjectList> nodes = (*api)->ListAll(k8s::kNodes, "");
  if (!nodes.ok()) return nodes.status();
  for (const json& n : nodes->items) sync.OnNode(n);
  absl::StatusOr<k8s::ObjectList> pods = (*api)->ListAll(k8s::kPods, o.ns);
  if (!pods.ok()) return pods.status();
  for (const json& p : pods->items) sync.OnPod(p);
  for (const scheduler::Problem& p : sync.TakeProblems()) {
    std::cerr << "warning: " << p.kind << " " << (p.ns.empty() ? "" : p.ns + "/") << p.name << ": "
              << p.message << "\n";
  }
  return scheduler::InspectJson(cache.Snapshot(), cache.PodNames());
}

absl::StatusOr<std::string> FromScheduler(const std::string& url) {
  httplib::Client client(url);
  client.set_connection_timeout(5, 0);
  httplib::Result r = client.Get("/inspect");
  if (!r) {
    return absl::UnavailableError(
        StrCat("cannot reach tessera-scheduler at ", url, " (", httplib::to_string(r.error()),
               "); give its address, e.g. http://localhost:8888 after kubectl port-forward"));
  }
  if (r->status != 200) return absl::UnavailableError(StrCat(url, "/inspect answered HTTP ", r->status));
  return r->body;
}

std::string Percent(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), p == static_cast<int>(p) ? "%.0f%%" : "%.1f%%", p);
  return buf;
}

std::string GiB(int64_t mib) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", static_cast<double>(mib) / 1024.0);
  return buf;
}

// "1 node", "2 nodes".
std::string Count(int n, const char* one, const char* many) {
  return StrCat(n, " ", n == 1 ? one : many);
}

int Print(const json& doc, const InspectOptions& o) {
  int nodes = 0, gpus = 0, whole_free = 0, shared = 0, tenants = 0, unhealthy = 0;
  double cores_used = 0;
  int64_t memory_used = 0, memory_total = 0;
  std::string out;
  std::vector<std::string> names;
  const size_t uuid_width = o.wide ? 40 : 18;
  for (const json& n : doc.at("nodes")) {
    const std::string name = n.at("name").get<std::string>();
    names.push_back(name);
    if (!o.node.empty() && name != o.node) continue;
    ++nodes;
    StrAppend(&out, "node ", name, n.value("schedulable", true) ? "" : "  (no new pods: cordoned or stale)",
              "\n");
    char line[320];
    std::snprintf(line, sizeof(line), "  %-6s %-16s %-*s %6s  %s\n      %-44s %-12s %6s  %-9s %s\n", "GPU", "MODEL",
                  static_cast<int>(uuid_width), "UUID", "CORES", "MEMORY GiB (used / total)", "POD", "CONTAINER",
                  "CORES", "MEMORY", "PRIORITY");
    out += line;
    for (const json& g : n.at("gpus")) {
      ++gpus;
      const double used = g.at("coresUsed").get<double>();
      const int64_t mem = g.at("memoryMiB").get<int64_t>();
      const int64_t mem_used = g.at("memoryUsedMiB").get<int64_t>();
      cores_used += used;
      memory_used += mem_used;
      memory_total += mem;
      if (used == 0 && mem_used == 0) ++whole_free;
      if (g.at("tenants").size() > 1) ++shared;
      if (g.value("health", "healthy") != "healthy") ++unhealthy;
      std::snprintf(line, sizeof(line), "  GPU %-2d %-16s %-*s %6s  %6s / %6s%s\n",
                    g.at("index").get<int>(), g.at("model").get<std::string>().c_str(),
                    static_cast<int>(uuid_width), g.at("uuid").get<std::string>().substr(0, uuid_width).c_str(),
                    Percent(used).c_str(), GiB(mem_used).c_str(), GiB(mem).c_str(),
                    g.value("health", "healthy") == "healthy" ? "" : "  UNHEALTHY");
      out += line;
      for (const json& t : g.at("tenants")) {
        ++tenants;
        std::string pod = t.value("pod", "");
        if (pod.empty()) pod = StrCat(t.value("namespace", ""), "/", t.value("podUID", ""));
        const double cores = t.at("cores").get<double>();
        const double requested = t.value("requestedCores", cores);
        std::snprintf(line, sizeof(line), "      %-44s %-12s %6s%s  %-9s %s\n", pod.c_str(),
                      t.value("container", "").c_str(), Percent(cores).c_str(),
                      requested > cores ? StrCat(" (asked ", Percent(requested), ")").c_str() : "",
                      StrCat(GiB(t.at("memoryMiB").get<int64_t>()), " GiB").c_str(),
                      t.value("priority", "low").c_str());
        out += line;
      }
    }
  }
  if (!o.node.empty() && nodes == 0) {
    const bool more = names.size() > 10;
    if (more) names.resize(10);
    return Fail(StrCat("no node ", o.node, " in the inspection; it has ",
                       Count(static_cast<int>(names.size()), "node", "nodes"),
                       names.empty() ? "" : StrCat(": ", StrJoin(names, ", "), more ? ", ..." : ""),
                       " (names as kubectl get nodes prints them)"));
  }
  if (o.summary_only) out.clear();
  std::cout << out;
  std::printf("%s%s, %s (%d unhealthy): %s free, %d shared by several tenants, %s; compute committed %.1f GPUs "
              "(%s), memory %s of %s GiB\n",
              out.empty() ? "" : "\n", Count(nodes, "node", "nodes").c_str(), Count(gpus, "GPU", "GPUs").c_str(),
              unhealthy, Count(whole_free, "whole GPU", "whole GPUs").c_str(), shared,
              Count(tenants, "tenant", "tenants").c_str(), cores_used / 100.0,
              Percent(gpus > 0 ? cores_used / gpus : 0).c_str(), GiB(memory_used).c_str(), GiB(memory_total).c_str());
  return 0;
}

}  // namespace

int RunInspect(const InspectOptions& o) {
  absl::StatusOr<std::string> text;
  if (!o.file.empty()) {
    text = ReadTextFile(o.file);
  } else if (!o.scheduler.empty()) {
    text = FromScheduler(o.scheduler);
  } else {
    text = FromApi(o);
    if (!text.ok()) {
      return Fail(StrCat(Message(text.status()),
                         "\n(or ask a running scheduler: tessera inspect --scheduler http://HOST:8888)"));
    }
  }
  if (!text.ok()) return Fail(Message(text.status()));
  absl::StatusOr<json> parsed = formats::ParseBoundedJson(*text, "the inspection");
  if (!parsed.ok()) return Fail(Message(parsed.status()));
  json doc = *std::move(parsed);
  if (!doc.is_object() || !doc.contains("nodes") || !doc["nodes"].is_array()) {
    return Fail("the inspection is not tessera-scheduler's /inspect JSON ({\"nodes\": [...]})");
  }
  if (o.json) {
    std::cout << doc.dump(2) << "\n";
    return 0;
  }
  try {
    return Print(doc, o);
  } catch (const json::exception& e) {
    return Fail(StrCat("the inspection JSON lacks a field: ", e.what()));
  }
}

}  // namespace tessera::cli
