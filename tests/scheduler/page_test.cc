// The operators' page: GET /ui/data's JSON from pods placed through the extender's verbs, the pending pods
// and their reasons, the loopback-only rule, and the page over real HTTP on loopback.
#include "scheduler/page.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "httplib.h"
#include "nlohmann/json.hpp"
#include "scheduler/standalone.h"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::tessera::testing::MakeNode;
using ::testing::HasSubstr;

json Pod(const std::string& ns, const std::string& name, const std::string& uid, int cores, int memory,
         const json& annotations = json::object()) {
  json limits = {{"tessera.dev/gpu-cores", std::to_string(cores)},
                 {"tessera.dev/gpu-memory", std::to_string(memory)}};
  return {{"metadata", {{"name", name}, {"namespace", ns}, {"uid", uid}, {"annotations", annotations}}},
          {"spec", {{"containers", {{{"name", "main"}, {"resources", {{"limits", limits}}}}}}}},
          {"status", {{"phase", "Pending"}}}};
}

class PageTest : public ::testing::Test {
 protected:
  PageTest() : cache_(Options()), extender_(cache_, binder_, nullptr, {}, ExtenderOpts(&clock_)) {
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("t4-a", 4, core::MiB(15360), "T4")).ok());
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("a100", 2, core::MiB(81920), "A100-SXM4-80GB")).ok());
  }
  static CacheOptions Options() {
    CacheOptions o;
    o.policy = "fgd";
    o.seed = 42;
    o.warm_shapes = 0;
    return o;
  }
  static ExtenderOptions ExtenderOpts(const Clock* clock) {
    ExtenderOptions o;
    o.clock = clock;
    o.pending_pods = 3;
    return o;
  }
  json Filter(const json& pod, const std::vector<std::string>& nodes) {
    Response r = extender_.Filter(json{{"Pod", pod}, {"NodeNames", nodes}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  void Place(const json& pod, const std::string& node) {
    json f = Filter(pod, {node});
    ASSERT_EQ(f["NodeNames"].size(), 1u) << f.dump();
    const json& m = pod["metadata"];
    Response r = extender_.Bind(json{
        {"PodName", m["name"]},
        {"PodNamespace", m["namespace"]},
        {"PodUID", m["uid"]},
        {"Node", node}}.dump());
    ASSERT_EQ(json::parse(r.body)["Error"], "") << r.body;
  }
  json Data() {
    std::vector<PendingPod> pending = extender_.Pending();
    return json::parse(PageDataJson(cache_.PageSnapshot(), pending, clock_.Now()));
  }
  // The tenants of node `node`'s GPU `g` in the data: [pod index, container, cores, asked, memory, limit].
  static const json& Gpu(const json& data, const std::string& node, int g) {
    for (const json& n : data["nodes"]) {
      if (n["name"] == node) return n["gpus"][static_cast<size_t>(g)];
    }
    ADD_FAILURE() << "no node " << node;
    static const json none;
    return none;
  }

  FakeClock clock_;
  ClusterCache cache_;
  StandaloneBinder binder_;
  Extender extender_;
};

TEST_F(PageTest, DrawsEveryGpuWithWhatItHolds) {
  Place(Pod("research", "train", "u-train", 60, 8192, {{"tessera.dev/priority", "high"}}), "t4-a");
  Place(Pod("inference", "serve", "u-serve", 30, 4096, {{"tessera.dev/compute-policy", "elastic"}}), "t4-a");
  json d = Data();
  EXPECT_EQ(d["version"], 1);
  EXPECT_EQ(d["cluster"]["nodes"], 2);
  EXPECT_EQ(d["cluster"]["gpus"], 6);
  EXPECT_EQ(d["cluster"]["healthyGpus"], 6);
  EXPECT_EQ(d["cluster"]["coresUsed"], 900);  // 60% + 30%, in thousandths of a GPU
  EXPECT_EQ(d["cluster"]["memoryUsedMiB"], 8192 + 4096);
  EXPECT_EQ(d["cluster"]["memoryMiB"], 4 * 15360 + 2 * 81920);
  ASSERT_EQ(d["pods"].size(), 2u);
  std::map<std::string, json> pods;
  for (const json& p : d["pods"]) pods[p["name"]] = p;
  EXPECT_EQ(pods["research/train"]["namespace"], "research");
  EXPECT_EQ(pods["research/train"]["priority"], "high");
  EXPECT_EQ(pods["research/train"]["compute"], "hard");
  EXPECT_EQ(pods["inference/serve"]["priority"], "low");
  EXPECT_EQ(pods["inference/serve"]["compute"], "elastic");
  EXPECT_EQ(pods["inference/serve"]["reserved"], false);
  // Each tenant where the bind put it, with its share and memory.
  int seen = 0;
  for (int g = 0; g < 4; ++g) {
    const json& gpu = Gpu(d, "t4-a", g);
    EXPECT_EQ(d["models"][gpu[0].get<size_t>()], "T4");
    EXPECT_EQ(gpu[1], 15360);
    EXPECT_EQ(gpu[4], 1);
    int64_t cores = 0, memory = 0;
    for (const json& t : gpu[6]) {
      const json& pod = d["pods"][t[0].get<size_t>()];
      cores += t[2].get<int64_t>();
      memory += t[4].get<int64_t>();
      EXPECT_EQ(t[1], "main");
      if (pod["name"] == "research/train") {
        EXPECT_EQ(t[2], 600);
        EXPECT_EQ(t[3], 600);
        EXPECT_EQ(t[5], 8192);
      } else {
        EXPECT_EQ(t[2], 300);
        EXPECT_EQ(t[5], 4096);
      }
      ++seen;
    }
    EXPECT_EQ(gpu[2], cores);  // the GPU's compute held is its tenants'
    EXPECT_EQ(gpu[3], memory);
  }
  EXPECT_EQ(seen, 2);
  for (int g = 0; g < 2; ++g) EXPECT_TRUE(Gpu(d, "a100", g)[6].empty());
  EXPECT_EQ(d["dra"]["watched"], false);
  EXPECT_THAT(d["dra"]["note"].get<std::string>(), HasSubstr("ResourceClaims"));
}

TEST_F(PageTest, FragmentationIsFgdsMeasureSplitOverGpus) {
  // Pods of 60% make the workload: a GPU with 40% free can take none of them, so FGD counts its 400 as lost.
  for (int i = 0; i < 4; ++i) {
    Place(Pod("ns", "p" + std::to_string(i), "u" + std::to_string(i), 60, 1024), i < 2 ? "t4-a" : "a100");
  }
  for (int i = 4; i < 40; ++i) {
    const std::string name = "w" + std::to_string(i);
    absl::StatusOr<formats::PodObject> pod = formats::ParsePodObject(Pod("ns", name, name, 60, 1024));
    ASSERT_TRUE(pod.ok());
    absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(pod->spec);
    ASSERT_TRUE(request.ok());
    cache_.NoteWorkload(*request);
  }
  // A placement rebuilds the policy from the workload seen (60% pods only).
  Place(Pod("ns", "last", "u-last", 60, 1024), "t4-a");
  json d = Data();
  ASSERT_GT(d["cluster"]["typicalPods"].get<int>(), 0);
  core::Cluster cluster = cache_.Snapshot();
  PageView view = cache_.PageSnapshot();
  ASSERT_NE(view.fragmentation, nullptr);
  double total = 0;
  for (const json& n : d["nodes"]) {
    double node_sum = 0;
    for (const json& gpu : n["gpus"]) {
      const int64_t free = 1000 - gpu[2].get<int64_t>();
      // Every typical pod asks 60%: a GPU with less free loses all of it, one with more loses nothing.
      EXPECT_DOUBLE_EQ(gpu[5].get<double>(), free < 600 ? static_cast<double>(free) : 0.0) << n["name"];
      node_sum += gpu[5].get<double>();
    }
    EXPECT_NEAR(n["fragment"].get<double>(), node_sum, 0.1);
    for (const core::NodeState& ns : cluster.nodes()) {
      if (ns.name().value() == n["name"]) {
        EXPECT_NEAR(n["fragment"].get<double>(), view.fragmentation->NodeFragment(ns), 0.1) << n["name"];
      }
    }
    total += n["fragment"].get<double>();
  }
  EXPECT_NEAR(d["cluster"]["fragmentation"].get<double>(), total, 0.5);
  EXPECT_GT(total, 0);
}

TEST_F(PageTest, PendingPodsSayWhyTheyWait) {
  // 90000 MiB is more than any of these GPUs has.
  json f = Filter(Pod("batch", "huge", "u-huge", 100, 90000), {"t4-a", "a100"});
  ASSERT_TRUE(f["NodeNames"].empty()) << f.dump();
  Filter(Pod("batch", "ok", "u-ok", 10, 1024), {"t4-a", "a100"});
  json d = Data();
  ASSERT_EQ(d["pending"].size(), 2u) << d["pending"].dump();
  const json& ok = d["pending"][0];  // most recently filtered first
  EXPECT_EQ(ok["name"], "batch/ok");
  EXPECT_EQ(ok["nodesFit"], 2);
  EXPECT_THAT(ok["reason"].get<std::string>(), HasSubstr("waiting for kube-scheduler"));
  const json& huge = d["pending"][1];
  EXPECT_EQ(huge["name"], "batch/huge");
  EXPECT_EQ(huge["namespace"], "batch");
  EXPECT_EQ(huge["nodesAsked"], 2);
  EXPECT_EQ(huge["nodesFit"], 0);
  EXPECT_EQ(huge["vgpus"], 1);
  EXPECT_EQ(huge["cores"], 1000);
  EXPECT_THAT(huge["reason"].get<std::string>(), HasSubstr("0 of 2 nodes fit"));
  // Filtered again over one node: the reason is that node's, as the filter answered it.
  json again = Filter(Pod("batch", "huge", "u-huge", 100, 90000), {"t4-a"});
  std::string t4_reason = again["FailedNodes"].contains("t4-a") ? again["FailedNodes"]["t4-a"]
                                                                : again["FailedAndUnresolvableNodes"]["t4-a"];
  ASSERT_FALSE(t4_reason.empty()) << again.dump();
  d = Data();
  EXPECT_EQ(d["pending"][0]["reason"], "0 of 1 nodes fit: 1 node: " + t4_reason);
  EXPECT_EQ(d["pending"][0]["filtered"], 2);
  // Bound: no longer pending.
  Response bind = extender_.Bind(
      json{{"PodName", "ok"}, {"PodNamespace", "batch"}, {"PodUID", "u-ok"}, {"Node", "t4-a"}}.dump());
  ASSERT_EQ(json::parse(bind.body)["Error"], "") << bind.body;
  d = Data();
  ASSERT_EQ(d["pending"].size(), 1u);
  EXPECT_EQ(d["pending"][0]["name"], "batch/huge");
}

TEST_F(PageTest, PendingPodsAreBoundedAndForgottenAfterTheirTtl) {
  for (int i = 0; i < 5; ++i)
    Filter(Pod("ns", "p" + std::to_string(i), "u" + std::to_string(i), 10, 512), {"t4-a"});
  json d = Data();
  ASSERT_EQ(d["pending"].size(), 3u);  // ExtenderOptions::pending_pods
  EXPECT_EQ(d["pending"][0]["name"], "ns/p4");
  EXPECT_EQ(d["pending"][2]["name"], "ns/p2");
  clock_.Advance(std::chrono::seconds(601));
  Filter(Pod("ns", "fresh", "u-fresh", 10, 512), {"t4-a"});
  d = Data();
  ASSERT_EQ(d["pending"].size(), 1u);
  EXPECT_EQ(d["pending"][0]["name"], "ns/fresh");
}

TEST_F(PageTest, NamesAreEscapedForJsonAndScript) {
  // A reason carrying quotes, a backslash, a control character and "</script>" stays one JSON string.
  Filter(Pod("ns", "p", "u-p", 10, 512, {{"tessera.dev/priority", "urgent\"\\\x01</script>"}}), {"t4-a"});
  std::vector<PendingPod> pending = extender_.Pending();
  std::string text = PageDataJson(cache_.PageSnapshot(), pending, clock_.Now());
  EXPECT_EQ(text.find("</script>"), std::string::npos);
  json d = json::parse(text);
  ASSERT_EQ(d["pending"].size(), 1u);
  EXPECT_THAT(d["pending"][0]["reason"].get<std::string>(), HasSubstr("urgent\"\\\x01</script>"));
}

TEST(PageListenTest, LoopbackOnly) {
  EXPECT_TRUE(CheckPageListen("127.0.0.1:9404").ok());
  EXPECT_TRUE(CheckPageListen("127.0.0.2:0").ok());
  EXPECT_TRUE(CheckPageListen("localhost:9404").ok());
  EXPECT_TRUE(CheckPageListen("[::1]:9404").ok());
  for (const char* bad : {"0.0.0.0:9404", "10.0.0.1:9404", "[::]:9404", "example.com:9404"}) {
    absl::Status st = CheckPageListen(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("kubectl port-forward")) << bad;
  }
  EXPECT_FALSE(CheckPageListen("127.0.0.1").ok());  // no port
}

TEST_F(PageTest, ServesThePageAndItsDataOnLoopback) {
  Place(Pod("research", "train", "u-train", 60, 8192), "t4-a");
  PageServer page(cache_, extender_);
  ASSERT_TRUE(page.Listen("127.0.0.1:0").ok());
  EXPECT_FALSE(PageServer(cache_, extender_).Listen("0.0.0.0:0").ok());
  page.Serve();
  httplib::Client client("127.0.0.1", page.port());
  auto html = client.Get("/");
  ASSERT_TRUE(html);
  EXPECT_EQ(html->status, 200);
  EXPECT_THAT(html->get_header_value("Content-Type"), HasSubstr("text/html"));
  EXPECT_THAT(html->body, HasSubstr("ui/data"));
  // Self-contained: nothing is loaded from elsewhere.
  EXPECT_EQ(html->body.find("src=\"http"), std::string::npos);
  EXPECT_EQ(html->body.find("href=\"http"), std::string::npos);
  auto data = client.Get("/ui/data");
  ASSERT_TRUE(data);
  EXPECT_EQ(data->status, 200);
  json d = json::parse(data->body);
  EXPECT_EQ(d["cluster"]["gpus"], 6);
  EXPECT_EQ(d["pods"][0]["name"], "research/train");
  EXPECT_EQ(client.Post("/ui/data", "x", "text/plain")->status, 404);
  // Never compressed, whatever the client accepts (Brotli at httplib's quality took 15 s for 8 MB).
  auto accepting = client.Get("/ui/data", {{"Accept-Encoding", "br, gzip, deflate"}});
  ASSERT_TRUE(accepting);
  EXPECT_EQ(accepting->get_header_value("Content-Encoding"), "");
  EXPECT_EQ(json::parse(accepting->body)["cluster"]["gpus"], 6);
  page.Stop();
}

}  // namespace
}  // namespace tessera::scheduler
