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
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "core/strings.h"
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
using ::testing::Not;

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
  // What a test's SetLeader reads: the fixture's, so it is there until the server stops.
  std::atomic<bool> leader_{true};
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

// The families of a /metrics text, checked as `promtool check metrics` would: each family's HELP and TYPE
// once, before its samples, no family split, counters named *_total, histograms' samples *_bucket (with le),
// *_sum and *_count. Returns family -> TYPE.
std::map<std::string, std::string> CheckExposition(const std::string& text) {
  std::map<std::string, std::string> help, type;
  std::set<std::string> closed;
  std::string current;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    SCOPED_TRACE(line);
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      std::istringstream words(line.substr(7));
      std::string name, rest;
      words >> name;
      std::getline(words, rest);
      auto& table = line[2] == 'H' ? help : type;
      EXPECT_FALSE(table.contains(name)) << "given twice";
      EXPECT_FALSE(closed.contains(name)) << "family split";
      EXPECT_FALSE(rest.empty());
      table[name] = rest.substr(1);
      if (current != name && !current.empty()) closed.insert(current);
      current = name;
      continue;
    }
    EXPECT_FALSE(line.empty());
    std::string name = line.substr(0, line.find_first_of("{ "));
    if (type[current] == "histogram") {
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (name == current + suffix) name = current;
      }
      if (line.rfind(current + "_bucket", 0) == 0) {
        EXPECT_THAT(line, HasSubstr("le=\""));
      }
    }
    EXPECT_EQ(name, current) << "a sample outside its family";
    const std::string value = line.substr(line.rfind(' ') + 1);
    EXPECT_NO_THROW((void)std::stod(value));
  }
  for (const auto& [name, t] : type) {
    EXPECT_TRUE(help.contains(name)) << name;
    EXPECT_TRUE(t == "counter" || t == "gauge" || t == "histogram") << name << " " << t;
    EXPECT_EQ(t == "counter", name.ends_with("_total")) << name;
  }
  for (const auto& [name, h] : help) EXPECT_TRUE(type.contains(name)) << name;
  return type;
}

// The value of the sample whose line starts with `prefix` (name and labels up to some point); NaN if none.
double SampleValue(const std::string& text, const std::string& prefix) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(prefix, 0) == 0) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nan("");
}

// What the scheduler adds for operators who join with dcgm-exporter and the node agents: its books per GPU
// (labels gpu = index, UUID, Hostname, model) and node, whether it leads, the webhook's decisions, and
// the build; all well-formed, and the per-GPU series off when asked.
TEST_F(HttpServerTest, MetricsCarryBooksPerGpuLeaderWebhookDecisionsAndBuild) {
  server_.SetLeader([this] { return leader_.load(); });
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "", "", ""}).ok());
  httplib::Client client("127.0.0.1", server_.port());
  ASSERT_TRUE(client.Post("/scheduler/filter", std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["t4-a"]})",
                          "application/json"));
  auto bind = client.Post("/scheduler/bind",
                          R"({"PodName":"p","PodNamespace":"default","PodUID":"u1","Node":"t4-a"})",
                          "application/json");
  ASSERT_TRUE(bind);
  ASSERT_EQ(json::parse(bind->body)["Error"], "");
  const std::string review_head =
      R"({"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"r1",)"
      R"("kind":{"group":"","version":"v1","kind":"Pod"},"operation":"CREATE","object":)";
  const std::string zero_cores =
      R"({"metadata":{"name":"z","namespace":"default"},"spec":{"containers":[{"name":"main",)"
      R"("resources":{"limits":{"tessera.dev/gpu-cores":"0"}}}]}})";
  admission_.Mutate(review_head + kPod + "}}");  // patched: tessera.dev/gpu and the scheduler name
  admission_.Mutate("{");                        // error
  admission_.Validate(review_head + kPod + "}}");
  admission_.Validate(review_head + zero_cores + "}}");  // denied

  auto scraped = client.Get("/metrics");
  ASSERT_TRUE(scraped);
  EXPECT_THAT(scraped->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  const std::string text = scraped->body;
  const std::map<std::string, std::string> types = CheckExposition(text);
  for (const char* family :
       {"tessera_scheduler_gpu_cores_allocated_percent", "tessera_scheduler_gpu_memory_allocated_bytes",
        "tessera_scheduler_gpu_memory_total_bytes", "tessera_scheduler_gpu_tenants",
        "tessera_scheduler_node_schedulable", "tessera_scheduler_node_tenants", "tessera_scheduler_leader",
        "tessera_scheduler_webhook_decisions_total", "tessera_build_info",
        "tessera_scheduler_request_seconds"}) {
    EXPECT_TRUE(types.contains(family)) << family;
  }
  // The pod's 30 % and 1 GiB on one of the node's two GPUs, nothing on the other.
  double cores = 0, memory = 0, tenants = 0;
  for (int g = 0; g < 2; ++g) {
    const std::string labels =
        StrCat("{gpu=\"", g, "\",UUID=\"GPU-t4-a-", g, "\",Hostname=\"t4-a\",model=\"T4\"} ");
    cores += SampleValue(text, "tessera_scheduler_gpu_cores_allocated_percent" + labels);
    memory += SampleValue(text, "tessera_scheduler_gpu_memory_allocated_bytes" + labels);
    tenants += SampleValue(text, "tessera_scheduler_gpu_tenants" + labels);
    EXPECT_EQ(SampleValue(text, "tessera_scheduler_gpu_memory_total_bytes" + labels), 15360.0 * (1 << 20));
  }
  EXPECT_EQ(cores, 30);
  EXPECT_EQ(memory, 1024.0 * (1 << 20));
  EXPECT_EQ(tenants, 1);
  EXPECT_EQ(SampleValue(text, "tessera_scheduler_node_schedulable{Hostname=\"t4-a\"} "), 1);
  EXPECT_EQ(SampleValue(text, "tessera_scheduler_node_tenants{Hostname=\"t4-a\"} "), 1);
  EXPECT_EQ(SampleValue(text, "tessera_scheduler_leader "), 1);
  const std::string decisions = "tessera_scheduler_webhook_decisions_total";
  EXPECT_EQ(SampleValue(text, decisions + "{verb=\"mutate\",decision=\"patched\"} "), 1);
  EXPECT_EQ(SampleValue(text, decisions + "{verb=\"mutate\",decision=\"error\"} "), 1);
  EXPECT_EQ(SampleValue(text, decisions + "{verb=\"mutate\",decision=\"allowed\"} "), 0);
  EXPECT_EQ(SampleValue(text, decisions + "{verb=\"validate\",decision=\"allowed\"} "), 1);
  EXPECT_EQ(SampleValue(text, decisions + "{verb=\"validate\",decision=\"denied\"} "), 1);
  EXPECT_TRUE(std::isnan(SampleValue(text, decisions + "{verb=\"validate\",decision=\"patched\"} ")));
  EXPECT_THAT(text,
              ::testing::ContainsRegex("tessera_build_info\\{version=\"[0-9.]+\",revision=\"[^\"]+\"\\} 1"));
  // Bucket bounds exactly as configured (a rounded 0.00025 once read 0.0003).
  EXPECT_THAT(text, HasSubstr("tessera_scheduler_request_seconds_bucket{verb=\"bind\",le=\"0.00025\"} "));
  EXPECT_THAT(text, HasSubstr("tessera_scheduler_request_seconds_bucket{verb=\"bind\",le=\"1\"} "));

  leader_ = false;
  EXPECT_EQ(SampleValue(server_.MetricsText(), "tessera_scheduler_leader "), 0);
}

