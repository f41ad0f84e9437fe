// tessera-scheduler: the kube-scheduler extender (filter, prioritize, bind, preempt) and the admission
// webhook. See docs/scheduler.md.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <iostream>
#include <thread>

#include "common/files.h"
#include "common/log.h"
#include "core/placement/policy.h"
#include "core/strings.h"
#include "formats/cluster_file.h"
#include "scheduler/admission.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"
#include "scheduler/http_server.h"
#include "scheduler/standalone.h"

namespace {

using namespace tessera;

struct Options {
  std::string cluster_file;
  std::string listen = "0.0.0.0:8888";
  std::string policy = "tessera";
  std::string scheduler_name = "tessera-scheduler";
  std::string webhook_listen;
  std::string tls_cert;
  std::string tls_key;
  std::string default_memory = "proportional";
  std::string gpushare_unit = "GiB";
  int threads = 16;
  bool verbose = false;
};

int Fail(const std::string& message) {
  std::cerr << "tessera-scheduler: " << message << "\n";
  return 2;
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
  scheduler::ClusterCache cache(cache_options);

  if (o.cluster_file.empty()) {
    return Fail("give --cluster-file FILE (standalone mode; e.g. examples/cluster-small.yaml)");
  }
  absl::StatusOr<std::string> text = ReadTextFile(o.cluster_file);
  if (!text.ok()) return Fail(Message(text.status()));
  absl::StatusOr<formats::ClusterFile> file = formats::ParseClusterFile(*text, o.cluster_file);
  if (!file.ok()) return Fail(Message(file.status()));
  for (core::NodeInfo& node : file->nodes) {
    if (absl::Status st = cache.UpsertNode(std::move(node)); !st.ok()) return Fail(Message(st));
  }
  for (const formats::QuotaEntry& q : file->quotas) cache.SetQuota(q.ns, q.model, q.limit);

  scheduler::StandaloneBinder binder;
  scheduler::Extender extender(cache, binder, nullptr, cache_options.parse);
  scheduler::Admission admission({o.scheduler_name, cache_options.parse});
  scheduler::ExtenderServer server(extender, &admission, cache);
  server.AddPost("/standalone/release",
                 [&](std::string_view body) { return scheduler::ReleaseStandalone(cache, binder, body); });

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
  if (absl::Status st = server.Start(server_options); !st.ok()) return Fail(Message(st));
  std::cout << "tessera-scheduler: extender at http://" << scheduler::ParseListen(o.listen)->first << ":"
            << server.port() << "/scheduler (standalone: " << cache.node_count() << " nodes from "
            << o.cluster_file << ", policy " << cache.policy_name() << ")";
  if (server.webhook_port() > 0) std::cout << "; webhook at https://...:" << server.webhook_port();
  std::cout << std::endl;

  std::atomic<bool> stop{false};
  std::thread housekeeping([&] {
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      if (int n = cache.ExpireReservations(std::chrono::seconds(60)); n > 0) {
        log::Warn("released reservations whose bind never finished", {{"count", std::to_string(n)}});
      }
      for (const std::string& f : extender.SyncChangedShares())
        log::Warn("share update failed", {{"pod", f}});
    }
  });
  int sig = 0;
  sigwait(&signals, &sig);
  log::Info("stopping", {{"signal", std::to_string(sig)}});
  stop = true;
  housekeeping.join();
  server.Stop();
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
  app.add_option("--threads", o.threads, "HTTP worker threads")->capture_default_str();
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
