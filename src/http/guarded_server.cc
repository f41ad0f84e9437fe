#include "http/guarded_server.h"

#include <arpa/inet.h>
#include <malloc.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string_view>

namespace tessera::http {

namespace {

using Clock = std::chrono::steady_clock;

// The connection a server thread is serving, for Guard().
struct Connection {
  std::string peer;
  bool waiting = false;
  size_t body_bytes = 0;  // of the request being served
};
thread_local Connection* t_connection = nullptr;
// Set while the accepting thread runs a connection it sheds (GuardedHttpServer::ConnectionQueue).
thread_local bool t_shed = false;

constexpr std::string_view kBusy =
    "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 45\r\n"
    "Connection: close\r\n\r\ntoo many connections open; retry in a moment\n";

// Waits until `fd` is ready for `events` or `timeout` passes; checks `stopped` every 100 ms.
template <typename Stopped>
bool WaitFor(int fd, short events, std::chrono::milliseconds timeout, Stopped stopped) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0 || stopped()) return false;
    pollfd p{fd, events, 0};
    const int n = poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), 100)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

void Address(int fd, bool peer, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = 0;
  if (rc != 0) return;
  char buf[INET6_ADDRSTRLEN] = {0};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, buf, sizeof(buf));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof(buf));
    port = ntohs(a->sin6_port);
  }
  ip = buf;
}

