// The extender verbs from request body to response body, fed the JSON kube-scheduler sends
// (../shared/k8s-api/scheduler-extender-v1.md: field names as the Go types spell them, both nodeCacheCapable
// modes, a full v1.Pod).
#include "scheduler/extender.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "formats/assignment.h"
#include "nlohmann/json.hpp"
#include "scheduler/standalone.h"
#include "test_util.h"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::tessera::testing::MakeNode;
using ::tessera::testing::ReadTestData;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

json Pod(const std::string& name, const std::string& uid, const json& limits,
         const json& annotations = json::object()) {
  return {
      {"metadata", {{"name", name}, {"namespace", "default"}, {"uid", uid}, {"annotations", annotations}}},
      {"spec", {{"containers", {{{"name", "main"}, {"resources", {{"limits", limits}}}}}}}},
      {"status", {{"phase", "Pending"}}}};
}

// A share of one GPU; memory 0 leaves the memory out (a whole GPU comes with all of it).
json Share(int cores, int memory) {
  json limits = {{"tessera.dev/gpu-cores", std::to_string(cores)}};
  if (memory > 0) limits["tessera.dev/gpu-memory"] = std::to_string(memory);
  return limits;
}

// `pod` filtered on `node` alone (it must fit there), then bound there: the bind verb's answer.
json FilterThenBind(Extender& extender, const json& pod, const std::string& node) {
  json f = json::parse(extender.Filter(json{{"Pod", pod}, {"NodeNames", {node}}}.dump()).body);
  EXPECT_THAT(f["NodeNames"].get<std::vector<std::string>>(), ElementsAre(node)) << f.dump();
  return json::parse(extender
                         .Bind(json{{"PodName", pod["metadata"]["name"]},
                                    {"PodNamespace", "default"},
                                    {"PodUID", pod["metadata"]["uid"]},
                                    {"Node", node}}
                                   .dump())
                         .body);
}

