// The operators' page of tessera-scheduler (docs/page.md): a read-only view of who holds which GPU, on a
// listener of its own that is off unless --ui-listen is given.
//
//   PageServer page(cache, extender);
//   absl::Status st = page.Listen("127.0.0.1:9404");   // loopback only: anything else is refused
//   page.Serve();
//   ...
//   page.Stop();
//
// Routes:
//   GET /         one self-contained HTML page (its script and style are in the binary; it fetches nothing
//   else) GET /ui/data  the data the page draws, JSON (PageDataJson below; the page polls it every 2 s)
//
// Who can reach it: the listener binds loopback addresses only (127.0.0.0/8, ::1, localhost), so the page is
// reached from the scheduler's own host or pod, through `kubectl port-forward`, whose access the API server
// checks (RBAC on pods/portforward). There is no token check of its own; an address that is not loopback is
// refused at start with an error that says so (docs/security.md).
//
// Cost: each GET /ui/data copies the cache's state under its lock once (ClusterCache::PageSnapshot, as
// /inspect does) and serializes it with the lock released. The listener is a GuardedHttpServer with few
// threads, so no client can make it do more than that many serializations at once.
//
// Thread-safety: Listen, Serve and Stop from one thread; requests are served by the server's threads.
#ifndef TESSERA_SCHEDULER_PAGE_H_
#define TESSERA_SCHEDULER_PAGE_H_

#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <thread>

#include "absl/status/status.h"
#include "http/http_limits.h"
#include "scheduler/cluster_cache.h"
#include "scheduler/extender.h"

namespace tessera::http {
class GuardedHttpServer;
}

namespace tessera::scheduler {

// Where the page listens when --ui-listen is given without a port of its own choosing (docs/page.md).
inline constexpr std::string_view kDefaultPageListen = "127.0.0.1:9404";

// OK when `listen` (HOST:PORT) names a loopback address; otherwise InvalidArgument saying why the page serves
// loopback only and how to reach it (kubectl port-forward).
absl::Status CheckPageListen(std::string_view listen);

// GET /ui/data: the cluster as `view` holds it, and the pending pods, as JSON (format in docs/page.md). `now`
// stamps it and ages the pending pods.
std::string PageDataJson(const PageView& view, std::span<const PendingPod> pending,
                         std::chrono::system_clock::time_point now);

// GET /: the page (HTML with its script and style inline).
std::string_view PageHtml();

class PageServer {
 public:
  PageServer(const ClusterCache& cache, const Extender& extender);
  ~PageServer();

  // Binds `listen` (loopback only, CheckPageListen; port 0 picks a free one). Fails, serving nothing, on an
  // address that is not loopback or cannot be bound.
  absl::Status Listen(std::string_view listen);
  void Serve();
  void Stop();
  int port() const { return port_; }

  // Limits of the listener (guarded_server.h); the defaults but 8 threads and a 200 ms strict timeout. Set
  // before Listen.
  void SetLimits(const http::HttpLimits& limits) { limits_ = limits; }

  // What GET /ui/data answers now.
  std::string DataJson() const;

 private:
  const ClusterCache& cache_;
  const Extender& extender_;
  http::HttpLimits limits_;
  std::unique_ptr<http::GuardedHttpServer> http_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_PAGE_H_
