// tessera-scheduler's HTTP side: the extender verbs for kube-scheduler, health and metrics over HTTP, and the
// admission webhook over HTTPS (the API server calls webhooks only over TLS).
//
//   ExtenderServer server(extender, &admission, &cache);
//   absl::Status st = server.Start({.listen = "127.0.0.1:8888"});
//   ...
//   server.Stop();
//
// Routes (kube-scheduler's urlPrefix is http://HOST:PORT/scheduler):
//   POST /scheduler/filter, /scheduler/prioritize, /scheduler/bind, /scheduler/preempt
//   GET  /healthz, /readyz, /metrics (Prometheus text), /inspect (the cluster as the scheduler sees it, JSON)
//   POST /mutate, /validate on the webhook listener (HTTPS)
//
// Thread-safety: Start and Stop from one thread; requests are served by a pool of threads.
#ifndef TESSERA_SCHEDULER_HTTP_SERVER_H_
#define TESSERA_SCHEDULER_HTTP_SERVER_H_

#include <array>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "http/http_limits.h"
#include "http/listen.h"
#include "scheduler/admission.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"

namespace httplib {
class Server;
}

namespace tessera::scheduler {

struct ServerOptions {
  std::string listen = "0.0.0.0:8888";  // HOST:PORT; port 0 picks a free one
  int threads = 16;
  // The webhook, when webhook_listen is set: HTTPS with this certificate and key (PEM files).
  std::string webhook_listen;
  std::string tls_cert;
  std::string tls_key;
  // /metrics: the per-GPU and per-node series of the cluster as the cache holds it (docs/metrics.md). Off,
  // only the scheduler's own series are written (their number does not grow with the cluster).
  bool gpu_metrics = true;
};

// Latencies of one verb, in a fixed set of buckets (Prometheus histogram).
class LatencyHistogram {
 public:
  static constexpr std::array<double, 12> kBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                                     0.01,   0.025,   0.05,   0.1,   0.5,    1.0};
  void Record(double seconds);
  std::string Format(std::string_view name, std::string_view verb) const;

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> counts_{};
  std::atomic<uint64_t> total_micros_{0};
};

using http::HttpLimits;

// The limits both listeners start with: HttpLimits' defaults, but for the idle keep-alive timeout. Their
// clients are Go's HTTP transport (kube-apiserver calling the webhook, kube-scheduler calling the extender),
// which keeps an idle connection for 90 s (client-go's IdleConnTimeout) and never resends a POST it wrote
// onto a connection the server was closing at that moment: the call fails with EOF, and under failurePolicy
// Fail the pod is refused. Holding an idle connection longer than the client does means the client always
// closes it first.
HttpLimits ApiClientLimits();

using http::ParseListen;

class ExtenderServer {
 public:
  ExtenderServer(Extender& extender, const Admission* admission, ClusterCache& cache);
  ~ExtenderServer();

  // Binds and starts serving. Fails, serving nothing, when an address cannot be bound (one already in use
  // included: listening sockets are exclusive) or the TLS files cannot be read.
  absl::Status Start(const ServerOptions& options);
  // Start in two steps: Listen binds the addresses (connections wait in the backlog), Serve answers them. A
  // binary binds first so that a second instance on a used port fails before it touches anything else.
  absl::Status Listen(const ServerOptions& options);
  void Serve();
  void Stop();
  int port() const { return port_; }
  int webhook_port() const { return webhook_port_; }

  // Extra routes (the standalone mode adds its own).
  void AddPost(const std::string& path, std::function<Response(std::string_view)> handler);
  // GET /readyz answers 200 while `ready` says so, else 503 (with API mode: synced, and the leader). Set
  // before Start.
  void SetReadiness(std::function<bool()> ready) { ready_ = std::move(ready); }
  // GET /metrics's tessera_scheduler_leader: 1 while `leader` says so, else 0 (unset: always 1, as for a
  // single replica). Set before Start.
  void SetLeader(std::function<bool()> leader) { leader_ = std::move(leader); }
  // /metrics with (the default) or without the per-GPU and per-node series of the cluster as the cache holds it
  // (docs/metrics.md). Without, only the scheduler's own series are written, whose number does not grow with
  // the cluster. Set before Start.
  void SetGpuMetrics(bool on) { gpu_metrics_ = on; }
  // What GET /metrics answers (Prometheus text, docs/metrics.md).
  std::string MetricsText() const;
  // Per-request deadlines, idle keep-alive, slow connections per peer and in all, open connections and the
  // body size (http/guarded_server.h); the defaults otherwise (threads: ServerOptions::threads). The
  // webhook's HTTPS listener gets the body size and httplib's per-read timeouts only. Set before Start.
  void SetLimits(const HttpLimits& limits) { limits_ = limits; }

 private:
  Extender& extender_;
  const Admission* admission_;
  ClusterCache& cache_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<httplib::Server> https_;
  std::thread http_thread_;
  std::thread https_thread_;
  int port_ = 0;
  int webhook_port_ = 0;
  std::array<LatencyHistogram, 4> latency_;  // filter, prioritize, bind, preempt
  std::vector<std::pair<std::string, std::function<Response(std::string_view)>>> extra_;
  std::function<bool()> ready_;
  std::function<bool()> leader_;
  bool gpu_metrics_ = true;
  HttpLimits limits_ = ApiClientLimits();
};

// The cluster as the cache holds it, as JSON: per node and GPU, model, memory, share and memory committed,
// tenants (pod, container, share, memory limit). What `tessera inspect` prints.
// `pod_names` (pod UID -> "namespace/name") adds each tenant's pod name.
std::string InspectJson(const core::Cluster& cluster,
                        const std::map<std::string, std::string>& pod_names = {});

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_HTTP_SERVER_H_
