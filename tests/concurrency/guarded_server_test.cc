// GuardedHttpServer under concurrent clients, slow ones among them, from one host and from many (also run
// under ThreadSanitizer: the "tsan" preset).
#include "http/guarded_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>
#include <thread>
#include <vector>

namespace tessera::http {
namespace {

// A TCP connection to 127.0.0.1:port from `source` (any address of 127/8 is this host's loopback, so each
// source is a peer of its own to the server); -1 when it fails.
int ConnectFrom(const char* source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A client that sends a request head a byte every `interval`, forever, reconnecting when the server hangs up.
void Slowloris(const std::string& source, int port, std::chrono::milliseconds interval,
               const std::atomic<bool>& done, std::atomic<int>& bytes) {
  const std::string head = "GET /ping HTTP/1.1\r\nHost: x\r\nX-Slow: ";
  while (!done) {
    const int fd = ConnectFrom(source.c_str(), port);
    if (fd < 0) continue;
    size_t sent = 0;
    while (!done) {
      const char c = sent < head.size() ? head[sent] : 'a';
      if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
      ++sent;
      ++bytes;
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(interval.count())) == 1) break;  // the server closed it
    }
    close(fd);
  }
}

class GuardedServerTest : public ::testing::Test {
 protected:
  void Start(const HttpLimits& limits) {
    server_ = std::make_unique<GuardedHttpServer>(limits);
    server_->Get("/ping", server_->Guard([this](const httplib::Request&, httplib::Response& res) {
      ++hits_;
      res.set_content("pong", "text/plain");
    }));
    absl::StatusOr<int> port = server_->BindAndListen("127.0.0.1", 0);
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *port;
    serving_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~GuardedServerTest() override {
    if (server_) server_->stop();
    if (serving_.joinable()) serving_.join();
  }

  std::unique_ptr<GuardedHttpServer> server_;
  std::thread serving_;
  int port_ = 0;
  std::atomic<int> hits_{0};
};

TEST_F(GuardedServerTest, ConcurrentClientsAndSlowOnes) {
  HttpLimits limits;
  limits.request_timeout = std::chrono::milliseconds(500);
  limits.strict_timeout = std::chrono::milliseconds(100);
  limits.max_slow_per_peer = 2;
  limits.threads = 4;
  Start(limits);
  std::atomic<bool> done{false};
  std::vector<std::thread> slow;
  for (int i = 0; i < 3; ++i) {
    slow.emplace_back([&] {
      while (!done) {
        httplib::Client c("127.0.0.1", port_);
        c.set_read_timeout(1, 0);
        (void)c.Post("/ping", std::string(100, 'x'), "text/plain");  // POST without a handler: 404
      }
    });
  }
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", port_);
      c.set_read_timeout(20, 0);
      for (int k = 0; k < 20; ++k) {
        auto r = c.Get("/ping");
        if (r && r->status == 200 && r->body == "pong") ++ok;
      }
    });
  }
  for (std::thread& t : clients) t.join();
  done = true;
  for (std::thread& t : slow) t.join();
  server_->stop();
  serving_.join();
  EXPECT_EQ(ok.load(), 120);
  EXPECT_EQ(hits_.load(), 120);
  EXPECT_EQ(server_->waiting("127.0.0.1"), 0u);
  EXPECT_EQ(server_->waiting(), 0u);
}

// Slow clients from many hosts, one connection each, so that no per-peer cap applies: with a long request
// timeout they used to hold every thread, and /ping from another host waited for as long as they stayed. Half
// the threads at most wait under the long timeouts; the rest turn over within the strict timeout.
TEST_F(GuardedServerTest, SlowClientsFromManyHostsCannotHoldEveryThread) {
  HttpLimits limits;
  limits.request_timeout = std::chrono::minutes(10);  // longer than the test: only the caps can free a thread
  limits.strict_timeout = std::chrono::milliseconds(300);
  limits.threads = 4;
  Start(limits);
  std::atomic<bool> done{false};
  std::atomic<int> bytes{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < 12; ++i) {
    slow.emplace_back(Slowloris, "127.0.0." + std::to_string(i + 2), port_, std::chrono::milliseconds(100),
                      std::cref(done), std::ref(bytes));
  }
  while (bytes.load() < 12 * 3)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // all are holding
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(60, 0);
  client.set_read_timeout(60, 0);
  int served = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = client.Get("/ping");
    if (!r) break;  // not answered within a minute: the slow clients hold every thread
    if (r->status == 200) ++served;
  }
  done = true;
  for (std::thread& t : slow) t.join();
  EXPECT_EQ(served, 5);
  EXPECT_GE(server_->waiting(), 0u);
}

// Connections past max_connections are answered 503 at once and closed, instead of queued without bound.
TEST_F(GuardedServerTest, ConnectionsPastTheCapAreAnswered503) {
  HttpLimits limits;
  limits.request_timeout = std::chrono::minutes(10);
  limits.strict_timeout = std::chrono::minutes(10);
  limits.threads = 2;
  limits.max_connections = 4;
  Start(limits);
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) {
    const int fd = ConnectFrom("127.0.0.1", port_);
    ASSERT_GE(fd, 0);
    held.push_back(fd);
  }
  const int extra = ConnectFrom("127.0.0.1", port_);
  ASSERT_GE(extra, 0);
  std::string answer;
  char buf[256];
  pollfd p{extra, POLLIN, 0};
  while (poll(&p, 1, 60000) == 1) {  // a minute at most: the server sheds it at once
    const ssize_t n = recv(extra, buf, sizeof(buf), 0);
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  close(extra);
  EXPECT_EQ(answer.rfind("HTTP/1.1 503", 0), 0u) << answer;
  EXPECT_NE(answer.find("too many connections"), std::string::npos) << answer;
  EXPECT_EQ(server_->shed(), 1u);
  for (int fd : held) close(fd);
  // Room again once they are gone: the server counts a connection gone when its thread sees the close, which may
  // come after the next connect (a 503 until then), so ask until it answers, a minute at most.
  httplib::Client client("127.0.0.1", port_);
  client.set_read_timeout(60, 0);
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
  while (status != 200 && std::chrono::steady_clock::now() < deadline) {
    auto r = client.Get("/ping");
    ASSERT_TRUE(r);
    status = r->status;
    if (status != 200) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(status, 200);
}

// A burst of connections all at once is queued, not reset: every listener listens with the system's backlog.
TEST_F(GuardedServerTest, BurstsAreQueuedNotReset) {
  HttpLimits limits;
  limits.threads = 2;
  Start(limits);
  EXPECT_GE(ListenBacklog(), 128);
  constexpr int kClients = 200;
  std::atomic<int> answered{0};
  std::atomic<int> reset{0};
  std::vector<std::thread> clients;
  std::atomic<bool> go{false};
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      while (!go) std::this_thread::yield();
      const int fd = ConnectFrom("127.0.0.1", port_);
      if (fd < 0) {
        if (errno == ECONNRESET || errno == ECONNREFUSED) ++reset;
        return;
      }
      const std::string request = "GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
      std::string answer;
      if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size())) {
        char buf[512];
        ssize_t n = 0;
        while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
        if (n < 0 && errno == ECONNRESET) ++reset;
      } else if (errno == ECONNRESET || errno == EPIPE) {
        ++reset;
      }
      close(fd);
      if (answer.rfind("HTTP/1.1 200", 0) == 0) ++answered;
    });
  }
  go = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(reset.load(), 0);
  EXPECT_EQ(answered.load(), kClients);
}

}  // namespace
}  // namespace tessera::http
