// tessera-scheduler over real HTTP on loopback (the extender verbs, health, metrics, inspect) and the webhook
// over real HTTPS with a certificate made for the test; and the binary itself in a subprocess.
#include "scheduler/http_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>
#include <vector>

#include "httplib.h"
#include "nlohmann/json.hpp"
#include "run_binary.h"
#include "scheduler/standalone.h"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::tessera::testing::MakeNode;
using ::testing::HasSubstr;

class HttpServerTest : public ::testing::Test {
 protected:
  HttpServerTest()
      : cache_(CacheOptions{}),
        extender_(cache_, binder_, nullptr),
        admission_({"tessera-scheduler", {}}),
        server_(extender_, &admission_, cache_) {
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("t4-a", 2, core::MiB(15360), "T4")).ok());
  }
  ~HttpServerTest() override { server_.Stop(); }

  ClusterCache cache_;
  StandaloneBinder binder_;
  Extender extender_;
  Admission admission_;
  ExtenderServer server_;
};

const char kPod[] =
    R"({"metadata":{"name":"p","namespace":"default","uid":"u1"},"spec":{"containers":[{"name":"main",)"
    R"("resources":{"limits":{"tessera.dev/gpu-cores":"30","tessera.dev/gpu-memory":"1024"}}}]}})";

TEST_F(HttpServerTest, ServesTheVerbsHealthAndMetrics) {
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "", "", ""}).ok());
  ASSERT_GT(server_.port(), 0);
  httplib::Client client("127.0.0.1", server_.port());
  auto filter =
      client.Post("/scheduler/filter", std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["t4-a"]})",
                  "application/json");
  ASSERT_TRUE(filter);
  EXPECT_EQ(filter->status, 200);
  EXPECT_EQ(json::parse(filter->body)["NodeNames"][0], "t4-a");
  auto bind = client.Post("/scheduler/bind",
                          R"({"PodName":"p","PodNamespace":"default","PodUID":"u1","Node":"t4-a"})",
                          "application/json");
  ASSERT_TRUE(bind);
  EXPECT_EQ(json::parse(bind->body)["Error"], "");
  auto bad = client.Post("/scheduler/prioritize", "{", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);

  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->body, "ok\n");
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_THAT(metrics->body, HasSubstr("tessera_scheduler_requests_total{verb=\"filter\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("tessera_scheduler_request_seconds_count{verb=\"bind\"} 1"));
  EXPECT_THAT(metrics->body, HasSubstr("tessera_scheduler_bad_requests_total 1"));
  EXPECT_THAT(metrics->body, HasSubstr("tessera_scheduler_pods 1"));
  auto inspect = client.Get("/inspect");
  ASSERT_TRUE(inspect);
  json cluster = json::parse(inspect->body);
  ASSERT_EQ(cluster["nodes"].size(), 1u);
  int tenants = 0;
  for (const json& g : cluster["nodes"][0]["gpus"]) tenants += static_cast<int>(g["tenants"].size());
  EXPECT_EQ(tenants, 1);
}

// Connects to 127.0.0.1:port; -1 on failure.
int ConnectTcp(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Slow clients that send their request head a byte at a time, forever, reconnecting when the server hangs
// up: with one per server thread they used to stop every request, /healthz included (httplib's timeout is per
// read, and each byte restarts it).
TEST_F(HttpServerTest, SlowClientsCannotStarveTheServer) {
  HttpLimits limits;
  limits.request_timeout = std::chrono::milliseconds(2000);
  limits.strict_timeout = std::chrono::milliseconds(200);
  limits.max_slow_per_peer = 2;
  server_.SetLimits(limits);
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "", "", ""}).ok());
  std::atomic<bool> done{false};
  std::atomic<int> hung_up{0};
  std::vector<std::thread> slow;
  for (int i = 0; i < 8; ++i) {
    slow.emplace_back([&] {
      const std::string head = "GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ";
      while (!done) {
        const int fd = ConnectTcp(server_.port());
        if (fd < 0) continue;
        size_t sent = 0;
        while (!done) {
          const char c = sent < head.size() ? head[sent] : 'a';
          if (send(fd, &c, 1, MSG_NOSIGNAL) != 1) break;
          ++sent;
          pollfd p{fd, POLLIN, 0};
          if (poll(&p, 1, 50) == 1) break;  // the server closed it (or answered)
        }
        if (!done) ++hung_up;
        close(fd);
      }
    });
  }
  httplib::Client client("127.0.0.1", server_.port());
  client.set_read_timeout(20, 0);
  client.set_connection_timeout(20, 0);
  int served = 0;
  for (int i = 0; i < 5; ++i) {
    auto r = client.Get("/healthz");
    if (r && r->status == 200) ++served;
  }
  done = true;
  for (std::thread& t : slow) t.join();
  EXPECT_EQ(served, 5);
  EXPECT_GT(hung_up.load(), 0);  // the server closes slow connections instead of waiting on them
}

