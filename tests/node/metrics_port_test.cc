// tessera-node's metrics and health port as a pod reaches it: the real binary in a subprocess (fake GPUs, a
// fake-API file, no kubelet), slow clients from many addresses, /healthz asked meanwhile.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "httplib.h"

extern char** environ;

namespace {

// A free port on 127.0.0.1 (the kernel's choice, released for the binary to bind).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A TCP connection to 127.0.0.1:port from `source`, an address of 127/8 (each a peer of its own).
int ConnectFrom(const std::string& source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
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

class NodeMetricsPortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::path(::testing::TempDir()) / ("metrics-port-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "api.json") << R"({"pods": []})";
    port_ = FreePort();
    ASSERT_GT(port_, 0);
    const std::string binary = std::string(TESSERA_BINARY_DIR) + "/bin/tessera-node";
    std::vector<std::string> args = {binary,
                                     "--node-name",
                                     "n",
                                     "--fake-api",
                                     (dir_ / "api.json").string(),
                                     "--fake-gpus",
                                     std::string(TESSERA_SOURCE_DIR) + "/examples/fake-gpus/pcie-4gpu.yaml",
                                     "--device-plugin-dir",
                                     (dir_ / "device-plugins").string(),
                                     "--pod-resources-socket",
                                     (dir_ / "none.sock").string(),
                                     "--state-dir",
                                     (dir_ / "state").string(),
                                     "--metrics-listen",
                                     "127.0.0.1:" + std::to_string(port_)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ASSERT_EQ(posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), environ), 0);
    // Up when /healthz answers (a minute at most, on a busy machine).
    httplib::Client c("127.0.0.1", port_);
    for (int i = 0; i < 600; ++i) {
      if (auto r = c.Get("/healthz"); r && r->status == 200) return;
      ASSERT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "tessera-node exited";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "tessera-node's /healthz did not answer";
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::filesystem::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// Twenty-four clients from as many addresses, each sending a header byte a second and reconnecting when the
// agent hangs up: /healthz (the liveness probe's) is still answered while they hold. It used to wait for as
// long as they stayed (each byte restarted httplib's read timeout), and the kubelet restarted the agent.
TEST_F(NodeMetricsPortTest, SlowClientsFromManyHostsDoNotStopHealthz) {
  std::atomic<bool> done{false};
  std::atomic<int> bytes{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < 24; ++i) {
    slow.emplace_back([&, source = "127.0.0." + std::to_string(i + 2)] {
      const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      while (!done) {
        const int fd = ConnectFrom(source, port_);
        if (fd < 0) continue;
        size_t sent = 0;
        while (!done) {
          const char c = sent < head.size() ? head[sent] : 'a';
          if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
          ++sent;
          ++bytes;
          pollfd p{fd, POLLIN, 0};
          if (poll(&p, 1, 1000) == 1) break;  // the agent closed it
        }
        close(fd);
      }
    });
  }
  while (bytes.load() < 24 * 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // all holding
  httplib::Client client("127.0.0.1", port_);
  client.set_connection_timeout(60, 0);
  client.set_read_timeout(60, 0);
  int served = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = client.Get("/healthz");
    if (!r) break;  // not answered within a minute while they hold
    if (r->status == 200) ++served;
  }
  auto metrics = client.Get("/metrics");
  done = true;
  for (std::thread& t : slow) t.join();
  EXPECT_EQ(served, 5);
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("tessera_node"), std::string::npos);
  EXPECT_EQ(waitpid(pid_, nullptr, WNOHANG), 0) << "tessera-node exited";
}

}  // namespace
