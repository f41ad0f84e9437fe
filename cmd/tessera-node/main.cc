// tessera-node: the node agent (a DaemonSet on every GPU node): GPU inventory and health, the kubelet device
// plugin for tessera.dev/gpu, per-container limits files and shared regions, the hook registration socket,
// reconciliation, garbage collection and metrics. See docs/node-agent.md.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <thread>

#include "common/log.h"
#include "core/strings.h"
#include "gpu/gpu_source.h"
#include "gpu/health_monitor.h"
#include "http/guarded_server.h"
#include "http/listen.h"
#include "k8s/config.h"
#include "k8s/kube_api.h"
#include "kubelet/device_plugin.h"
#include "kubelet/dra_plugin.h"
#include "kubelet/pod_resources_client.h"
#include "node/agent.h"
#include "node/dra_driver.h"
#include "node/dra_fallback.h"
#include "node/gpu_split.h"
#include "node/kube_node_api.h"
#include "node/node_api.h"

namespace {

using namespace tessera;  // NOLINT

struct Options {
  std::string node_name;
  std::string kubeconfig;
  std::string fake_api;
  std::string fake_gpus;
  std::string device_plugin_dir = kubelet::kDevicePluginDir;
  std::string pod_resources_socket = kubelet::kPodResourcesSocket;
  std::string state_dir = "/var/lib/tessera";
  std::string hook_dir;
  std::string metrics_listen = "0.0.0.0:9402";
  std::string dra_gpus;  // GPU indices given to the DRA driver: "", "all", "6,7", "4-7"
  std::string kubelet_plugins_dir = kubelet::kKubeletPluginsDir;
  std::string kubelet_registry_dir = kubelet::kKubeletPluginsRegistryDir;
  std::string cdi_dir = node::kCdiDir;
  int slots_per_gpu = 10;
  int dra_fallback_after = 60;  // seconds; 0: off
  int dra_forgotten_claim_grace = 120;  // seconds
  std::string scheduler_lease = "tessera-system/tessera-scheduler";
  bool device_nodes = false;
  bool verbose = false;
};

int Fail(const std::string& message) {
  std::cerr << "tessera-node: " << message << "\n";
  return 2;
}

int Run(const Options& o) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  if (o.node_name.empty())
    return Fail("give --node-name (in the DaemonSet: the downward API's spec.nodeName)");
  std::unique_ptr<node::NodeApi> api;
  std::unique_ptr<k8s::KubeApi> kube;
  if (!o.fake_api.empty()) {
    api = std::make_unique<node::FileNodeApi>(o.fake_api, o.node_name);
  } else {
    absl::StatusOr<k8s::ClientConfig> config =
        o.kubeconfig.empty() && k8s::InCluster()
            ? k8s::LoadInClusterConfig()
            : k8s::LoadKubeconfig({.paths = o.kubeconfig, .context = ""});
    if (!config.ok()) {
      return Fail(
          StrCat(Message(config.status()), " (or give --fake-api FILE to run without an API server)"));
    }
    config->user_agent = "tessera-node";
    absl::StatusOr<std::unique_ptr<k8s::KubeApi>> made = k8s::NewKubeApi(*config);
    if (!made.ok()) return Fail(Message(made.status()));
    kube = *std::move(made);
    api = std::make_unique<node::KubeNodeApi>(*kube, o.node_name);
  }
  gpu::GpuSourceOptions gso;
  gso.fake_gpus_file = o.fake_gpus;
  gso.node_name = o.node_name;
  absl::StatusOr<std::unique_ptr<gpu::GpuSource>> source = gpu::OpenGpuSource(gso);
  if (!source.ok()) return Fail(Message(source.status()));
  absl::StatusOr<formats::GpuInventory> inventory = (*source)->Read();
  if (!inventory.ok()) return Fail(Message(inventory.status()));

  if (!o.dra_gpus.empty() && kube == nullptr) {
    return Fail("--dra-gpus needs the API server (ResourceSlices, ResourceClaims), not --fake-api");
  }
  // Which GPUs go to DRA, and the device-plugin path's view of the rest (node/gpu_split.h).
  absl::StatusOr<node::GpuSplit> split = node::SplitGpus(*inventory, o.dra_gpus);
  if (!split.ok()) return Fail(Message(split.status()));

  absl::StatusOr<std::unique_ptr<kubelet::PodResourcesClient>> pod_resources =
      kubelet::PodResourcesClient::Connect(o.pod_resources_socket);
  if (!pod_resources.ok()) return Fail(Message(pod_resources.status()));