class ExtenderTest : public ::testing::Test {
 protected:
  ExtenderTest() : cache_(Options()), extender_(cache_, binder_, nullptr) {
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("t4-a", 4, core::MiB(15360), "T4")).ok());
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("t4-b", 4, core::MiB(15360), "T4")).ok());
    EXPECT_TRUE(cache_.UpsertNode(MakeNode("a100", 8, core::MiB(81920), "A100-SXM4-80GB")).ok());
  }
  static CacheOptions Options() {
    CacheOptions o;
    o.policy = "tessera";
    o.seed = 42;
    return o;
  }
  json Filter(const json& pod, const std::vector<std::string>& nodes) {
    Response r = extender_.Filter(json{{"Pod", pod}, {"Nodes", nullptr}, {"NodeNames", nodes}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  // One T4 node, "solo", added to `cache` and filled through `extender` by two low-priority pods: low-a (40%,
  // UID la) and low-b (60%, lb). A high-priority pod placed there compresses both.
  static void BindTwoLowPriorityPods(ClusterCache& cache, Extender& extender) {
    ASSERT_TRUE(cache.UpsertNode(MakeNode("solo", 1, core::MiB(15360), "T4")).ok());
    EXPECT_EQ(FilterThenBind(extender, Pod("low-a", "la", Share(40, 1024)), "solo")["Error"], "");
    EXPECT_EQ(FilterThenBind(extender, Pod("low-b", "lb", Share(60, 1024)), "solo")["Error"], "");
  }
  json Bind(const std::string& name, const std::string& uid, const std::string& node) {
    Response r = extender_.Bind(
        json{{"PodName", name}, {"PodNamespace", "default"}, {"PodUID", uid}, {"Node", node}}.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    return json::parse(r.body);
  }
  ClusterCache cache_;
  StandaloneBinder binder_;
  Extender extender_;
};

TEST_F(ExtenderTest, FilterWithNodeNamesAnswersNodeNames) {
  json pod = json::parse(ReadTestData("extender/pod-share.json"));  // asks for T4 or A100, 30% + 4 GiB
  json out = Filter(pod, {"t4-a", "a100", "cpu-only"});
  EXPECT_TRUE(out["Nodes"].is_null());
  EXPECT_THAT(out["NodeNames"].get<std::vector<std::string>>(), UnorderedElementsAre("t4-a", "a100"));
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["cpu-only"].get<std::string>(), HasSubstr("no Tessera GPU"));
  EXPECT_EQ(out["Error"], "");
  EXPECT_TRUE(out.contains("FailedNodes"));
}

TEST_F(ExtenderTest, NoCandidateNodesMeansNoneFit) {
  json out = Filter(Pod("p", "u1", Share(30, 1024)), {});
  EXPECT_TRUE(out["NodeNames"].empty());
  Response r = extender_.Prioritize(
      json{{"Pod", Pod("p", "u1", Share(30, 1024))}, {"NodeNames", json::array()}}.dump());
  EXPECT_EQ(r.body, "[]");
}

TEST_F(ExtenderTest, NodeNamesAreReadInAnyCaseAndEscapedOnTheWayOut) {
  ASSERT_TRUE(cache_.UpsertNode(MakeNode("we\"ird", 1, core::MiB(15360), "T4")).ok());
  Response r = extender_.Filter(
      json{{"pod", Pod("p", "u1", Share(30, 1024))}, {"nodenames", {"we\"ird", "t4-a"}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json out = json::parse(r.body);
  EXPECT_THAT(out["NodeNames"].get<std::vector<std::string>>(), UnorderedElementsAre("we\"ird", "t4-a"));
}

TEST_F(ExtenderTest, FilterWithNodeListAnswersTheFittingNodeObjects) {
  json pod = Pod("p", "u1", Share(50, 20000));  // 20000 MiB: only the A100s have it
  json nodes = {{"kind", "NodeList"},
                {"items",
                 {{{"metadata", {{"name", "t4-a"}, {"labels", {{"zone", "a"}}}}}},
                  {{"metadata", {{"name", "a100"}, {"labels", {{"zone", "b"}}}}}}}}};
  Response r = extender_.Filter(json{{"Pod", pod}, {"Nodes", nodes}, {"NodeNames", nullptr}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json out = json::parse(r.body);
  EXPECT_TRUE(out["NodeNames"].is_null());
  ASSERT_EQ(out["Nodes"]["items"].size(), 1u);
  EXPECT_EQ(out["Nodes"]["items"][0]["metadata"]["name"], "a100");
  EXPECT_EQ(out["Nodes"]["items"][0]["metadata"]["labels"]["zone"], "b");  // the object as sent
  // A T4 has 15360 MiB: no preemption can make 20000 fit there.
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["t4-a"].get<std::string>(), HasSubstr("15360"));
}

// A node named twice used to be answered as the object once and a `null` item the second time.
TEST_F(ExtenderTest, NodeListNamingANodeTwiceIsRefused) {
  json item = {{"metadata", {{"name", "a100"}}}};
  json nodes = {{"kind", "NodeList"}, {"items", {item, {{"metadata", {{"name", "t4-a"}}}}, item}}};
  Response r = extender_.Filter(
      json{{"Pod", Pod("p", "u1", Share(50, 20000))}, {"Nodes", nodes}, {"NodeNames", nullptr}}.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("Nodes.items names node a100 twice"));
  EXPECT_THAT(r.body, ::testing::Not(HasSubstr("null")));
}

// HAMi's use-gputype names a model by a word of it, in any case (docs/migration.md); Tessera's gpu-model is the
// model's exact name.
TEST_F(ExtenderTest, HamiGpuTypeMatchesAWordOfTheModelTesseraModelTheWholeName) {
  json hami = Pod("h", "u1", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1024"}},
                  {{"nvidia.com/use-gputype", "a100"}});
  EXPECT_THAT(Filter(hami, {"t4-a", "a100"})["NodeNames"].get<std::vector<std::string>>(), ElementsAre("a100"));
  json excluded = Pod("x", "u2", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "1024"}},
                      {{"nvidia.com/nouse-gputype", "A100"}});
  EXPECT_THAT(Filter(excluded, {"t4-a", "a100"})["NodeNames"].get<std::vector<std::string>>(),
              ElementsAre("t4-a"));
  json exact = Pod("t", "u3", Share(30, 1024), {{"tessera.dev/gpu-model", "A100"}});
  json out = Filter(exact, {"t4-a", "a100"});
  EXPECT_TRUE(out["NodeNames"].empty());
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["a100"].get<std::string>(), HasSubstr("allows only A100"));
  out = Filter(Pod("w", "u4", Share(30, 1024), {{"nvidia.com/use-gputype", "v100"}}), {"t4-a", "a100"});
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["a100"].get<std::string>(),
              HasSubstr("allows only models containing v100"));
}

TEST_F(ExtenderTest, FieldNamesAreReadCaseInsensitivelyAsGoDoes) {
  json pod = Pod("p", "u1", Share(30, 1024));
  Response r = extender_.Filter(json{{"pod", pod}, {"nodenames", {"t4-a"}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(json::parse(r.body)["NodeNames"].get<std::vector<std::string>>(), ElementsAre("t4-a"));
}

TEST_F(ExtenderTest, ImpossibleRequestIsUnresolvableEverywhereWithTheReason) {
  json out =
      Filter(Pod("p", "u1", {{"tessera.dev/gpu-cores", "150"}, {"tessera.dev/gpu", "1"}}), {"t4-a", "a100"});
  EXPECT_TRUE(out["NodeNames"].empty());
  ASSERT_EQ(out["FailedAndUnresolvableNodes"].size(), 2u);
  EXPECT_THAT(out["FailedAndUnresolvableNodes"]["t4-a"].get<std::string>(), HasSubstr("150"));
}

// 16 containers at the per-container cap (2^50 cores) and one more: the sum used to wrap past 2^64 to one
// core, and the pod was placed on a 48-core node.
TEST_F(ExtenderTest, HostSumsThatWouldWrapAreRefused) {
  core::NodeInfo node = MakeNode("cpu48", 1, core::MiB(15360), "T4");
  node.cpu = core::MilliCpu(48000);
  ASSERT_TRUE(cache_.UpsertNode(node).ok());
  json pod = Pod("p", "u1", {{"tessera.dev/gpu", "1"}, {"cpu", "1125899906842624"}});
  for (int i = 1; i < 16; ++i) {
    pod["spec"]["containers"].push_back(
        {{"name", "c" + std::to_string(i)}, {"resources", {{"limits", {{"cpu", "1125899906842624"}}}}}});
  }
  pod["spec"]["containers"].push_back(
      {{"name", "last"}, {"resources", {{"limits", {{"cpu", "432345564227568616m"}}}}}});
  json out = Filter(pod, {"cpu48"});
  EXPECT_TRUE(out["NodeNames"].empty()) << out.dump();
  EXPECT_THAT(out.dump(), HasSubstr("more cpu in all than any node has"));
}

TEST_F(ExtenderTest, PodsWithoutGpuAreNotJudged) {
  json out = Filter(Pod("web", "u1", {{"cpu", "1"}}), {"t4-a", "cpu-only"});
  EXPECT_THAT(out["NodeNames"].get<std::vector<std::string>>(), ElementsAre("t4-a", "cpu-only"));
}

TEST_F(ExtenderTest, FullNodeFailsWithAReasonPreemptionCouldFix) {
  // Fill t4-a's four GPUs with 80% each; a 40% share then fits only on t4-b.
  for (int i = 0; i < 4; ++i) {
    const std::string uid = "fill-" + std::to_string(i);
    Filter(Pod(uid, uid, Share(80, 1024)), {"t4-a"});
    EXPECT_EQ(Bind(uid, uid, "t4-a")["Error"], "");
  }
  json out = Filter(Pod("p", "u1", Share(40, 1024)), {"t4-a", "t4-b"});
  EXPECT_THAT(out["NodeNames"].get<std::vector<std::string>>(), ElementsAre("t4-b"));
  EXPECT_THAT(out["FailedNodes"]["t4-a"].get<std::string>(), HasSubstr("compute"));
  EXPECT_FALSE(out["FailedAndUnresolvableNodes"].contains("t4-a"));
}

TEST_F(ExtenderTest, PrioritizeScoresWithinZeroToTenAndPrefersTheFragment) {
  // A 20% tenant on t4-a: tessera packs the next share beside it, leaving t4-b whole.
  Filter(Pod("first", "u0", Share(20, 1024)), {"t4-a"});
  ASSERT_EQ(Bind("first", "u0", "t4-a")["Error"], "");
  // Give the policy a workload that values whole GPUs (whole-GPU pods are typical).
  for (int i = 0; i < 20; ++i) {
    core::PodRequest w = testing::MakePod("w" + std::to_string(i), {testing::Share(100)});
    cache_.NoteWorkload(w);
  }
  Response r = extender_.Prioritize(
      json{{"Pod", Pod("p", "u1", Share(30, 1024))}, {"NodeNames", {"t4-a", "t4-b"}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json out = json::parse(r.body);
  ASSERT_TRUE(out.is_array());
  std::map<std::string, int64_t> score;
  for (const json& h : out) {
    EXPECT_GE(h["Score"].get<int64_t>(), 0);
    EXPECT_LE(h["Score"].get<int64_t>(), 10);
    score[h["Host"]] = h["Score"];
  }
  EXPECT_EQ(score["t4-a"], 10);
  EXPECT_LT(score["t4-b"], 10);
}

// A pod is parsed once per resourceVersion (the API server gives a stored object a new one whenever it
// changes): prioritize after filter, and filter again while it waits, take the request filter parsed; a new
// version is parsed again, and its bind places what the new version asks.
TEST_F(ExtenderTest, APodIsParsedOncePerResourceVersion) {
  json pod = Pod("p", "u1", Share(30, 1024));
  pod["metadata"]["resourceVersion"] = "7";
  Filter(pod, {"t4-a"});
  EXPECT_EQ(extender_.counters().parsed, 1u);
  Response r = extender_.Prioritize(json{{"Pod", pod}, {"NodeNames", {"t4-a", "t4-b"}}}.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  Filter(pod, {"t4-a", "t4-b"});
  EXPECT_EQ(extender_.counters().parsed, 1u);

  pod["metadata"]["resourceVersion"] = "8";
  pod["spec"]["containers"][0]["resources"]["limits"] = Share(60, 2048);
  Filter(pod, {"t4-a"});
  EXPECT_EQ(extender_.counters().parsed, 2u);
  ASSERT_EQ(Bind("p", "u1", "t4-a")["Error"], "");
  std::optional<PodEntry> entry = cache_.FindPod(core::PodUid("u1"));
  ASSERT_TRUE(entry);
  EXPECT_EQ(entry->placement.containers[0].vgpus[0].cores.value(), 600);

  // Without a resourceVersion (not an object the API server stored) every verb parses.
  json bare = Pod("q", "u2", Share(10, 512));
  Filter(bare, {"t4-b"});
  Filter(bare, {"t4-b"});
  EXPECT_EQ(extender_.counters().parsed, 4u);
}

TEST_F(ExtenderTest, BindRecordsTheAssignmentAndHoldsTheShare) {
  Filter(Pod("p", "u1", Share(60, 2048)), {"t4-a"});
  EXPECT_EQ(Bind("p", "u1", "t4-a")["Error"], "");
  std::map<std::string, std::string> written = binder_.Assignments();
  ASSERT_TRUE(written.contains("default/p"));
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(written["default/p"]);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->node.value(), "t4-a");
  ASSERT_EQ(a->containers.size(), 1u);
  EXPECT_EQ(a->containers[0].vgpus[0].cores.value(), 600);
  EXPECT_EQ(a->containers[0].vgpus[0].memory.value(), 2048);
  std::optional<PodEntry> entry = cache_.FindPod(core::PodUid("u1"));
  ASSERT_TRUE(entry);
  EXPECT_FALSE(entry->reserved);
  // A retried bind (kube-scheduler's timeout) is answered alike and takes nothing more.
  EXPECT_EQ(Bind("p", "u1", "t4-a")["Error"], "");
  EXPECT_EQ(cache_.pod_count(), 1);
}

TEST_F(ExtenderTest, BindThatDoesNotFitSaysWhyAndHoldsNothing) {
  Filter(Pod("big", "u1", Share(50, 20000)), {"a100"});
  json out = Bind("big", "u1", "t4-a");
  EXPECT_THAT(out["Error"].get<std::string>(), HasSubstr("15360"));
  EXPECT_EQ(cache_.pod_count(), 0);
}

TEST_F(ExtenderTest, BindOfAPodNeverFilteredNeedsAPodSource) {
  json out = Bind("ghost", "u9", "t4-a");
  EXPECT_THAT(out["Error"].get<std::string>(), HasSubstr("never filtered"));
}

class FailingBinder : public Binder {
 public:
  absl::Status Bind(const BindTarget&, const core::Placement&) override {
    return absl::UnavailableError("the API server is unreachable");
  }
  absl::Status UpdateAssignment(const BindTarget&, const core::Placement&) override {
    return absl::OkStatus();
  }
};

TEST_F(ExtenderTest, FailedBindGivesTheShareBack) {
  FailingBinder failing;
  Extender extender(cache_, failing, nullptr);
  ASSERT_EQ(
      extender.Filter(json{{"Pod", Pod("p", "u1", Share(100, 0))}, {"NodeNames", {"t4-a"}}}.dump()).status,
      200);
  Response r = extender.Bind(R"({"PodName":"p","PodNamespace":"default","PodUID":"u1","Node":"t4-a"})");
  EXPECT_THAT(json::parse(r.body)["Error"].get<std::string>(), HasSubstr("unreachable"));
  EXPECT_EQ(cache_.pod_count(), 0);
  EXPECT_EQ(cache_.Snapshot().FindNode(core::NodeName("t4-a"))->whole_free_gpus(), 4);
}

TEST_F(ExtenderTest, PreemptKeepsOnlyNodesWhereTheVictimsFreeEnough) {
  // t4-a: four 80% tenants, one per GPU. t4-b: eight 45% tenants, two per GPU. A high-priority whole GPU
  // needs a victim: on t4-a evicting one 80% tenant frees a GPU; on t4-b evicting one 45% tenant frees 55%.
  for (int i = 0; i < 8; ++i) {
    for (const char* node : {"t4-a", "t4-b"}) {
      if (node[3] == 'a' && i >= 4) continue;
      const std::string uid = std::string(node) + "-" + std::to_string(i);
      Filter(Pod(uid, uid, Share(node[3] == 'a' ? 80 : 45, 1024)), {node});
      ASSERT_EQ(Bind(uid, uid, node)["Error"], "");
    }
  }
  ASSERT_EQ(cache_.Snapshot().FindNode(core::NodeName("t4-b"))->whole_free_gpus(), 0);
  json args = {{"Pod", Pod("hp", "u-hp", {{"tessera.dev/gpu", "1"}, {"tessera.dev/gpu-cores", "100"}})},
               {"NodeNameToVictims", nullptr},
               {"NodeNameToMetaVictims",
                {{"t4-a", {{"Pods", {{{"UID", "t4-a-0"}}}}, {"NumPDBViolations", 0}}},
                 {"t4-b", {{"Pods", {{{"UID", "t4-b-0"}}}}, {"NumPDBViolations", 1}}}}}};
  Response r = extender_.Preempt(args.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  json out = json::parse(r.body)["NodeNameToMetaVictims"];
  ASSERT_TRUE(out.contains("t4-a"));
  EXPECT_FALSE(out.contains("t4-b"));
  EXPECT_EQ(out["t4-a"]["Pods"][0]["UID"], "t4-a-0");
  EXPECT_EQ(out["t4-a"]["NumPDBViolations"], 0);
  // Nothing was evicted for real.
  EXPECT_EQ(cache_.pod_count(), 12);
}

TEST_F(ExtenderTest, PreemptReadsFullVictimPodsToo) {
  for (int i = 0; i < 4; ++i) {
    const std::string uid = "v" + std::to_string(i);
    Filter(Pod(uid, uid, Share(100, 0)), {"t4-a"});
    ASSERT_EQ(Bind(uid, uid, "t4-a")["Error"], "");
  }
  json args = {{"Pod", Pod("hp", "u-hp", Share(50, 1024))},
               {"NodeNameToVictims",
                {{"t4-a", {{"Pods", {Pod("v0", "v0", Share(100, 0))}}, {"NumPDBViolations", 0}}}}}};
  json out = json::parse(extender_.Preempt(args.dump()).body)["NodeNameToMetaVictims"];
  ASSERT_TRUE(out.contains("t4-a"));
  EXPECT_EQ(out["t4-a"]["Pods"][0]["UID"], "v0");
}

TEST_F(ExtenderTest, MalformedBodiesGet400WithAClearError) {
  for (auto [verb, body] : std::vector<std::pair<std::string, std::string>>{
           {"filter", "{not json"},
           {"filter", "[1,2]"},
           {"filter", R"({"NodeNames":["a"]})"},
           {"filter", R"({"Pod":{"metadata":{"name":"p"},"spec":{"containers":"x"}},"NodeNames":["a"]})"},
           {"filter", R"({"Pod":{"metadata":{"name":"p"}},"NodeNames":"a"})"},
           {"filter", R"({"Pod":{"metadata":{"name":"p"}},"NodeNames":["a",1]})"},
           {"filter", R"({"Pod":{"metadata":{"name":"p"}},"nodenames":[{"name":"a"}]})"},
           {"prioritize", "{"},
           {"bind", R"({"PodName":"p"})"},
           {"bind", "null"},
           {"preempt", R"({"Pod":{"metadata":{"name":"p"}},"NodeNameToMetaVictims":{"n":{"Pods":[{}]}}})"},
       }) {
    Response r = verb == "filter"       ? extender_.Filter(body)
                 : verb == "prioritize" ? extender_.Prioritize(body)
                 : verb == "bind"       ? extender_.Bind(body)
                                        : extender_.Preempt(body);
    EXPECT_EQ(r.status, 400) << verb << " " << body;
    json err = json::parse(r.body);
    EXPECT_THAT(err["Error"].get<std::string>(), HasSubstr(verb)) << body;
  }
  EXPECT_EQ(extender_.counters().bad_request, 11u);
}

// A node object nested 100,000 levels deep in a NodeList used to be copied and echoed back through recursive
// code and crash the scheduler (SIGSEGV); it is refused before anything walks it.
TEST_F(ExtenderTest, DeeplyNestedBodiesAreRefusedNotWalked) {
  const std::string pod = Pod("p", "u1", Share(50, 1024)).dump();
  for (size_t depth : {size_t{300}, size_t{100000}, size_t{300000}}) {
    const std::string deep = std::string(depth, '[') + std::string(depth, ']');
    const std::string node = R"({"metadata":{"name":"a100","x":)" + deep + "}}";
    const std::string list = R"({"Pod":)" + pod + R"(,"Nodes":{"items":[)" + node + "]}}";
    for (Response r : {extender_.Filter(list), extender_.Prioritize(list), extender_.Preempt(list)}) {
      EXPECT_EQ(r.status, 400);
      EXPECT_THAT(r.body, HasSubstr("nested deeper than 128")) << depth;
    }
    const std::string in_pod =
        R"({"Pod":{"metadata":{"name":"p"},"spec":)" + deep + R"(},"NodeNames":["a"]})";
    EXPECT_EQ(extender_.Filter(in_pod).status, 400);
    const std::string bind = R"({"PodName":"p","PodNamespace":"d","PodUID":"u","Node":"n","x":)" + deep + "}";
    EXPECT_THAT(extender_.Bind(bind).body, HasSubstr("nested deeper"));
  }
  // A node object of ordinary depth is still echoed back whole.
  std::string ok_deep = std::string(100, '[') + std::string(100, ']');
  const std::string list =
      R"({"Pod":)" + pod + R"(,"Nodes":{"items":[{"metadata":{"name":"a100","x":)" + ok_deep + "}}]}}";
  Response r = extender_.Filter(list);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["Nodes"]["items"][0]["metadata"]["x"].dump(), ok_deep);
}

// Found by fuzz/admission_review_fuzz (the same code serves the extender): an error quoting invalid UTF-8
// must still be a JSON answer.
TEST_F(ExtenderTest, InvalidUtf8GetsAJsonAnswer) {
  const std::string body =
      std::string(R"({"Pod":{"metadata":{"name":")") + "\xA1\xA1" + R"("}},"NodeNames":["a"]})";
  for (Response r :
       {extender_.Filter(body), extender_.Prioritize(body), extender_.Preempt(body), extender_.Bind(body)}) {
    EXPECT_EQ(r.status, 400);
    EXPECT_TRUE(json::accept(r.body)) << r.body;
  }
}

// NumPDBViolations is Go's int64: 2^64-1 is not a count, and used to come back as -1.
TEST_F(ExtenderTest, PdbViolationsOutsideInt64AreRefused) {
  json args = {{"Pod", Pod("hp", "u-hp", Share(50, 1024))},
               {"NodeNameToMetaVictims",
                {{"t4-a", {{"Pods", {{{"UID", "x"}}}}, {"NumPDBViolations", 18446744073709551615ull}}}}}};
  Response r = extender_.Preempt(args.dump());
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_THAT(r.body, HasSubstr("NumPDBViolations"));
  args["NodeNameToMetaVictims"]["t4-a"]["NumPDBViolations"] = 9223372036854775807ll;
  r = extender_.Preempt(args.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(json::parse(r.body)["NodeNameToMetaVictims"]["t4-a"]["NumPDBViolations"], 9223372036854775807ll);
}

// Pods remembered for their bind are bounded by bytes, not only by count: 60 pods with 8 MB annotations used
// to keep 1.7 GB. (Such pods are now refused outright, above Kubernetes' 256 KiB of annotations; the budget
// still holds for pods within it.)
TEST(ExtenderMemoryTest, RememberedPodsAreBoundedByBytes) {
  CacheOptions o;
  o.policy = "binpack";
  ClusterCache cache(o);
  ASSERT_TRUE(cache.UpsertNode(MakeNode("t4-a", 4, core::MiB(15360), "T4")).ok());
  StandaloneBinder binder;
  ExtenderOptions eo;
  eo.remembered_bytes = 1 << 20;
  Extender extender(cache, binder, nullptr, {}, eo);
  std::string models;
  while (models.size() < (150u << 10))
    models += "A100-SXM4-80GB-variant-" + std::to_string(models.size()) + ",";
  models += "T4";
  for (int i = 0; i < 20; ++i) {
    const std::string uid = "u" + std::to_string(i);
    json pod = Pod("p" + uid, uid, Share(10, 100), {{"tessera.dev/gpu-model", models}});
    Response r = extender.Filter(json{{"Pod", pod}, {"NodeNames", {"t4-a"}}}.dump());
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_LE(extender.remembered_bytes(), eo.remembered_bytes);
  }
  EXPECT_GT(extender.remembered_bytes(), 512u << 10);  // the newest ones are kept
  // The newest pod binds from memory.
  Response bind =
      extender.Bind(R"({"PodName":"pu19","PodNamespace":"default","PodUID":"u19","Node":"t4-a"})");
  EXPECT_EQ(json::parse(bind.body)["Error"], "");
}

// Every write in the order the extender made it ("bind <pod>" / "update <pod>"); StandaloneBinder's
// UpdateAssignment binds again, which is not the extender's call.
class RecordingBinder : public StandaloneBinder {
 public:
  absl::Status Bind(const BindTarget& pod, const core::Placement& placement) override {
    if (!updating_) calls.push_back("bind " + pod.name);
    return StandaloneBinder::Bind(pod, placement);
  }
  absl::Status UpdateAssignment(const BindTarget& pod, const core::Placement& placement) override {
    calls.push_back("update " + pod.name);
    if (refused_updates.erase(pod.name) > 0) return absl::UnavailableError("the API server is unreachable");
    updating_ = true;
    absl::Status s = StandaloneBinder::UpdateAssignment(pod, placement);
    updating_ = false;
    return s;
  }
  std::vector<std::string> calls;
  std::set<std::string> refused_updates;  // pods whose next UpdateAssignment fails

 private:
  bool updating_ = false;
};

// The fault harness (bench/chaos.py --seeds 3, docs/faults.md) SIGKILLed the leading tessera-scheduler
// between a high-priority pod's bind and housekeeping's writing of the shares it compressed: the pods'
// annotations held 112.5% of a GPU from then on, the next leader counted the new pod nowhere
// (TesseraBadAssignment) and tessera-node refused its Allocate. The compressed shares are written first now.
TEST_F(ExtenderTest, TheSharesABindCompressesAreWrittenBeforeTheBind) {
  ClusterCache cache(Options());
  RecordingBinder binder;
  Extender extender(cache, binder, nullptr);
  BindTwoLowPriorityPods(cache, extender);
  auto filter_bind = [&](const json& pod) { return FilterThenBind(extender, pod, "solo"); };
  binder.calls.clear();
  EXPECT_EQ(filter_bind(Pod("high", "h", Share(30, 1024), {{"tessera.dev/priority", "high"}}))["Error"], "");
  // Before housekeeping runs: both lowered shares are written, then the bind.
  ASSERT_EQ(binder.calls.size(), 3u) << ::testing::PrintToString(binder.calls);
  EXPECT_THAT(std::vector<std::string>(binder.calls.begin(), binder.calls.begin() + 2),
              ::testing::UnorderedElementsAre("update low-a", "update low-b"));
  EXPECT_EQ(binder.calls[2], "bind high");
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(binder.Assignments()["default/low-a"]);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->containers[0].vgpus[0].cores.value(), 250);
  // Nothing is left for housekeeping.
  binder.calls.clear();
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  EXPECT_TRUE(binder.calls.empty()) << ::testing::PrintToString(binder.calls);
}

// A compressed share whose write failed used to be left to housekeeping, and the pod was bound meanwhile: the
// pods' annotations held more than the GPU until housekeeping's next write, and a leader paused before it (the
// fault harness's "pause the leading tessera-scheduler past its lease") wrote nothing until its Lease moved.
TEST_F(ExtenderTest, APodIsNotBoundBeforeEveryShareItCompressesIsWritten) {
  ClusterCache cache(Options());
  RecordingBinder binder;
  Extender extender(cache, binder, nullptr);
  BindTwoLowPriorityPods(cache, extender);
  auto filter_bind = [&](const json& pod) { return FilterThenBind(extender, pod, "solo"); };
  binder.calls.clear();
  binder.refused_updates = {"low-b"};
  const json high = Pod("high", "h", Share(30, 1024), {{"tessera.dev/priority", "high"}});
  const std::string error = filter_bind(high)["Error"];
  EXPECT_THAT(error, ::testing::HasSubstr("default/low-b"));
  EXPECT_THAT(error, ::testing::HasSubstr("could not be written"));
  EXPECT_THAT(binder.calls, ::testing::Not(::testing::Contains("bind high")));
  // Not held: the GPU's share is the low pods' again, and both get it back in their assignments (low-a's
  // lowered share was written).
  EXPECT_FALSE(cache.FindPod(core::PodUid("h")).has_value());
  EXPECT_EQ(cache.FindPod(core::PodUid("la"))->placement.containers[0].vgpus[0].cores.value(), 400);
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  for (const char* pod : {"default/low-a", "default/low-b"}) {
    absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(binder.Assignments()[pod]);
    ASSERT_TRUE(a.ok()) << pod;
    EXPECT_EQ(a->containers[0].vgpus[0].requested.value(), 0) << pod << " is still compressed";
  }
  // kube-scheduler's retry, with the API back: compressed, then bound.
  binder.calls.clear();
  EXPECT_EQ(filter_bind(high)["Error"], "");
  ASSERT_EQ(binder.calls.size(), 3u) << ::testing::PrintToString(binder.calls);
  EXPECT_EQ(binder.calls[2], "bind high");
}

// A standby replica: it may not write shares (ApiBackend::UpdateAssignment), and reads pods from its informer.
class StandbyBinder : public Binder {
 public:
  absl::Status Bind(const BindTarget&, const core::Placement&) override {
    return absl::UnavailableError("not the leader");
  }
  absl::Status UpdateAssignment(const BindTarget&, const core::Placement&) override {
    ++refused;
    return absl::FailedPreconditionError("not the leader");
  }
  int refused = 0;
};
// A pod bound to GPU 0 of `node` with `cores` of it, as the leader's assignment says.
json BoundTo(const std::string& name, const std::string& uid, int cores, int requested,
             const json& annotations = json::object()) {
  core::Placement p;
  p.node = core::NodeName("solo");
  core::ContainerAssignment c;
  c.name = "main";
  core::VGpuAssignment v;
  v.gpu_index = 0;
  v.uuid = core::GpuUuid("GPU-solo-0");
  v.cores = core::MilliGpu(cores * 10);
  v.requested = core::MilliGpu(requested * 10);
  v.memory = core::MiB(1024);
  c.vgpus.push_back(v);
  p.containers.push_back(c);
  json pod = Pod(name, uid, Share(requested > 0 ? requested : cores, 1024), annotations);
  pod["spec"]["nodeName"] = "solo";
  pod["metadata"]["annotations"][formats::kAnnotationAssignment] = formats::FormatAssignment(p);
  return pod;
}

// A standby's ledger gives compressed pods their share back when it sees the high-priority pod leave, as the
// leader's does. Written by the standby, that give-back could land after the leader had compressed the pods
// again for another high-priority pod: the GPU over its capacity in the pods' annotations (the fault harness).
// The standby writes no share, and its ledger takes the leader's next assignment of the pod, where kept as its
// own unwritten change it passed over them until one matched. (A new leader rebuilds its ledger from the pods
// anyway: ApiBackend.)
TEST_F(ExtenderTest, AStandbyWritesNoShareAndTakesTheLeadersAssignments) {
  ClusterCache cache(Options());
  ASSERT_TRUE(cache.UpsertNode(MakeNode("solo", 1, core::MiB(15360), "T4")).ok());
  StandbyBinder binder;
  Extender extender(cache, binder, nullptr);
  const json high = {{"tessera.dev/priority", "high"}};
  auto observe = [&](const json& pod) { return cache.ObservePod(formats::ParsePodObject(pod).value()); };
  const auto cores_of_low_a = [&] {
    return cache.FindPod(core::PodUid("la"))->placement.containers[0].vgpus[0].cores.value();
  };
  // The leader compressed low-a (40) and low-b (60) for a high-priority pod taking 30.
  ASSERT_TRUE(observe(BoundTo("low-a", "la", 25, 40)).ok());
  ASSERT_TRUE(observe(BoundTo("low-b", "lb", 45, 60)).ok());
  ASSERT_TRUE(observe(BoundTo("high", "h", 30, 0, high)).ok());
  // It leaves: this ledger gives the shares back, and housekeeping's round here writes nothing.
  cache.ForgetPod(core::PodUid("h"));
  EXPECT_EQ(cores_of_low_a(), 400);
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  EXPECT_EQ(binder.refused, 2);
  // The leader compressed low-a for the next one before it wrote the give-back: taken.
  ASSERT_TRUE(observe(BoundTo("low-a", "la", 30, 40)).ok());
  EXPECT_EQ(cores_of_low_a(), 300);
  // Nothing is retried.
  binder.refused = 0;
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  EXPECT_EQ(binder.refused, 0);
}

TEST_F(ExtenderTest, CompressionReachesTheCompressedPodsAssignment) {
  ClusterCache cache(Options());
  StandaloneBinder binder;
  Extender extender(cache, binder, nullptr);
  BindTwoLowPriorityPods(cache, extender);
  auto filter_bind = [&](const json& pod) { return FilterThenBind(extender, pod, "solo"); };
  // The seed's example: B (high) asks 70 where 0 is free... here A and B low hold 40 + 60; a high-priority
  // pod asks 30: D = 30, N = 2, R = 15: both give 15.
  EXPECT_EQ(filter_bind(Pod("high", "h", Share(30, 1024), {{"tessera.dev/priority", "high"}}))["Error"], "");
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  std::map<std::string, std::string> written = binder.Assignments();
  absl::StatusOr<formats::Assignment> a = formats::ParseAssignment(written["default/low-a"]);
  absl::StatusOr<formats::Assignment> b = formats::ParseAssignment(written["default/low-b"]);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->containers[0].vgpus[0].cores.value(), 250);
  EXPECT_EQ(a->containers[0].vgpus[0].requested.value(), 400);
  EXPECT_EQ(b->containers[0].vgpus[0].cores.value(), 450);
  // The high-priority pod leaves: both get their share back, and the assignments say so.
  ASSERT_EQ(
      ReleaseStandalone(cache, binder, R"({"PodUID":"h","PodNamespace":"default","PodName":"high"})").status,
      200);
  EXPECT_TRUE(extender.SyncChangedShares().empty());
  written = binder.Assignments();
  a = formats::ParseAssignment(written["default/low-a"]);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->containers[0].vgpus[0].cores.value(), 400);
  EXPECT_EQ(a->containers[0].vgpus[0].requested.value(), 0);
}

}  // namespace
}  // namespace tessera::scheduler
