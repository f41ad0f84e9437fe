// The extender's HTTP limits (ServerOptions::limits; enforced by GuardedHttpServer, guarded_http.h).
#ifndef TESSERA_SCHEDULER_HTTP_LIMITS_H_
#define TESSERA_SCHEDULER_HTTP_LIMITS_H_

#include <chrono>
#include <cstddef>

namespace tessera::scheduler {

struct HttpLimits {
  std::chrono::milliseconds request_timeout{30000};  // head and body, from the request's first byte
  std::chrono::milliseconds idle_timeout{5000};      // between requests on a keep-alive connection
  std::chrono::milliseconds strict_timeout{1000};    // for a peer with max_slow_per_peer waiting already
  std::chrono::milliseconds write_timeout{10000};    // per write of the answer
  size_t max_slow_per_peer = 8;                      // connections of one peer waiting on the peer
  size_t max_body_bytes = size_t{64} << 20;          // larger request bodies get 413
  size_t keep_alive_requests = 100;                  // requests per connection
};

}  // namespace tessera::scheduler

#endif  // TESSERA_SCHEDULER_HTTP_LIMITS_H_
