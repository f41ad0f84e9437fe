// tessera-scheduler: the kube-scheduler extender (filter, prioritize, bind, preempt) and the admission
// webhook. See docs/scheduler.md.
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <iostream>

#include "common/log.h"
#include "core/placement/policy.h"
#include "core/strings.h"
#include "k8s/config.h"
#include "k8s/kube_api.h"
#include "scheduler/admission.h"
#include "scheduler/api_backend.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/dra_controller.h"
#include "scheduler/dra_conversion.h"
#include "scheduler/extender.h"
#include "scheduler/housekeeping.h"
#include "scheduler/http_server.h"
#include "scheduler/page.h"
#include "scheduler/quota_file.h"
#include "scheduler/standalone.h"

namespace {

using namespace tessera;

struct Options {
  std::string cluster_file;
  std::string quota_file;
  std::string kubeconfig;
  std::string context;
  bool in_cluster = false;
  std::string lease_name;
  std::string lease_namespace = "tessera-system";
  std::string identity;
  int heartbeat_timeout_s = 60;
  int sync_timeout_s = 60;
  std::string listen = "0.0.0.0:8888";
  std::string policy = "tessera";
  std::string scheduler_name = "tessera-scheduler";
  std::string webhook_listen;
  std::string tls_cert;
  std::string tls_key;
  std::string default_memory = "proportional";
  std::string gpushare_unit = "GiB";
  std::string hami_names;
  std::string hami_no_core_limit = "elastic";
  int threads = 16;
  bool gpu_metrics = true;
  bool ui = false;
  bool dra_placement = true;
  std::string dra_classes = "gpu.tessera.dev,gpu-elastic.tessera.dev";
  int dra_rebind_after = 30;
  std::string extended_to_dra = "auto";
  uint64_t seed = 0;
  std::string ui_listen;
  bool verbose = false;
};

int Fail(const std::string& message) {
  std::cerr << "tessera-scheduler: " << message << "\n";
  return 2;
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "tessera-scheduler";
  return name;
}

int Run(const Options& o) {
  std::vector<std::string> names = core::PolicyNames();
  if (std::find(names.begin(), names.end(), o.policy) == names.end()) {
    return Fail(StrCat("unknown policy \"", o.policy, "\"; choose one of: ", StrJoin(names, ", ")));
  }
  scheduler::CacheOptions cache_options;
  cache_options.policy = o.policy;
  if (o.default_memory == "whole") {
    cache_options.placement.default_memory = core::PlacementOptions::DefaultMemory::kWholeGpuMemory;
  } else if (o.default_memory != "proportional") {
    return Fail("--default-memory must be proportional or whole");
  }
  if (o.gpushare_unit == "MiB") {
    cache_options.parse.gpushare_memory_unit = core::MiB(1);
  } else if (o.gpushare_unit != "GiB") {
    return Fail("--gpushare-memory-unit must be GiB or MiB");
  }
  if (absl::Status s = core::ParseHamiNames(o.hami_names, &cache_options.parse.hami); !s.ok()) {
    return Fail(StrCat("--hami-resource-names: ", Message(s)));
  }
  if (o.hami_no_core_limit == "proportional") {
    cache_options.parse.hami_no_core_limit = core::NoCoreLimit::kProportional;
  } else if (o.hami_no_core_limit != "elastic") {
    return Fail("--hami-no-core-limit must be elastic (HAMi's meaning kept) or proportional (Tessera's)");
  }
  absl::StatusOr<scheduler::ExtendedToDra> extended_to_dra = scheduler::ParseExtendedToDra(o.extended_to_dra);
  if (!extended_to_dra.ok()) return Fail(Message(extended_to_dra.status()));
  scheduler::ClusterCache cache(cache_options);
  if (!o.cluster_file.empty() && (!o.kubeconfig.empty() || o.in_cluster)) {
    return Fail(
        "give either --cluster-file (standalone) or --kubeconfig / --in-cluster (a cluster), not both");
  }

  // Standalone: nodes from a file, binds in memory. Otherwise: a cluster through its API server.
  scheduler::StandaloneBinder standalone;
  std::unique_ptr<k8s::KubeApi> api;
  // The webhook's own client: it waits on it while the API server waits on the webhook (timeoutSeconds 5).
  std::unique_ptr<k8s::KubeApi> webhook_api;
  std::unique_ptr<scheduler::ApiBackend> backend;
  scheduler::Binder* binder = &standalone;
  scheduler::PodSource* pods = nullptr;
  std::string mode;
  std::string api_server;
  std::string backend_identity;
  if (!o.cluster_file.empty()) {
    if (absl::Status st = scheduler::LoadClusterFile(cache, o.cluster_file); !st.ok())
      return Fail(Message(st));
    mode = StrCat("standalone: ", cache.node_count(), " nodes from ", o.cluster_file);
  } else {
    absl::StatusOr<k8s::ClientConfig> config =
        o.in_cluster ? k8s::LoadInClusterConfig()
        : o.kubeconfig.empty() && k8s::InCluster()
            ? k8s::LoadInClusterConfig()
            : k8s::LoadKubeconfig({.paths = o.kubeconfig, .context = o.context});
    if (!config.ok()) {
      return Fail(StrCat(Message(config.status()),
                         " (or run with --cluster-file FILE for the standalone mode, e.g. "
                         "examples/cluster-small.yaml)"));
    }
    config->user_agent = "tessera-scheduler";
    absl::StatusOr<std::unique_ptr<k8s::KubeApi>> made = k8s::NewKubeApi(*config);
    if (!made.ok()) return Fail(Message(made.status()));
    api = *std::move(made);
    k8s::ClientConfig short_config = *config;
    short_config.connect_timeout = std::chrono::milliseconds(1000);
    short_config.request_timeout = std::chrono::milliseconds(2000);
    short_config.max_retries = 0;
    made = k8s::NewKubeApi(short_config);
    if (!made.ok()) return Fail(Message(made.status()));
    webhook_api = *std::move(made);
    scheduler::ApiBackendOptions backend_options;
    backend_options.sync.heartbeat_timeout = std::chrono::seconds(o.heartbeat_timeout_s);
    backend_options.sync_timeout = std::chrono::seconds(o.sync_timeout_s);
    backend_options.lease_name = o.lease_name;
    backend_options.lease_namespace = o.lease_namespace;
    backend_options.identity = o.identity.empty() ? HostName() : o.identity;
    backend_identity = backend_options.identity;
    backend = std::make_unique<scheduler::ApiBackend>(*api, cache, backend_options);
    binder = backend.get();
    pods = backend.get();
    api_server = config->server;
  }

  // The operators' page (docs/page.md), off unless asked for: the extender keeps its pending pods only then.
  std::string ui_listen = o.ui_listen;
  if (ui_listen.empty() && o.ui) ui_listen = scheduler::kDefaultPageListen;
  scheduler::ExtenderOptions extender_options;
  if (!ui_listen.empty()) extender_options.pending_pods = scheduler::kPagePendingPods;
  scheduler::Extender extender(cache, *binder, pods, cache_options.parse, extender_options);
  // DRA placement by Tessera (docs/dra.md): on a cluster, unless turned off.
  std::unique_ptr<scheduler::DraController> dra;
  scheduler::CacheQuotaExchange dra_quotas(cache);  // one quota for both paths
  if (backend != nullptr && o.dra_placement) {
    scheduler::DraControllerOptions dra_options;
    dra_options.allocator.policy = o.policy;
    dra_options.allocator.seed = o.seed;
    dra_options.allocator.classes.clear();
    for (std::string_view c : StrSplit(o.dra_classes, ',')) {
      if (!c.empty()) dra_options.allocator.classes.insert(std::string(c));
    }
    dra_options.identity = backend_identity;
    dra_options.rebind_after = std::chrono::seconds(o.dra_rebind_after);
    dra_options.quotas = &dra_quotas;
    if (!o.lease_name.empty()) dra_options.leading_term = [&] { return backend->LeadingTerm(); };
    dra = std::make_unique<scheduler::DraController>(*api, dra_options, [&] { return backend->IsLeader(); });
    backend->SetDra(dra.get());
  }
  scheduler::Admission admission({o.scheduler_name, cache_options.parse});
  if (dra != nullptr)
    admission.SetDraGate([&dra](const nlohmann::json& pod) { return dra->ShouldGate(pod); });
  // Extended resources on DRA GPUs (docs/dra.md): the offer from the nodes and the driver's slices.
  std::unique_ptr<scheduler::DraOfferTracker> offer;
  std::unique_ptr<scheduler::ClaimTemplateMaker> template_maker;
  if (backend != nullptr && *extended_to_dra != scheduler::ExtendedToDra::kNever) {
    offer = std::make_unique<scheduler::DraOfferTracker>(
        [&dra] {
          return dra != nullptr ? dra->TesseraSlices() : std::vector<std::shared_ptr<const k8s::Json>>{};
        },
        std::chrono::seconds(o.heartbeat_timeout_s));
    backend->SetNodeObserver([&offer](const k8s::Json& node, bool deleted) {
      if (deleted) {
        offer->OnNodeDeleted(node);
      } else {
        offer->OnNode(node);
      }
    });
    template_maker = std::make_unique<scheduler::ClaimTemplateMaker>(*webhook_api);
    admission.SetDraConversion(
        {.mode = *extended_to_dra,
         .offer = [&offer] { return offer->Offer(); },
         .ensure = [&template_maker](
                       std::string_view ns,
                       const scheduler::ClaimTemplate& t) { return template_maker->Ensure(ns, t); }});
  }
  scheduler::ExtenderServer server(extender, &admission, cache);
  if (backend == nullptr) {
    server.AddPost("/standalone/release", [&](std::string_view body) {
      return scheduler::ReleaseStandalone(cache, standalone, body);
    });
  }
  server.SetReadiness([&] { return backend == nullptr || backend->Ready(); });
  // Standalone, this process is the only one that binds; on a cluster, the Lease's holder (always, without
  // leader election).
  server.SetLeader([&] { return backend == nullptr || backend->IsLeader(); });
  server.SetGpuMetrics(o.gpu_metrics);

  // Block the stop signals here so that every thread inherits the mask; the main thread waits for them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  scheduler::ServerOptions server_options;
  server_options.listen = o.listen;
  server_options.threads = o.threads;
  server_options.webhook_listen = o.webhook_listen;
  server_options.tls_cert = o.tls_cert;
  server_options.tls_key = o.tls_key;
  // Bind before anything else starts: a second instance on a port in use must stop here, before it joins the
  // leader election or loads the API.
  if (absl::Status st = server.Listen(server_options); !st.ok()) return Fail(Message(st));
  // The operators' page, on a listener of its own, loopback only.
  std::unique_ptr<scheduler::PageServer> page;
  if (!ui_listen.empty()) {
    page = std::make_unique<scheduler::PageServer>(cache, extender);
    if (absl::Status st = page->Listen(ui_listen); !st.ok()) return Fail(Message(st));
  }
  // GPU quotas per namespace and model (replacing a cluster file's), followed while the file changes.
  std::unique_ptr<scheduler::QuotaFile> quotas;
  if (!o.quota_file.empty()) {
    quotas = std::make_unique<scheduler::QuotaFile>(o.quota_file, &cache);
    if (absl::Status st = quotas->Load(); !st.ok()) return Fail(StrCat("--quota-file: ", Message(st)));
    quotas->Start();
  }
  if (dra != nullptr) dra->Start();
  if (backend != nullptr) {
    if (absl::Status st = backend->Start(); !st.ok()) return Fail(Message(st));
    mode = StrCat("API server ", api_server, ": ", cache.node_count(), " GPU nodes, ", cache.pod_count(),
                  " pods holding GPUs", o.lease_name.empty() ? "" : ", leader election on");
  }
  server.Serve();
  if (page != nullptr) page->Serve();
  std::cout << "tessera-scheduler: extender at http://" << scheduler::ParseListen(o.listen)->first << ":"
            << server.port() << "/scheduler (" << mode << "; policy " << cache.policy_name() << ")";
  if (server.webhook_port() > 0) std::cout << "; webhook at https://...:" << server.webhook_port();
  if (page != nullptr) {
    std::cout << "; page at http://" << scheduler::ParseListen(ui_listen)->first << ":" << page->port()
              << "/";
  }
  std::cout << std::endl;

  scheduler::Housekeeping housekeeping(cache, extender, backend.get());
  housekeeping.Start();
  int sig = 0;
  sigwait(&signals, &sig);
  log::Info("stopping", {{"signal", std::to_string(sig)}});
  housekeeping.Stop();
  if (page != nullptr) page->Stop();
  server.Stop();
  if (backend != nullptr) backend->Stop();
  if (dra != nullptr) dra->Stop();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "tessera-scheduler: the kube-scheduler extender (filter, prioritize, bind, preempt at "
      "/scheduler/<verb>) "
      "and admission webhook of Tessera. See docs/scheduler.md."};
  Options o;
  app.add_option(
         "--cluster-file", o.cluster_file,
         "Standalone mode: nodes and GPUs from this cluster file (YAML/JSON, docs/file-formats.md), no "
         "API server")
      ->check(CLI::ExistingFile);
  app.add_option("--quota-file", o.quota_file,
                 "GPU quotas per namespace and model (kind: GpuQuotas, docs/scheduler.md), read again when the "
                 "file changes")
      ->check(CLI::ExistingFile);
  app.add_option("--kubeconfig", o.kubeconfig,
                 "Kubeconfig of the cluster (default: in a pod its service account, else $KUBECONFIG or "
                 "~/.kube/config)");
  app.add_option("--context", o.context, "Kubeconfig context (default: its current-context)");
  app.add_flag("--in-cluster", o.in_cluster, "Use the pod's service account (the default when run in a pod)");
  app.add_option("--leader-elect-lease", o.lease_name,
                 "Run several replicas: the one holding this Lease binds (empty: no leader election)");
  app.add_option("--leader-elect-namespace", o.lease_namespace, "Namespace of the Lease")
      ->capture_default_str();
  app.add_option("--identity", o.identity, "This replica's name in the Lease (default: the host name)");
  app.add_option("--heartbeat-timeout", o.heartbeat_timeout_s,
                 "Seconds without a node agent heartbeat after which a node gets no new GPU pods")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--sync-timeout", o.sync_timeout_s, "Seconds to wait for the first list of nodes and pods")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--listen", o.listen,
                 "HOST:PORT of the extender (kube-scheduler's urlPrefix is http://HOST:PORT/scheduler)")
      ->capture_default_str();
  app.add_option("--policy", o.policy,
                 "Placement policy: " + tessera::StrJoin(tessera::core::PolicyNames(), ", "))
      ->capture_default_str();
  app.add_option("--scheduler-name", o.scheduler_name,
                 "schedulerName the webhook sets on GPU pods (empty: leave it alone)")
      ->capture_default_str();
  app.add_option("--webhook-listen", o.webhook_listen,
                 "HOST:PORT of the admission webhook (HTTPS); off when empty");
  app.add_option("--tls-cert", o.tls_cert, "Webhook certificate (PEM)");
  app.add_option("--tls-key", o.tls_key, "Webhook private key (PEM)");
  app.add_option("--default-memory", o.default_memory,
                 "Memory of a vGPU that asks for none: proportional (to its cores) or whole")
      ->capture_default_str();
  app.add_option("--gpushare-memory-unit", o.gpushare_unit, "Unit of aliyun.com/gpu-mem: GiB or MiB")
      ->capture_default_str();
  app.add_option("--hami-resource-names", o.hami_names,
                 "HAMi's resource names where its chart renamed them: gpu=NAME,cores=NAME,memory=NAME,"
                 "memory-percentage=NAME,priority=NAME (any of them; the rest keep nvidia.com/* names)");
  app.add_option("--hami-no-core-limit", o.hami_no_core_limit,
                 "A HAMi or Volcano request without gpucores (or 0): elastic (HAMi's meaning: idle compute may "
                 "be used) or proportional (Tessera's: a hard share in proportion to memory)")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "HTTP worker threads")->capture_default_str();
  app.add_flag(
         "--gpu-metrics,!--no-gpu-metrics", o.gpu_metrics,
         "Per-GPU and per-node series on /metrics (one per GPU of the cluster and family; docs/metrics.md)")
      ->capture_default_str();
  app.add_flag(
      "--ui", o.ui,
      std::string("Serve the operators' page (read-only: who holds which GPU, pending pods) at http://") +
          std::string(tessera::scheduler::kDefaultPageListen) + "/ (docs/page.md)");
  app.add_option(
      "--ui-listen", o.ui_listen,
      "HOST:PORT of the operators' page (implies --ui); loopback addresses only, as the page has no "
      "authentication of its own: reach it with kubectl port-forward");
  app.add_flag(
         "--dra-placement,!--no-dra-placement", o.dra_placement,
         "Place the ResourceClaims of Tessera's device classes (the webhook's /mutate-dra gates their pods; "
         "docs/dra.md, \"Placement by Tessera\")")
      ->capture_default_str();
  app.add_option("--dra-classes", o.dra_classes,
                 "DeviceClasses whose claims Tessera places, comma-separated (deploy/dra/deviceclasses.yaml)")
      ->capture_default_str();
  app.add_option(
         "--dra-rebind-after", o.dra_rebind_after,
         "Seconds kube-scheduler may refuse to bind a pod whose claims Tessera placed before they are "
         "deallocated and placed again on another node; a node gone or full: at once; 0: never "
         "(docs/dra.md, \"When the pod cannot bind\")")
      ->check(CLI::Range(0, 86400))
      ->capture_default_str();
  app.add_option(
         "--extended-resources-to-dra", o.extended_to_dra,
         "Pods that ask for GPUs with extended resources get ResourceClaims of the same meaning instead: "
         "auto (when no node offers tessera.dev/gpu and Tessera's driver publishes GPUs), always, or "
         "never (docs/dra.md, \"Extended resources on DRA GPUs\")")
      ->capture_default_str();
  app.add_option("--seed", o.seed,
                 "Seed of the DRA placement's ties between equal nodes (one seed, one placement)")
      ->capture_default_str();
  app.add_flag("-v,--verbose", o.verbose, "Log what happens (to stderr); TESSERA_LOG=debug for more");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  tessera::log::Init("tessera-scheduler",
                     o.verbose ? tessera::log::Level::kInfo : tessera::log::Level::kWarn);
  return Run(o);
}
