// tessera-scheduler over real HTTP on loopback (the extender verbs, health, metrics, inspect) and the webhook
// over real HTTPS with a certificate made for the test; and the binary itself in a subprocess.
#include "scheduler/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>

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
