// The registration server under concurrent registrations, reloads, reads and idle connections (also run
// under ThreadSanitizer: the "tsan" preset).
#include "node/registration_server.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "core/strings.h"
#include "hook/common/registration.h"
#include "temp_dir.h"

namespace tessera::node {
namespace {

int Connect(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

TEST(RegistrationServerTest, ConcurrentRegistrationsReloadsAndIdleConnections) {
  tessera::testing::TempDir dir;
  std::atomic<int> gone{0};
  RegistrationLimits limits;
  limits.max_pending = 4;
  limits.hello_timeout = std::chrono::milliseconds(100);
  RegistrationServer server(dir.path() + "/agent.sock",
                            {[](int, const hook::Hello&) -> absl::StatusOr<RegistrationServer::Accepted> {
                               return RegistrationServer::Accepted{"uid/main", 1};
                             },
                             [&](int, const std::string&) { ++gone; }, [](int pid) { return StrCat(pid); }},
                            limits, RealClock());
  ASSERT_TRUE(server.Start().ok());
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done) {
      (void)server.All();
      (void)server.Pids("uid/main");
      (void)server.PushReload("uid/main", 2);
      (void)server.stats();
    }
  });
  std::thread idle([&] {
    std::vector<int> fds;
    for (int i = 0; i < 50; ++i) fds.push_back(Connect(server.socket_path()));
    for (int fd : fds) {
      if (fd >= 0) close(fd);
    }
  });
  std::vector<std::thread> clients;
  std::atomic<int> registered{0};
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&] {
      for (int i = 0; i < 5; ++i) {
        hook::AgentConnection conn;
        hook::Hello hello;
        hook::CopyString(hello.lib, sizeof(hello.lib), "cuda");
        hook::AgentMessage reply;
        hook::Error error;
        if (conn.Register(server.socket_path().c_str(), hello, 10000, &reply, &error)) ++registered;
        conn.Close();
      }
    });
  }
  for (std::thread& t : clients) t.join();
  idle.join();
  done = true;
  reader.join();
  EXPECT_GT(registered.load(), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (server.connection_count() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(server.connection_count(), 0u);
  EXPECT_EQ(gone.load(), registered.load());
  server.Stop();
}

// The HELLO timeout is measured on the server's clock (common/clock.h): on a FakeClock a silent connection
// stays however long the test takes, and goes once the clock passes hello_timeout.
TEST(RegistrationServerTest, TheHelloTimeoutRunsOnTheServersClock) {
  tessera::testing::TempDir dir;
  FakeClock clock;
  RegistrationLimits limits;
  limits.hello_timeout = std::chrono::seconds(5);
  RegistrationServer server(dir.path() + "/agent.sock",
                            {[](int, const hook::Hello&) -> absl::StatusOr<RegistrationServer::Accepted> {
                               return RegistrationServer::Accepted{"uid/main", 1};
                             },
                             [](int, const std::string&) {}, nullptr},
                            limits, clock);
  ASSERT_TRUE(server.Start().ok());
  const int fd = Connect(server.socket_path());
  ASSERT_GE(fd, 0);
  auto wait_for = [](const std::function<bool()>& done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!done() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return done();
  };
  ASSERT_TRUE(wait_for([&] { return server.connection_count() == 1; }));
  // Real time passes (more than one turn of the server's loop, which wakes at least every second); the
  // fake clock does not, so nothing times out, however slow the machine.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(server.stats().timed_out, 0u);
  EXPECT_EQ(server.connection_count(), 1u);
  clock.Advance(std::chrono::seconds(6));
  EXPECT_TRUE(wait_for([&] { return server.stats().timed_out == 1; }));
  EXPECT_TRUE(wait_for([&] { return server.connection_count() == 0; }));
  close(fd);
  server.Stop();
}

}  // namespace
}  // namespace tessera::node