  node::NodeAgentConfig config;
  config.node_name = o.node_name;
  config.state_dir = o.state_dir;
  config.hook_dir = o.hook_dir;
  config.device_nodes = o.device_nodes;
  config.dra_gpu_uuids = split->dra_uuids;
  node::NodeAgent agent(config, api.get(), split->device_plugin_inventory, pod_resources->get());
  if (absl::Status s = agent.Start(); !s.ok()) return Fail(Message(s));

  // Lifts the DRA placement gate of pods tessera-scheduler left waiting while it stays unavailable
  // (docs/dra.md).
  std::unique_ptr<node::DraFallback> fallback;
  if (kube != nullptr && o.dra_fallback_after > 0) {
    node::DraFallbackConfig fc;
    fc.node_name = o.node_name;
    fc.fallback_after = std::chrono::seconds(o.dra_fallback_after);
    fc.scheduler_lease = o.scheduler_lease;
    absl::StatusOr<std::unique_ptr<node::DraFallback>> made = node::DraFallback::Create(fc, *kube);
    if (!made.ok()) return Fail(StrCat("--scheduler-lease: ", Message(made.status())));
    fallback = *std::move(made);
    fallback->Start();
  }

  std::unique_ptr<node::DraDriver> dra;
  std::unique_ptr<kubelet::DraPlugin> dra_plugin;
  if (split->has_dra()) {
    node::DraDriverConfig dc;
    dc.node_name = o.node_name;
    dc.cdi_dir = o.cdi_dir;
    dc.gpus = split->dra_indices;
    dc.forgotten_claim_grace = std::chrono::seconds(o.dra_forgotten_claim_grace);
    dra = std::make_unique<node::DraDriver>(dc, kube.get(), &agent, *inventory);
    dra->Start();
    kubelet::DraPluginConfig dpc;
    dpc.plugins_dir = o.kubelet_plugins_dir;
    dpc.registry_dir = o.kubelet_registry_dir;
    absl::StatusOr<std::unique_ptr<kubelet::DraPlugin>> made = kubelet::DraPlugin::Create(dpc, dra.get());
    if (!made.ok()) return Fail(Message(made.status()));
    dra_plugin = *std::move(made);
    if (absl::Status s = dra_plugin->Start(); !s.ok()) return Fail(Message(s));
  }

  kubelet::DevicePluginConfig pc;
  pc.plugin_dir = o.device_plugin_dir;
  pc.slots_per_gpu = o.slots_per_gpu;
  pc.links = inventory->links;
  absl::StatusOr<std::unique_ptr<kubelet::DevicePlugin>> plugin =
      kubelet::DevicePlugin::Create(pc, kubelet::PluginGpusFrom(split->device_plugin_inventory), &agent);
  if (!plugin.ok()) return Fail(Message(plugin.status()));
  if (absl::Status s = (*plugin)->Start(); !s.ok()) return Fail(Message(s));

  gpu::HealthMonitor monitor(source->get(), *inventory, [&](const gpu::HealthUpdate& u) {
    const bool healthy = u.health == core::GpuHealth::kHealthy;
    const node::HealthRoute route = split->RouteHealth(u.uuid, healthy);
    if (route.dra && dra) dra->SetGpuHealth(u.uuid, healthy);
    if (!route.device_plugin) return;
    (*plugin)->SetGpuHealth(u.uuid, healthy);
    agent.SetGpuHealth(u.uuid, healthy, u.reason);
    log::Warn(healthy ? "GPU healthy again" : "GPU unhealthy",
              {{"gpu", u.uuid.value()}, {"reason", u.reason}});
  });

