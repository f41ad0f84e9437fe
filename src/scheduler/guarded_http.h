// An httplib::Server that a slow or idle client cannot starve: the extender's plain-HTTP listener.
//
// cpp-httplib serves each connection on one pool thread for the connection's whole life, and its read
// timeout is per read: a client that sends a header byte every few seconds keeps a thread forever, and
// sixteen such clients stopped every request, /healthz included. GuardedHttpServer serves connections with
// its own keep-alive loop over a stream whose reads share one deadline per request:
//   - a request (head and body) must arrive within `request_timeout` of its first byte;
//   - an idle keep-alive connection is closed after `idle_timeout`;
//   - a peer (IP address) with `max_slow_per_peer` connections already waiting (for a request to arrive or to
//     finish arriving) gets the strict timeout on further ones, `strict_timeout` for a request and no
//     keep-alive, so one host holds at most that many threads for long;
//   - bodies above `max_body_bytes` are refused (413) before they are read (httplib's payload limit).
// Handlers must be registered through Guard() so that time spent in them is not counted as waiting.
//
//   auto server = std::make_unique<GuardedHttpServer>(HttpLimits{});
//   server->Get("/healthz", server->Guard([](const httplib::Request&, httplib::Response& res) { ... }));
//
// Thread-safety: as httplib::Server; the per-peer accounting is internally synchronized.
#ifndef TESSERA_SCHEDULER_GUARDED_HTTP_H_
#define TESSERA_SCHEDULER_GUARDED_HTTP_H_

#include <chrono>
#include <cstddef>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "common/mutex.h"
#include "httplib.h"
#include "scheduler/http_limits.h"

namespace tessera::scheduler {

class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(HttpLimits limits);

  // Wraps a handler: while it runs, its connection does not count as waiting on the peer.
  Handler Guard(Handler handler);

  // Connections of `peer` waiting on it now (for tests).
  size_t waiting(const std::string& peer) const;

 private:
  bool process_and_close_socket(socket_t sock) override;
  void SetWaiting(const std::string& peer, bool* waiting, bool now);

  const HttpLimits limits_;
  mutable Mutex mu_;
  std::map<std::string, size_t> waiting_ ABSL_GUARDED_BY(mu_);  // peer -> connections waiting on it
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_GUARDED_HTTP_H_
