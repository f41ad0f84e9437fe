#include "scheduler/http_server.h"

#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <fstream>

#include "common/exposition.h"
#include "common/log.h"
#include "core/strings.h"
#include "formats/bounded_json.h"
#include "http/guarded_server.h"
#include "httplib.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {

using nlohmann::json;

namespace {

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

void LatencyHistogram::Record(double seconds) {
  size_t b = 0;
  while (b < kBounds.size() && seconds > kBounds[b]) ++b;
  counts_[b].fetch_add(1, std::memory_order_relaxed);
  total_micros_.fetch_add(static_cast<uint64_t>(seconds * 1e6), std::memory_order_relaxed);
}

std::string LatencyHistogram::Format(std::string_view name, std::string_view verb) const {
  std::string out;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < counts_.size(); ++b) {
    cumulative += counts_[b].load(std::memory_order_relaxed);
    // The bound as written in kBounds ("0.00025", "1"): a rounded label would name another bucket.
    const std::string le = b < kBounds.size() ? exposition::FormatValue(kBounds[b]) : "+Inf";
    StrAppend(&out, name, "_bucket{verb=\"", verb, "\",le=\"", le, "\"} ", cumulative, "\n");
  }
  StrAppend(&out, name, "_sum{verb=\"", verb, "\"} ",
            Fixed(static_cast<double>(total_micros_.load(std::memory_order_relaxed)) / 1e6, 6), "\n");
  StrAppend(&out, name, "_count{verb=\"", verb, "\"} ", cumulative, "\n");
  return out;
}

std::string InspectJson(const core::Cluster& cluster, const std::map<std::string, std::string>& pod_names) {
  json nodes = json::array();
  for (const core::NodeState& n : cluster.nodes()) {
    json gpus = json::array();
    for (int g = 0; g < n.gpu_count(); ++g) {
      const core::GpuInfo& info = n.gpu(g);
      json tenants = json::array();
      for (const core::Tenant& t : n.tenants(g)) {
        auto name = pod_names.find(t.id.pod.value());
        tenants.push_back({{"podUID", t.id.pod.value()},
                           {"pod", name != pod_names.end() ? name->second : ""},
                           {"namespace", t.ns.value()},
                           {"container", t.id.container},
                           {"cores", static_cast<double>(t.cores.value()) / 10.0},
                           {"requestedCores", static_cast<double>(t.requested.value()) / 10.0},
                           {"memoryMiB", t.memory_limit.value()},
                           {"priority", core::ToString(t.priority)}});
      }
      gpus.push_back({{"index", g},
                      {"uuid", info.uuid.value()},
                      {"model", info.model},
                      {"memoryMiB", info.memory.value()},
                      {"health", core::ToString(info.health)},
                      {"coresUsed", static_cast<double>((core::kWholeGpu - n.free_cores(g)).value()) / 10.0},
                      {"memoryUsedMiB", (info.memory - n.free_memory(g)).value()},
                      {"tenants", std::move(tenants)}});
    }
    nodes.push_back(
        {{"name", n.name().value()}, {"schedulable", n.schedulable()}, {"gpus", std::move(gpus)}});
  }
  return formats::DumpJson(json{{"nodes", std::move(nodes)}});
}

ExtenderServer::ExtenderServer(Extender& extender, const Admission* admission, ClusterCache& cache)
    : extender_(extender), admission_(admission), cache_(cache) {}

ExtenderServer::~ExtenderServer() {
  Stop();
}

void ExtenderServer::AddPost(const std::string& path, std::function<Response(std::string_view)> handler) {
  extra_.emplace_back(path, std::move(handler));
}