  // The metrics port is reachable from pods (it listens on all interfaces for Prometheus): the guarded server
  // keeps slow and numerous clients from starving /healthz, which the liveness probe reads.
  http::GuardedHttpServer http{
      http::HttpLimits{.request_timeout = std::chrono::seconds(10), .threads = 8, .max_connections = 256}};
  http.Get("/metrics", http.Guard([&](const httplib::Request&, httplib::Response& res) {
    res.set_content(agent.MetricsText() + (dra_plugin ? dra_plugin->MetricsText() + dra->MetricsText() : "") +
                        (fallback ? fallback->MetricsText() : ""),
                    "text/plain; version=0.0.4");
  }));
  http.Get("/healthz", http.Guard([&](const httplib::Request&, httplib::Response& res) {
    res.set_content((*plugin)->registered() ? "ok\n" : "not registered with the kubelet yet\n", "text/plain");
  }));
  std::thread http_thread;
  if (!o.metrics_listen.empty()) {
    absl::StatusOr<std::pair<std::string, int>> listen = http::ParseListen(o.metrics_listen);
    if (!listen.ok()) return Fail(StrCat("--metrics-listen: ", listen.status().message()));
    if (absl::StatusOr<int> port = http.BindAndListen(listen->first, listen->second); !port.ok()) {
      return Fail(StrCat("--metrics-listen: ", port.status().message()));
    }
    http_thread = std::thread([&] { http.listen_after_bind(); });
  }
  log::Info("tessera-node running", {{"node", o.node_name},
                                     {"gpus", StrCat(inventory->gpus.size())},
                                     {"source", inventory->source},
                                     {"socket", (*plugin)->socket_path()}});
  int sig = 0;
  sigwait(&signals, &sig);
  log::Info("stopping", {{"signal", std::to_string(sig)}});
  http.stop();
  if (http_thread.joinable()) http_thread.join();
  (*plugin)->Stop();
  if (dra_plugin) dra_plugin->Stop();
  if (dra) dra->Stop();
  if (fallback) fallback->Stop();
  agent.Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "tessera-node: the Tessera node agent (DaemonSet). Publishes the node's GPUs, serves the kubelet "
      "device "
      "plugin for tessera.dev/gpu, writes each GPU container's limits and registers its processes. "
      "See docs/node-agent.md."};
  app.add_option("--node-name", o.node_name, "This node's name (the downward API's spec.nodeName)")
      ->required();
  app.add_option(
      "--kubeconfig", o.kubeconfig,
      "kubeconfig file (default: in a pod its service account, else $KUBECONFIG or ~/.kube/config)");
  app.add_option("--fake-api", o.fake_api,
                 "Standalone: a JSON file standing in for the API server ({\"pods\": [v1.Pod...]})");
  app.add_option("--fake-gpus", o.fake_gpus, "A fake-GPU file (YAML/JSON) instead of NVML")
      ->check(CLI::ExistingFile);
  app.add_option("--device-plugin-dir", o.device_plugin_dir, "The kubelet's device-plugin directory")
      ->capture_default_str();
  app.add_option("--pod-resources-socket", o.pod_resources_socket, "The kubelet's pod-resources socket")
      ->capture_default_str();
  app.add_option("--state-dir", o.state_dir, "Where containers' limits, regions and records live")
      ->capture_default_str();
  app.add_option("--hook-dir", o.hook_dir, "Host directory of libtessera-*.so (default: STATE_DIR/lib)");
  app.add_option("--dra-gpus", o.dra_gpus,
                 "GPUs for the DRA driver gpu.tessera.dev instead of the device plugin: \"all\" or indices "
                 "(6,7 or 4-7); see docs/dra.md (default: none, no DRA)");
  app.add_option("--kubelet-plugins-dir", o.kubelet_plugins_dir, "The kubelet's DRA plugin directory")
      ->capture_default_str();
  app.add_option("--kubelet-registry-dir", o.kubelet_registry_dir, "The kubelet's plugin registration directory")
      ->capture_default_str();
  app.add_option("--cdi-dir", o.cdi_dir, "Where the container runtime reads CDI specs (DRA claims' devices)")
      ->capture_default_str();
  app.add_option("--slots-per-gpu", o.slots_per_gpu, "tessera.dev/gpu devices advertised per physical GPU")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option(
         "--dra-fallback-after", o.dra_fallback_after,
         "Seconds a pod gated for DRA placement by tessera-scheduler waits, with tessera-scheduler's Lease "
         "unrenewed as long, before this agent hands it to kube-scheduler's allocator (0: off; docs/dra.md)")
      ->check(CLI::Range(0, 604800))
      ->capture_default_str();
  app.add_option("--dra-forgotten-claim-grace", o.dra_forgotten_claim_grace,
                 "Seconds a claim prepared here must look forgotten by the kubelet (its ResourceClaim gone from "
                 "the API server, no pod of it on the node, no process of it registered) before this agent "
                 "unprepares it itself (docs/dra.md)")
      ->check(CLI::Range(0, 604800))
      ->capture_default_str();
  app.add_option("--scheduler-lease", o.scheduler_lease,
                 "NAMESPACE/NAME of tessera-scheduler's Lease (its --leader-elect-namespace and "
                 "--leader-elect-lease)")
      ->capture_default_str();
  app.add_option("--metrics-listen", o.metrics_listen, "HOST:PORT of /metrics and /healthz (empty: off)")
      ->capture_default_str();
  app.add_flag("--device-nodes", o.device_nodes,
               "Also hand out /dev/nvidia* (container runtimes without the NVIDIA runtime)");
  app.add_flag("-v,--verbose", o.verbose, "Log what happens (to stderr); TESSERA_LOG=debug for more");
  CLI11_PARSE(app, argc, argv);
  log::Init("tessera-node", o.verbose ? log::Level::kInfo : log::Level::kWarn);
  if (!o.kubeconfig.empty() && !o.fake_api.empty()) return Fail("give --kubeconfig or --fake-api, not both");
  return Run(o);
}
