// An httplib::Server that slow, idle or numerous clients cannot starve: tessera-scheduler's extender and
// tessera-node's metrics and health port.
//
// cpp-httplib serves each connection on one pool thread for the connection's whole life, and its read
// timeout is per read: a client that sends a header byte every few seconds keeps a thread forever, and
// sixteen such clients stopped every request, /healthz included (twenty did the same to tessera-node, whose
// liveness probe then restarted it). GuardedHttpServer serves connections with its own keep-alive loop over a
// stream whose reads share one deadline per request:
//   - a request (head and body) must arrive within `request_timeout` of its first byte;
//   - an idle keep-alive connection is closed after `idle_timeout`;
//   - a new connection gets the strict timeout, `strict_timeout` for a request and no keep-alive, when its
//     peer (IP address) has `max_slow_per_peer` connections waiting already (for a request to arrive or to
//     finish arriving), or when half the threads wait on clients already, whoever the clients are: so one
//     host holds at most that many threads for long, and all hosts together at most half of them;
//   - at most `max_connections` connections are open (queued or served); more are answered 503 and closed;
//   - bodies above `max_body_bytes` are refused (413) before they are read (httplib's payload limit);
//   - it listens with the system's maximum backlog (listen.h), so bursts are queued rather than reset.
// Handlers must be registered through Guard() so that time spent in them is not counted as waiting.
//
//   auto server = std::make_unique<GuardedHttpServer>(HttpLimits{});
//   server->Get("/healthz", server->Guard([](const httplib::Request&, httplib::Response& res) { ... }));
//   absl::StatusOr<int> port = server->BindAndListen("0.0.0.0", 9402);
//   std::thread serving([&] { server->listen_after_bind(); });
//
// Thread-safety: as httplib::Server; the accounting is internally synchronized. Its threads are its own
// (HttpLimits::threads): do not set new_task_queue.
#ifndef TESSERA_HTTP_GUARDED_SERVER_H_
#define TESSERA_HTTP_GUARDED_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "http/http_limits.h"
#include "http/listen.h"
#include "httplib.h"

namespace tessera::http {

class GuardedHttpServer : public WideBacklog<httplib::Server> {
 public:
  explicit GuardedHttpServer(HttpLimits limits);

  // Wraps a handler: while it runs, its connection does not count as waiting on the peer.
  Handler Guard(Handler handler);

  // Connections of `peer` waiting on it now, and of all peers (for tests).
  size_t waiting(const std::string& peer) const;
  size_t waiting() const;
  // Connections answered 503 for want of room (max_connections) since the start.
  uint64_t shed() const { return shed_.load(std::memory_order_relaxed); }

 private:
  class ConnectionQueue;

  bool process_and_close_socket(socket_t sock) override;
  void SetWaiting(const std::string& peer, bool* waiting, bool now);

  const HttpLimits limits_;
  const size_t slow_budget_;     // connections waiting under the long timeouts, all peers together
  std::atomic<size_t> open_{0};  // connections queued or being served
  std::atomic<uint64_t> shed_{0};
  mutable Mutex mu_;                                            // guards the two maps of waiting connections
  std::map<std::string, size_t> waiting_ ABSL_GUARDED_BY(mu_);  // peer -> connections waiting on it
  size_t waiting_total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera::http

#endif  // TESSERA_HTTP_GUARDED_SERVER_H_