TEST_F(HttpServerTest, PerGpuSeriesCanBeTurnedOff) {
  server_.SetGpuMetrics(false);
  const std::string text = server_.MetricsText();
  CheckExposition(text);
  EXPECT_THAT(text, Not(HasSubstr("tessera_scheduler_gpu_")));
  EXPECT_THAT(text, Not(HasSubstr("tessera_scheduler_node_schedulable")));
  EXPECT_THAT(text, HasSubstr("tessera_scheduler_nodes 1\n"));
  EXPECT_THAT(text, HasSubstr("tessera_scheduler_leader 1\n"));
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
  // The server closes slow connections instead of waiting on them: within the request timeout, however busy
  // the machine (the answers above may all come before the first slow connection is closed).
  for (int i = 0; i < 600 && hung_up.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  done = true;
  for (std::thread& t : slow) t.join();
  EXPECT_EQ(served, 5);
  EXPECT_GT(hung_up.load(), 0);
}

// A burst of concurrent requests to the extender is queued, not reset: it listened with a backlog of 5, and
// 100 concurrent requests got 39 ECONNRESET.
TEST_F(HttpServerTest, BurstsOfConnectionsAreNotReset) {
  ASSERT_TRUE(server_.Start({"127.0.0.1:0", 4, "", "", ""}).ok());
  constexpr int kClients = 150;
  std::atomic<bool> go{false};
  std::atomic<int> reset{0};
  std::atomic<int> answered{0};
  std::vector<std::thread> clients;
  const std::string filter = std::string(R"({"Pod":)") + kPod + R"(,"NodeNames":["t4-a"]})";
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      while (!go) std::this_thread::yield();
      const int fd = ConnectTcp(server_.port());
      if (fd < 0) {
        ++reset;
        return;
      }
      const std::string request =
          "POST /scheduler/filter HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
          "Content-Type: application/json\r\nContent-Length: " +
          std::to_string(filter.size()) + "\r\n\r\n" + filter;
      std::string answer;
      if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
        ++reset;
      } else {
        char buf[4096];
        ssize_t n = 0;
        while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) answer.append(buf, static_cast<size_t>(n));
        if (n < 0) ++reset;
      }
      close(fd);
      if (answer.rfind("HTTP/1.1 200", 0) == 0 && answer.find("t4-a") != std::string::npos) ++answered;
    });
  }
  go = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(reset.load(), 0);
  EXPECT_EQ(answered.load(), kClients);
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
