// The limits of a GuardedHttpServer (guarded_server.h): tessera-scheduler's extender and tessera-node's
// metrics and health port. docs/security.md states them.
#ifndef TESSERA_HTTP_HTTP_LIMITS_H_
#define TESSERA_HTTP_HTTP_LIMITS_H_

#include <chrono>
#include <cstddef>

namespace tessera::http {

struct HttpLimits {
  std::chrono::milliseconds request_timeout{30000};  // head and body, from the request's first byte
  std::chrono::milliseconds idle_timeout{5000};      // between requests on a keep-alive connection
  std::chrono::milliseconds strict_timeout{1000};    // for a connection over a slow cap (below)
  std::chrono::milliseconds write_timeout{10000};    // per write of the answer
  size_t max_slow_per_peer = 8;                      // connections of one peer waiting on the peer
  size_t max_body_bytes = size_t{64} << 20;          // larger request bodies get 413
  size_t keep_alive_requests = 100;                  // requests per connection
  // Worker threads. At most half of them (at least one) wait on clients under the long timeouts: a new
  // connection while that many wait, from any peers, gets strict_timeout, so the other half always turns over
  // within strict_timeout and /healthz is answered however many hosts hold connections open.
  size_t threads = 16;
  // Connections accepted and not yet closed (queued for a thread or served); more are answered 503 and
  // closed at once, so a flood costs neither descriptors nor memory past this.
  size_t max_connections = 1024;
  // After a request whose body was at least this large, free memory goes back to the system (malloc_trim):
  // glibc keeps a large request's freed tree in its heap otherwise, and the RSS stays high after it.
  size_t trim_after_bytes = size_t{4} << 20;
};

}  // namespace tessera::http

#endif  // TESSERA_HTTP_HTTP_LIMITS_H_