// A body above the limit is refused before it is read (it used to be parsed: 100 MB took 46 s and 2.7 GB).
TEST_F(HttpServerTest, BodiesAboveTheLimitGet413) {
  HttpLimits limits;
  limits.max_body_bytes = 1 << 20;
  server_.SetLimits(limits);
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "", "", ""}).ok());
  httplib::Client client("127.0.0.1", server_.port());
  std::string body = std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":[)";
  while (body.size() < (1u << 20)) body += R"("node-xxxxxxxxxxxxxxxxxxxxxxxxxxxxx",)";
  body += R"("t4-a"]})";
  auto r = client.Post("/scheduler/filter", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413);
  auto ok = client.Post("/scheduler/filter", std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["t4-a"]})",
                        "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

TEST_F(HttpServerTest, BadListenAddressesAreExplained) {
  absl::Status st = server_.Start({"nonsense", 4, "", "", ""});
  EXPECT_THAT(std::string(st.message()), HasSubstr("HOST:PORT"));
  ASSERT_TRUE(ParseListen("[::1]:8080").ok());
  EXPECT_EQ(ParseListen("[::1]:8080")->first, "::1");
  EXPECT_FALSE(ParseListen("host:99999").ok());
}

TEST_F(HttpServerTest, WebhookServesAdmissionReviewsOverTls) {
  const std::string dir = ::testing::TempDir();
  const std::string cert = dir + "/webhook.crt", key = dir + "/webhook.key";
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=127.0.0.1 -keyout " +
                          key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl is needed (scripts/setup installs it)";
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "127.0.0.1:0", cert, key}).ok());
  httplib::SSLClient client("127.0.0.1", server_.webhook_port());
  client.set_ca_cert_path(cert.c_str());
  client.enable_server_certificate_verification(true);
  const std::string review =
      std::string(R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"r1",)") +
      R"("kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":)" + kPod + "}}";
  auto r = client.Post("/mutate", review, "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200);
  json out = json::parse(r->body);
  EXPECT_EQ(out["response"]["uid"], "r1");
  EXPECT_TRUE(out["response"]["allowed"]);
  // The webhook is not on the plain listener.
  httplib::Client plain("127.0.0.1", server_.port());
  auto missing = plain.Post("/mutate", review, "application/json");
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->status, 404);
}

TEST_F(HttpServerTest, WebhookWithoutReadableKeysDoesNotStart) {
  absl::Status st = server_.Start({"127.0.0.1:0", 4, "127.0.0.1:0", "/nonexistent.crt", "/nonexistent.key"});
  EXPECT_THAT(std::string(st.message()), HasSubstr("--tls-cert"));
}

tessera::testing::BinaryResult RunCommand(const std::string& args) {
  return tessera::testing::RunBinary("tessera-scheduler", args);
}

TEST(SchedulerBinaryTest, HelpAndBadInput) {
  tessera::testing::BinaryResult help = RunCommand("--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_THAT(help.output, HasSubstr("--cluster-file"));
  EXPECT_THAT(RunCommand("").output, HasSubstr("--cluster-file"));
  const std::string cluster = std::string(TESSERA_SOURCE_DIR) + "/examples/cluster-small.yaml";
  tessera::testing::BinaryResult policy = RunCommand("--cluster-file " + cluster + " --policy nope");
  EXPECT_EQ(policy.status, 2);
  EXPECT_THAT(policy.output, HasSubstr("unknown policy \"nope\""));
  const std::string broken = ::testing::TempDir() + "/broken-cluster.yaml";
  std::ofstream(broken) << "nodes:\n  - name: a\n    gpus: {count: -1}\n";
  tessera::testing::BinaryResult bad = RunCommand("--cluster-file " + broken);
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.output, HasSubstr("broken-cluster.yaml"));
  tessera::testing::BinaryResult listen = RunCommand("--cluster-file " + cluster + " --listen 300.1.1.1:1");
  EXPECT_EQ(listen.status, 2);
  EXPECT_THAT(listen.output, HasSubstr("cannot listen"));
}

}  // namespace
}  // namespace tessera::scheduler