namespace {

// cpp-httplib's default socket options add SO_REUSEPORT, which lets a second server bind a port that is already
// in use: both then listen and the kernel spreads connections between them. Only SO_REUSEADDR (a restart may
// bind while the old socket is in TIME_WAIT), so that a second instance fails to start with a clear error.
void ExclusiveListenSocket(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

void Send(httplib::Response& res, const Response& r) {
  res.status = r.status;
  res.set_content(r.body, "application/json");
}

}  // namespace

absl::Status ExtenderServer::Start(const ServerOptions& options) {
  if (absl::Status st = Listen(options); !st.ok()) return st;
  Serve();
  return absl::OkStatus();
}

HttpLimits ApiClientLimits() {
  HttpLimits limits;
  limits.idle_timeout = std::chrono::seconds(120);  // > client-go's 90 s
  return limits;
}

absl::Status ExtenderServer::Listen(const ServerOptions& options) {
  absl::StatusOr<std::pair<std::string, int>> listen = ParseListen(options.listen);
  if (!listen.ok()) return listen.status();
  const int threads = std::max(2, options.threads);
  HttpLimits limits = limits_;
  limits.threads = static_cast<size_t>(threads);
  auto guarded = std::make_unique<http::GuardedHttpServer>(limits);
  http::GuardedHttpServer* extender_http = guarded.get();
  // Every handler through Guard(): time in a handler is not time waiting on the client.
  auto guard = [server = guarded.get()](httplib::Server::Handler h) { return server->Guard(std::move(h)); };
  http_ = std::move(guarded);
  // Small answers must leave at once: without TCP_NODELAY, Nagle's algorithm and the peer's delayed ACK add
  // up to 40 ms to a reply that follows a large request body.
  http_->set_tcp_nodelay(true);
  http_->set_socket_options(ExclusiveListenSocket);
  struct Verb {
    const char* path;
    Response (Extender::*handler)(std::string_view);
  };
  const std::array<Verb, 4> verbs = {{{"/scheduler/filter", &Extender::Filter},
                                      {"/scheduler/prioritize", &Extender::Prioritize},
                                      {"/scheduler/bind", &Extender::Bind},
                                      {"/scheduler/preempt", &Extender::Preempt}}};
  for (size_t i = 0; i < verbs.size(); ++i) {
    const Verb v = verbs[i];
    LatencyHistogram* latency = &latency_[i];
    http_->Post(v.path, guard([this, v, latency](const httplib::Request& req, httplib::Response& res) {
      const auto start = std::chrono::steady_clock::now();
      Send(res, (extender_.*v.handler)(req.body));
      latency->Record(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (res.status != 200)
        log::Warn("bad request", {{"path", v.path}, {"status", std::to_string(res.status)}});
    }));
  }
  for (const auto& [path, handler] : extra_) {
    auto h = handler;
    http_->Post(path,
                guard([h](const httplib::Request& req, httplib::Response& res) { Send(res, h(req.body)); }));
  }
  http_->Get("/readyz", guard([this](const httplib::Request&, httplib::Response& res) {
    const bool ready = !ready_ || ready_();
    res.status = ready ? 200 : 503;
    res.set_content(ready ? "ok\n" : "not ready: still listing the cluster, or not the leader\n",
                    "text/plain");
  }));
  http_->Get("/healthz", guard([](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  }));
  http_->Get("/inspect", guard([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(InspectJson(cache_.Snapshot(), cache_.PodNames()), "application/json");
  }));
  http_->Get("/metrics", guard([this](const httplib::Request&, httplib::Response& res) {
    res.set_content(MetricsText(), "text/plain; version=0.0.4");
  }));
  absl::StatusOr<int> port = extender_http->BindAndListen(listen->first, listen->second);
  if (!port.ok()) return port.status();
  port_ = *port;

  if (!options.webhook_listen.empty()) {
    absl::StatusOr<std::pair<std::string, int>> hook = ParseListen(options.webhook_listen);
    if (!hook.ok()) return hook.status();
    for (const std::string& f : {options.tls_cert, options.tls_key}) {
      if (f.empty() || !std::ifstream(f).good()) {
        return absl::InvalidArgumentError(
            StrCat("the webhook needs --tls-cert and --tls-key (PEM files); cannot read \"", f, "\""));
      }
    }
    auto tls = std::make_unique<http::WideBacklog<httplib::SSLServer>>(options.tls_cert.c_str(),
                                                                       options.tls_key.c_str());
    http::WideBacklog<httplib::SSLServer>* webhook_https = tls.get();
    https_ = std::move(tls);
    https_->set_tcp_nodelay(true);
    https_->set_socket_options(ExclusiveListenSocket);
    https_->set_payload_max_length(limits_.max_body_bytes);
    https_->set_read_timeout(std::chrono::duration_cast<std::chrono::seconds>(limits_.idle_timeout).count());
    https_->set_keep_alive_timeout(
        std::chrono::duration_cast<std::chrono::seconds>(limits_.idle_timeout).count());
    // httplib closes a connection after 5 requests by default: the API server then made a new TLS handshake
    // every few pod creations, which halved the creation rate (bench/cluster_scale.py). An idle keep-alive
    // connection holds one of the pool's threads until idle_timeout, hence a pool as large as the extender's.
    https_->set_keep_alive_max_count(limits_.keep_alive_requests);
    // Each API server keeps up to 25 idle connections to a webhook (client-go's MaxIdleConnsPerHost), each
    // holding a thread here until the API server closes it: room for three API servers' worth of them beside
    // the pool's own.
    const size_t webhook_threads = static_cast<size_t>(threads) + 3 * 25;
    https_->new_task_queue = [webhook_threads] { return new httplib::ThreadPool(webhook_threads); };
    if (!https_->is_valid()) {
      return absl::InvalidArgumentError(StrCat("cannot use ", options.tls_cert, " and ", options.tls_key,
                                               " as the webhook's certificate and key (PEM)"));
    }
    // The parsed review is freed when the handler returns: give a large one's memory back (the guarded
    // server does the same for the extender's requests).
    const size_t trim_after = limits_.trim_after_bytes;
    https_->Post("/mutate", [this, trim_after](const httplib::Request& req, httplib::Response& res) {
      Send(res, admission_->Mutate(req.body));
      if (req.body.size() >= trim_after) malloc_trim(0);
    });
    https_->Post("/mutate-dra", [this, trim_after](const httplib::Request& req, httplib::Response& res) {
      Send(res, admission_->MutateDra(req.body));
      if (req.body.size() >= trim_after) malloc_trim(0);
    });
    https_->Post("/validate", [this, trim_after](const httplib::Request& req, httplib::Response& res) {
      Send(res, admission_->Validate(req.body));
      if (req.body.size() >= trim_after) malloc_trim(0);
    });
    https_->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    absl::StatusOr<int> hook_port = webhook_https->BindAndListen(hook->first, hook->second);
    if (!hook_port.ok()) return hook_port.status();
    webhook_port_ = *hook_port;
  }
  return absl::OkStatus();
}

void ExtenderServer::Serve() {
  if (https_) https_thread_ = std::thread([this] { https_->listen_after_bind(); });
  http_thread_ = std::thread([this] { http_->listen_after_bind(); });
}

void ExtenderServer::Stop() {
  if (http_) http_->stop();
  if (https_) https_->stop();
  if (http_thread_.joinable()) http_thread_.join();
  if (https_thread_.joinable()) https_thread_.join();
}

}  // namespace tessera::scheduler
