// Listening sockets for Tessera's HTTP servers: addresses as HOST:PORT, and a backlog as long as the system
// allows instead of cpp-httplib's 5.
//
// With a backlog of 5, a burst of connections overflows the accept queue while the accepting thread hands
// the first ones to workers: 100 concurrent requests to the extender got 39 ECONNRESET. Every listener of
// ours binds through WideBacklog::BindAndListen, which listens with ListenBacklog().
//
//   auto server = std::make_unique<http::WideBacklog<httplib::SSLServer>>(cert, key);
//   absl::StatusOr<int> port = server->BindAndListen("0.0.0.0", 0);  // 0: a free port
//   server->listen_after_bind();
#ifndef TESSERA_HTTP_LISTEN_H_
#define TESSERA_HTTP_LISTEN_H_

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <utility>

#include "absl/status/statusor.h"
#include "http/backlog.h"
#include "httplib.h"

namespace tessera::http {

// Splits "HOST:PORT" ("[::1]:80" for IPv6); the error says what a valid address looks like.
absl::StatusOr<std::pair<std::string, int>> ParseListen(std::string_view listen);

// The error of a failed bind, naming the address.
absl::Status CannotListen(const std::string& host, int port);

// An httplib server (httplib::Server, httplib::SSLServer or a subclass) that listens with ListenBacklog().
template <typename Base>
class WideBacklog : public Base {
 public:
  using Base::Base;

  // Binds `host`:`port` (0: a free port) and listens; returns the port. Fails, serving nothing, when the
  // address cannot be bound (in use, or not local).
  absl::StatusOr<int> BindAndListen(const std::string& host, int port) {
    int bound = port;
    if (port == 0) {
      bound = this->bind_to_any_port(host);
    } else if (!this->bind_to_port(host, port)) {
      bound = -1;
    }
    if (bound <= 0) return CannotListen(host, port);
    // httplib has listened with its compiled-in backlog; listening again on a listening socket only changes
    // the backlog (Linux), before any connection is accepted.
    if (::listen(this->svr_sock_, ListenBacklog()) != 0) return CannotListen(host, port);
    return bound;
  }
};

}  // namespace tessera::http

#endif  // TESSERA_HTTP_LISTEN_H_