// A socket stream whose reads share one deadline (the request's), unlike httplib's per-read timeout.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(int fd, std::chrono::milliseconds write_timeout) : fd_(fd), write_timeout_(write_timeout) {}

  void set_deadline(Clock::time_point deadline) { deadline_ = deadline; }
  bool buffered() const { return pos_ < len_; }

  bool is_readable() const override {
    return buffered() || WaitFor(fd_, POLLIN, Left(), [] { return false; });
  }
  bool is_writable() const override {
    return WaitFor(fd_, POLLOUT, write_timeout_, [] { return false; });
  }

  ssize_t read(char* ptr, size_t size) override {
    if (buffered()) return Take(ptr, size);
    if (!WaitFor(fd_, POLLIN, Left(), [] { return false; })) return -1;
    if (size < sizeof(buf_)) {
      const ssize_t n = Recv(buf_, sizeof(buf_));
      if (n <= 0) return n;
      pos_ = 0;
      len_ = static_cast<size_t>(n);
      return Take(ptr, size);
    }
    return Recv(ptr, size);
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    while (true) {
      const ssize_t n = send(fd_, ptr, size, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override { Address(fd_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { Address(fd_, false, ip, port); }
  socket_t socket() const override { return fd_; }

 private:
  std::chrono::milliseconds Left() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now());
  }
  ssize_t Take(char* ptr, size_t size) {
    const size_t n = std::min(size, len_ - pos_);
    std::memcpy(ptr, buf_ + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t Recv(char* ptr, size_t size) {
    while (true) {
      const ssize_t n = recv(fd_, ptr, size, 0);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  const int fd_;
  const std::chrono::milliseconds write_timeout_;
  Clock::time_point deadline_ = Clock::now();
  char buf_[4096];
  size_t pos_ = 0;
  size_t len_ = 0;
};

}  // namespace

// httplib's thread pool with a cap on the connections it holds: past `max_connections` a connection is shed
// on the accepting thread (answered 503 without waiting, and closed) instead of queued, so a flood of
// connections costs no descriptors or memory beyond the cap.
class GuardedHttpServer::ConnectionQueue final : public httplib::TaskQueue {
 public:
  explicit ConnectionQueue(GuardedHttpServer* server) : server_(server), pool_(server->limits_.threads) {}

  // Called by the accepting thread alone, so the check and the increment cannot race with another enqueue.
  void enqueue(std::function<void()> fn) override {
    if (server_->open_.load() >= server_->limits_.max_connections) {
      t_shed = true;
      fn();
      t_shed = false;
      return;
    }
    server_->open_.fetch_add(1);
    pool_.enqueue([server = server_, fn = std::move(fn)] {
      fn();
      server->open_.fetch_sub(1);
    });
  }
  void shutdown() override { pool_.shutdown(); }

 private:
  GuardedHttpServer* const server_;
  httplib::ThreadPool pool_;
};

GuardedHttpServer::GuardedHttpServer(HttpLimits limits)
    : limits_([&] {
        limits.threads = std::max<size_t>(2, limits.threads);
        limits.max_connections = std::max(limits.max_connections, limits.threads);
        return limits;
      }()),
      slow_budget_(std::max<size_t>(1, limits_.threads / 2)) {
  set_payload_max_length(limits_.max_body_bytes);
  new_task_queue = [this] { return new ConnectionQueue(this); };
}

httplib::Server::Handler GuardedHttpServer::Guard(Handler handler) {
  return [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    Connection* c = t_connection;
    if (c != nullptr) {
      SetWaiting(c->peer, &c->waiting, false);
      c->body_bytes = req.body.size();
    }
    handler(req, res);
    if (c != nullptr) SetWaiting(c->peer, &c->waiting, true);
  };
}

void GuardedHttpServer::SetWaiting(const std::string& peer, bool* waiting, bool now) {
  MutexLock lock(&mu_);
  if (*waiting == now) return;
  *waiting = now;
  size_t& n = waiting_[peer];
  if (now) {
    ++n;
    ++waiting_total_;
  } else {
    --waiting_total_;
    if (--n == 0) waiting_.erase(peer);
  }
}

size_t GuardedHttpServer::waiting(const std::string& peer) const {
  MutexLock lock(&mu_);
  auto it = waiting_.find(peer);
  return it == waiting_.end() ? 0 : it->second;
}

size_t GuardedHttpServer::waiting() const {
  MutexLock lock(&mu_);
  return waiting_total_;
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  if (t_shed) {
    shed_.fetch_add(1, std::memory_order_relaxed);
    (void)send(sock, kBusy.data(), kBusy.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    shutdown(sock, SHUT_RDWR);
    close(sock);
    return false;
  }
  DeadlineStream stream(sock, limits_.write_timeout);
  Connection connection;
  int port = 0;
  stream.get_remote_ip_and_port(connection.peer, port);
  bool strict = false;
  {
    MutexLock lock(&mu_);
    auto it = waiting_.find(connection.peer);
    strict =
        (it != waiting_.end() && it->second >= limits_.max_slow_per_peer) || waiting_total_ >= slow_budget_;
  }
  SetWaiting(connection.peer, &connection.waiting, true);
  t_connection = &connection;
  const std::chrono::milliseconds request_timeout = strict ? limits_.strict_timeout : limits_.request_timeout;
  const std::chrono::milliseconds idle_timeout = strict ? limits_.strict_timeout : limits_.idle_timeout;
  size_t left = strict ? 1 : std::max<size_t>(1, limits_.keep_alive_requests);
  auto stopped = [this] { return svr_sock_.load() == INVALID_SOCKET; };
  bool ok = false;
  bool first = true;
  while (left > 0 && !stopped()) {
    // The first byte of the next request: within the request timeout on a new connection, the idle timeout
    // on a kept-alive one.
    if (!stream.buffered() && !WaitFor(sock, POLLIN, first ? request_timeout : idle_timeout, stopped)) break;
    first = false;
    stream.set_deadline(Clock::now() + request_timeout);
    --left;
    bool connection_closed = false;
    connection.body_bytes = 0;
    ok = process_request(stream, left == 0 || stopped(), connection_closed, nullptr);
    // The request and its answer are freed by now: give a large one's memory back.
    if (connection.body_bytes >= limits_.trim_after_bytes) malloc_trim(0);
    if (!ok || connection_closed) break;
  }
  t_connection = nullptr;
  SetWaiting(connection.peer, &connection.waiting, false);
  shutdown(sock, SHUT_RDWR);
  close(sock);
  return ok;
}

}  // namespace tessera::http
