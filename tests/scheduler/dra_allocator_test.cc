// DRA placement by Tessera: the selector subset and the allocator (src/scheduler/dra_selector.h,
// dra_allocator.h). The slices here are what tessera-node publishes (src/node/dra_claim.cc, ResourceSliceFor;
// docs/dra.md, "What the node publishes"); the claims are written as resource.k8s.io/v1 states them.
#include "scheduler/dra_allocator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scheduler/dra_selector.h"
#include "scheduler/dra_slice.h"

namespace tessera::scheduler::dra {
namespace {

using Json = nlohmann::json;

std::map<std::string, AttributeValue> Attrs(std::string model, int64_t index) {
  return {{"gpu.tessera.dev/model", AttributeValue::String(std::move(model))},
          {"gpu.tessera.dev/index", AttributeValue::Int(index)}};
}

Verdict Eval(const std::string& expression, const std::map<std::string, AttributeValue>& attrs) {
  absl::StatusOr<Selector> s = Selector::Compile(expression);
  EXPECT_TRUE(s.ok()) << expression << ": " << s.status();
  if (!s.ok()) return Verdict::kError;
  return s->Evaluate({"gpu.tessera.dev", &attrs});
}

TEST(DraSelectorTest, EvaluatesTheSubsetWithCelsMeaning) {
  auto a = Attrs("Tesla V100-SXM2-32GB", 3);
  EXPECT_EQ(Eval(R"(device.driver == "gpu.tessera.dev")", a), Verdict::kMatch);
  EXPECT_EQ(Eval(R"(device.attributes["gpu.tessera.dev"].model == 'Tesla V100-SXM2-32GB')", a),
            Verdict::kMatch);
  EXPECT_EQ(Eval(R"(device.attributes["gpu.tessera.dev"]["index"] >= 4)", a), Verdict::kNoMatch);
  EXPECT_EQ(Eval(R"(!(device.attributes["gpu.tessera.dev"].index < 2) && device.driver != "x")", a),
            Verdict::kMatch);
  // A missing attribute or a comparison across types is an error (CEL: no such key / no such overload) ...
  EXPECT_EQ(Eval(R"(device.attributes["gpu.tessera.dev"].memoryClass == "x")", a), Verdict::kError);
  EXPECT_EQ(Eval(R"(device.attributes["gpu.tessera.dev"].index == "3")", a), Verdict::kError);
  // ... that && and || absorb when the other side decides (CEL's commutative logic operators).
  EXPECT_EQ(Eval(R"(device.attributes["gpu.tessera.dev"].missing == 1 || true)", a), Verdict::kMatch);
  EXPECT_EQ(Eval(R"(false && device.attributes["gpu.tessera.dev"].missing == 1)", a), Verdict::kNoMatch);
  EXPECT_EQ(Eval(R"(true && device.attributes["gpu.tessera.dev"].missing == 1)", a), Verdict::kError);
}

TEST(DraSelectorTest, RefusesWhatItDoesNotEvaluate) {
  for (const char* e : {R"(device.capacity["gpu.tessera.dev"].memory.compareTo(quantity("16Gi")) >= 0)",
                        R"("model" in device.attributes["gpu.tessera.dev"])",
                        R"(device.attributes["gpu.tessera.dev"].model.startsWith("Tesla"))",
                        R"(device.driver == "a\u0041")", R"(device.driver == "open)", "", "device.driver ==",
                        "device.attributes[gpu].model", R"(device.attributes["gpu.tessera.dev"][model])"}) {
    EXPECT_FALSE(Selector::Compile(e).ok()) << e;
  }
}

// Found by fuzz/dra_selector_fuzz: a quoted string was read from wherever it should start, quote or not, so a
// text cut short after "[" read one byte past its end (heap-buffer-overflow), and an unquoted domain
// compiled, "quoted" by its own first letter. Each text is given in a buffer of exactly its length, as a
// claim's bytes come, so that ASan sees a read past it.
TEST(DraSelectorTest, FoundByFuzzAQuotedStringStartsOnlyAtAQuote) {
  for (const std::string_view e : {"device.attributes[", R"(device.attributes["gpu.tessera.dev"][)",
                                   "device.attributes[\"gpu.tessera.dev\"", "device.attributes[x"}) {
    const std::vector<char> exact(e.begin(), e.end());
    EXPECT_FALSE(Selector::Compile(std::string_view(exact.data(), exact.size())).ok()) << e;
  }
  absl::StatusOr<Selector> unquoted = Selector::Compile(R"(device.attributes[x.x].model == "T4")");
  EXPECT_FALSE(unquoted.ok()) << "compiled, with the domain \".\"";
}

TEST(DraSelectorTest, BoundsHostileShapes) {
  // Hostile shapes stay bounded: deep nesting and long chains are refused, not recursed into.
  EXPECT_FALSE(Selector::Compile(std::string(1000, '(') + "true" + std::string(1000, ')')).ok());
  std::string chain = "true";
  for (int i = 0; i < 2000; ++i) chain += " && true";
  EXPECT_FALSE(Selector::Compile(chain).ok());
  EXPECT_FALSE(Selector::Compile(std::string(20000, ' ') + "true").ok());
}

Json Slice(const std::string& node, int gpus, const std::string& model = "Tesla V100-SXM2-32GB") {
  return ::tessera::testing::TesseraSlice(node, gpus, model);
}

// deploy/dra/deviceclasses.yaml's two classes.
std::map<std::string, DeviceClass> Classes() {
  Json plain = {
      {"metadata", {{"name", "gpu.tessera.dev"}}},
      {"spec", {{"selectors", {{{"cel", {{"expression", "device.driver == \"gpu.tessera.dev\""}}}}}}}}};
  Json elastic = plain;
  elastic["metadata"]["name"] = "gpu-elastic.tessera.dev";
  elastic["spec"]["config"] = {
      {{"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"computePolicy", "elastic"}}}}}}};
  return {{"gpu.tessera.dev", ParseDeviceClass(plain)},
          {"gpu-elastic.tessera.dev", ParseDeviceClass(elastic)}};
}

Json Node(const std::string& name, const std::string& cpu = "64") {
  return {{"metadata", {{"name", name}, {"labels", {{"kubernetes.io/hostname", name}}}}},
          {"status", {{"allocatable", {{"cpu", cpu}, {"memory", "256Gi"}}}}}};
}

Json Claim(const std::string& name, Json request) {
  return {{"metadata", {{"name", name}, {"namespace", "default"}, {"uid", "uid-" + name}}},
          {"spec", {{"devices", {{"requests", Json::array({request})}}}}}};
}

Json Share(int cores, const std::string& memory, const std::string& cls = "gpu.tessera.dev") {
  return {{"name", "gpu"},
          {"exactly",
           {{"deviceClassName", cls},
            {"capacity", {{"requests", {{"cores", std::to_string(cores)}, {"memory", memory}}}}}}}};
}

Json Pod(const std::string& name, const std::string& cpu = "1") {
  return {{"metadata",
           {{"name", name},
            {"namespace", "default"},
            {"uid", "pod-" + name},
            {"creationTimestamp", "2026-11-27T00:00:00Z"}}},
          {"spec", {{"containers", {{{"name", "main"}, {"resources", {{"requests", {{"cpu", cpu}}}}}}}}}}};
}

class DraAllocatorTest : public ::testing::Test {
 protected:
  void SetUp() override { Use({"a", "b"}, 8); }
  void Use(const std::vector<std::string>& names, int gpus) {
    std::vector<Pool> pools;
    std::vector<NodeView> nodes;
    for (const std::string& n : names) {
      absl::StatusOr<Pool> p = ParseSlice(Slice(n, gpus));
      ASSERT_TRUE(p.ok()) << p.status();
      pools.push_back(*p);
      nodes.push_back(ParseNode(Node(n)));
    }
    allocator_.SetPools(pools);
    allocator_.SetNodes(nodes);
    allocator_.SetClasses(Classes());
  }
  // Places the pods one per round, feeding each allocation back as an allocated claim (as the informer
  // would).
  std::vector<PodDecision> PlaceAll(const std::vector<PodInput>& pods) {
    std::vector<PodDecision> out;
    for (const PodInput& p : pods) {
      PodDecision d = allocator_.Place({p})[0];
      if (d.kind == PodDecision::Kind::kPlaced) {
        for (size_t i = 0; i < p.claims.size(); ++i) {
          if (!d.allocations[i]) continue;
          Json c = p.claims[i];
          c["status"]["allocation"] = *d.allocations[i];
          allocated_.push_back(c);
        }
        allocator_.SetAllocatedClaims(allocated_);
      }
      out.push_back(d);
    }
    return out;
  }
  DraAllocator allocator_{AllocatorOptions{.policy = "tessera", .seed = 42}};
  std::vector<Json> allocated_;
};

TEST_F(DraAllocatorTest, AShareIsAllocatedAsKubeSchedulerWritesIt) {
  std::vector<PodDecision> d =
      PlaceAll({{Pod("p"), {Claim("c", Share(30, "8Gi", "gpu-elastic.tessera.dev"))}}});
  ASSERT_EQ(d[0].kind, PodDecision::Kind::kPlaced) << d[0].reason;
  const Json& a = *d[0].allocations[0];
  const Json& r = a["devices"]["results"][0];
  EXPECT_EQ(r["request"], "gpu");
  EXPECT_EQ(r["driver"], "gpu.tessera.dev");
  EXPECT_EQ(r["pool"], d[0].node);
  EXPECT_EQ(r["consumedCapacity"], (Json{{"cores", "30"}, {"memory", "8Gi"}}));
  EXPECT_THAT(r["shareID"].get<std::string>(),
              ::testing::MatchesRegex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"));
  EXPECT_EQ(a["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0],
            (Json{{"key", "metadata.name"}, {"operator", "In"}, {"values", {d[0].node}}}));
  // The class's configuration, as kube-scheduler copies it: source FromClass, for the requests of that class.
  EXPECT_EQ(a["devices"]["config"][0]["source"], "FromClass");
  EXPECT_EQ(a["devices"]["config"][0]["requests"], Json::array({"gpu"}));
  EXPECT_EQ(a["devices"]["config"][0]["opaque"]["parameters"]["computePolicy"], "elastic");
}

TEST_F(DraAllocatorTest, NoDeviceIsEverOverItsCapacity) {
  // 100 claims of 30% and 8 GiB on 2 nodes of 8 GPUs: three fit on a GPU (90%, 24 GiB), so 48 are placed.
  std::vector<PodInput> pods;
  for (int i = 0; i < 100; ++i)
    pods.push_back({Pod("p" + std::to_string(i)), {Claim("c" + std::to_string(i), Share(30, "8Gi"))}});
  std::vector<PodDecision> d = PlaceAll(pods);
  std::map<std::string, int> cores;
  int placed = 0;
  for (const PodDecision& x : d) {
    if (x.kind != PodDecision::Kind::kPlaced) {
      EXPECT_EQ(x.kind, PodDecision::Kind::kWait);
      EXPECT_THAT(x.reason, ::testing::HasSubstr("fits no node"));
      continue;
    }
    ++placed;
    const Json& r = (*x.allocations[0])["devices"]["results"][0];
    cores[r["pool"].get<std::string>() + "/" + r["device"].get<std::string>()] += 30;
  }
  EXPECT_EQ(placed, 48);
  for (const auto& [device, c] : cores) EXPECT_LE(c, 100) << device;
  // Also in one round: the allocator counts each decision before the next.
  DraAllocator fresh(AllocatorOptions{.seed = 7});
  absl::StatusOr<Pool> p = ParseSlice(Slice("a", 2));
  fresh.SetPools({*p});
  fresh.SetNodes({ParseNode(Node("a"))});
  fresh.SetClasses(Classes());
  std::vector<PodDecision> one = fresh.Place(std::vector<PodInput>(pods.begin(), pods.begin() + 10));
  EXPECT_EQ(std::count_if(one.begin(), one.end(),
                          [](const PodDecision& x) { return x.kind == PodDecision::Kind::kPlaced; }),
            6);
}

TEST_F(DraAllocatorTest, ClaimsAllocatedByOthersAreCounted) {
  Use({"a"}, 1);
  Json other = Claim("theirs", Share(80, "1Gi"));
  other["status"]["allocation"]["devices"]["results"] = {
      {{"request", "gpu"},
       {"driver", "gpu.tessera.dev"},
       {"pool", "a"},
       {"device", "gpu-0"},
       {"consumedCapacity", {{"cores", "80"}, {"memory", "1Gi"}}}}};
  allocator_.SetAllocatedClaims({other});
  EXPECT_EQ(allocator_.Place({{Pod("p"), {Claim("c", Share(30, "1Gi"))}}})[0].kind, PodDecision::Kind::kWait);
  EXPECT_EQ(allocator_.Place({{Pod("p"), {Claim("c", Share(20, "1Gi"))}}})[0].kind,
            PodDecision::Kind::kPlaced);
}

TEST_F(DraAllocatorTest, AClaimStaysWithinItsNamespacesQuotaOnBothPaths) {
  // Quota "default": 1.5 V100s, of which the device-plugin path's pods hold 0.5 (held_elsewhere).
  allocator_.SetQuotas({{.ns = core::Namespace("default"),
                         .model = "Tesla V100-SXM2-32GB",
                         .limit = core::MilliGpu(1500),
                         .held_elsewhere = 500}});
  std::vector<PodInput> pods;
  for (int i = 0; i < 4; ++i)
    pods.push_back({Pod("p" + std::to_string(i)), {Claim("c" + std::to_string(i), Share(40, "1Gi"))}});
  // Two 40% claims fit the 1.0 left; the third would hold 1.3 (+ 0.5): it waits, and says why.
  std::vector<PodDecision> d = PlaceAll(std::vector<PodInput>(pods.begin(), pods.begin() + 3));
  EXPECT_EQ(d[0].kind, PodDecision::Kind::kPlaced) << d[0].reason;
  EXPECT_EQ(d[1].kind, PodDecision::Kind::kPlaced) << d[1].reason;
  ASSERT_EQ(d[2].kind, PodDecision::Kind::kWait);
  EXPECT_THAT(d[2].reason, ::testing::HasSubstr("(quota)"));
  // What the claims hold, for the device-plugin path: 0.8 of the namespace's V100s.
  std::vector<core::QuotaStanding> held = allocator_.QuotaHeld();
  ASSERT_EQ(held.size(), 1u);
  EXPECT_EQ(held[0].ns, core::Namespace("default"));
  EXPECT_EQ(held[0].held_here, 800);
  // In one round too, and for two claims of one pod: each counts before the next.
  DraAllocator fresh(AllocatorOptions{.seed = 7});
  fresh.SetPools({*ParseSlice(Slice("a", 8))});
  fresh.SetNodes({ParseNode(Node("a"))});
  fresh.SetClasses(Classes());
  fresh.SetQuotas(
      {{.ns = core::Namespace("default"), .model = "Tesla V100-SXM2-32GB", .limit = core::MilliGpu(1000)}});
  std::vector<PodDecision> one =
      fresh.Place({pods[0],
                   pods[1],
                   pods[2],
                   {Pod("two"), {Claim("x", Share(15, "1Gi")), Claim("y", Share(15, "1Gi"))}}});
  EXPECT_EQ(one[0].kind, PodDecision::Kind::kPlaced);
  EXPECT_EQ(one[1].kind, PodDecision::Kind::kPlaced);
  EXPECT_EQ(one[2].kind, PodDecision::Kind::kWait);  // 1.2 > 1.0
  EXPECT_EQ(one[3].kind, PodDecision::Kind::kWait);  // x fits (0.95), then y would make 1.1
  // Another namespace has no quota: it is placed whatever "default" holds.
  Json other = Claim("o", Share(40, "1Gi"));
  other["metadata"]["namespace"] = "lab";
  Json other_pod = Pod("o");
  other_pod["metadata"]["namespace"] = "lab";
  EXPECT_EQ(fresh.Place({{other_pod, {other}}})[0].kind, PodDecision::Kind::kPlaced);
}

TEST_F(DraAllocatorTest, SharesArePackedOntoTheFewestGpus) {
  std::vector<PodInput> pods;
  for (int i = 0; i < 6; ++i)
    pods.push_back({Pod("p" + std::to_string(i)), {Claim("c" + std::to_string(i), Share(25, "4Gi"))}});
  std::set<std::string> used;
  for (const PodDecision& d : PlaceAll(pods)) {
    ASSERT_EQ(d.kind, PodDecision::Kind::kPlaced) << d.reason;
    const Json& r = (*d.allocations[0])["devices"]["results"][0];
    used.insert(r["pool"].get<std::string>() + "/" + r["device"].get<std::string>());
  }
  EXPECT_EQ(used.size(), 2u);  // 4 x 25% on one GPU, then the next
}

TEST_F(DraAllocatorTest, AMatchAttributePairSharesItsValue) {
  // Take GPUs 0-2 of both nodes' NVLink domain 0 so that no node has a pair left in domain 0 ... but
  // domain 4.
  Json pair =
      Claim("pair", {{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.tessera.dev"}, {"count", 2}}}});
  pair["spec"]["devices"]["constraints"] = {{{"matchAttribute", "gpu.tessera.dev/nvlinkDomain"}}};
  Use({"a"}, 8);
  Json taken =
      Claim("taken", {{"name", "gpu"}, {"exactly", {{"deviceClassName", "gpu.tessera.dev"}, {"count", 3}}}});
  taken["status"]["allocation"]["devices"]["results"] = Json::array();
  for (int i = 0; i < 3; ++i) {
    taken["status"]["allocation"]["devices"]["results"].push_back(
        {{"request", "gpu"},
         {"driver", "gpu.tessera.dev"},
         {"pool", "a"},
         {"device", "gpu-" + std::to_string(i)},
         {"consumedCapacity", {{"cores", "100"}, {"memory", "32Gi"}}}});
  }
  allocator_.SetAllocatedClaims({taken});
  PodDecision d = allocator_.Place({{Pod("p"), {pair}}})[0];
  ASSERT_EQ(d.kind, PodDecision::Kind::kPlaced) << d.reason;
  const Json& results = (*d.allocations[0])["devices"]["results"];
  ASSERT_EQ(results.size(), 2u);
  std::set<std::string> devices = {results[0]["device"], results[1]["device"]};
  EXPECT_TRUE(devices.size() == 2 && !devices.contains("gpu-3"))
      << results;  // gpu-3 has no partner in domain 0
}

TEST_F(DraAllocatorTest, FirstAvailableTakesTheFirstAlternativeThatFits) {
  Json claim = Claim("c", {{"name", "gpu"},
                           {"firstAvailable",
                            {{{"name", "big"}, {"deviceClassName", "gpu.tessera.dev"}, {"count", 9}},
                             {{"name", "small"},
                              {"deviceClassName", "gpu.tessera.dev"},
                              {"capacity", {{"requests", {{"cores", "50"}, {"memory", "1Gi"}}}}}}}}});
  PodDecision d = allocator_.Place({{Pod("p"), {claim}}})[0];
  ASSERT_EQ(d.kind, PodDecision::Kind::kPlaced) << d.reason;
  EXPECT_EQ((*d.allocations[0])["devices"]["results"][0]["request"], "gpu/small");
}

TEST_F(DraAllocatorTest, SelectorsChooseTheModelAndUnknownOnesAreHandedOver) {
  Json t4 = Share(10, "1Gi");
  t4["exactly"]["selectors"] = {
      {{"cel", {{"expression", R"(device.attributes["gpu.tessera.dev"].model == "T4")"}}}}};
  PodDecision none = allocator_.Place({{Pod("p"), {Claim("c", t4)}}})[0];
  EXPECT_EQ(none.kind, PodDecision::Kind::kWait);
  Json v100 = t4;
  v100["exactly"]["selectors"][0]["cel"]["expression"] =
      R"(device.attributes["gpu.tessera.dev"].model == "Tesla V100-SXM2-32GB")";
  EXPECT_EQ(allocator_.Place({{Pod("p"), {Claim("c", v100)}}})[0].kind, PodDecision::Kind::kPlaced);
  Json fancy = t4;
  fancy["exactly"]["selectors"][0]["cel"]["expression"] =
      R"(device.attributes["gpu.tessera.dev"].model.startsWith("T"))";
  PodDecision handed = allocator_.Place({{Pod("p"), {Claim("c", fancy)}}})[0];
  EXPECT_EQ(handed.kind, PodDecision::Kind::kHandOver);
  EXPECT_THAT(handed.reason, ::testing::HasSubstr("outside what Tessera evaluates"));
  // A selector that errs on a device (no such attribute) is kube-scheduler's to report.
  Json missing = t4;
  missing["exactly"]["selectors"][0]["cel"]["expression"] =
      R"(device.attributes["gpu.tessera.dev"].memoryClass == "x")";
  EXPECT_EQ(allocator_.Place({{Pod("p"), {Claim("c", missing)}}})[0].kind, PodDecision::Kind::kHandOver);
}

TEST_F(DraAllocatorTest, ThePodMustFitTheNodesCpuAndTaints) {
  std::vector<NodeView> nodes = {ParseNode(Node("a", "2")), ParseNode(Node("b", "64"))};
  nodes[1].taints = {{{"key", "dedicated"}, {"value", "x"}, {"effect", "NoSchedule"}}};
  allocator_.SetNodes(nodes);
  PodDecision big = allocator_.Place({{Pod("p", "4"), {Claim("c", Share(10, "1Gi"))}}})[0];
  EXPECT_EQ(big.kind, PodDecision::Kind::kWait);
  Json tolerant = Pod("p", "4");
  tolerant["spec"]["tolerations"] = {{{"key", "dedicated"}, {"operator", "Exists"}}};
  PodDecision d = allocator_.Place({{tolerant, {Claim("c", Share(10, "1Gi"))}}})[0];
  ASSERT_EQ(d.kind, PodDecision::Kind::kPlaced) << d.reason;
  EXPECT_EQ(d.node, "b");
}

TEST_F(DraAllocatorTest, APodPlacedButNotYetBoundHoldsItsNodesCpu) {
  // Node a has 4 CPUs. p1 (3 CPUs) is placed on a in one round and not bound yet when the next round places
  // p2 (3 CPUs): counting only bound pods, p2 would go to a too, and kube-scheduler could bind only one of
  // them.
  std::vector<NodeView> nodes = {ParseNode(Node("a", "4")), ParseNode(Node("b", "4"))};
  allocator_.SetNodes(nodes);
  PodDecision first = PlaceAll({{Pod("p1", "3"), {Claim("c1", Share(10, "1Gi"))}}})[0];
  ASSERT_EQ(first.kind, PodDecision::Kind::kPlaced) << first.reason;
  // allocated_ holds c1 as written: allocation and the pod in reservedFor.
  allocated_[0]["status"]["reservedFor"] = {{{"resource", "pods"}, {"name", "p1"}, {"uid", "pod-p1"}}};
  EXPECT_EQ(AllocatedNode(allocated_[0]), first.node);
  // Without it, the packing policy puts p2 on p1's GPU, on p1's node.
  EXPECT_EQ(allocator_.Place({{Pod("p2", "3"), {Claim("c2", Share(10, "1Gi"))}}})[0].node, first.node);
  std::vector<PodOnNode> pods = {{"pod-p1", "", {3000, 0}}, {"pod-x", "", {700, 0}}};
  std::map<std::string, HostRequest> requested = RequestedByNode(pods, allocated_);
  EXPECT_EQ(requested.size(), 1u);  // pod-x has no allocated claim: on no node yet
  EXPECT_EQ(requested[first.node].cpu_milli, 3000);
  for (NodeView& v : nodes) v.cpu_requested = requested[v.name].cpu_milli;
  allocator_.SetNodes(nodes);
  PodDecision second = allocator_.Place({{Pod("p2", "3"), {Claim("c2", Share(10, "1Gi"))}}})[0];
  ASSERT_EQ(second.kind, PodDecision::Kind::kPlaced) << second.reason;
  EXPECT_NE(second.node, first.node);
}

TEST(DraAllocatedNodeTest, OnlyASelectorNamingOneNodeByNameNamesIt) {
  auto claim = [](Json terms) {
    return Json{{"status", {{"allocation", {{"nodeSelector", {{"nodeSelectorTerms", std::move(terms)}}}}}}}};
  };
  Json one = {{"key", "metadata.name"}, {"operator", "In"}, {"values", {"n1"}}};
  EXPECT_EQ(AllocatedNode(claim({{{"matchFields", {one}}}})), "n1");
  Json two = one;
  two["values"] = {"n1", "n2"};
  EXPECT_EQ(AllocatedNode(claim({{{"matchFields", {two}}}})), "");
  Json label = {{"key", "kubernetes.io/hostname"}, {"operator", "In"}, {"values", {"n1"}}};
  EXPECT_EQ(AllocatedNode(claim({{{"matchExpressions", {label}}}})), "");
  EXPECT_EQ(AllocatedNode(claim({{{"matchFields", {one}}}, {{"matchFields", {one}}}})), "");
  EXPECT_EQ(AllocatedNode(Json{{"status", {{"allocation", {{"devices", Json::object()}}}}}}), "");
  EXPECT_EQ(AllocatedNode(claim("not an array")), "");
  Json number = one;
  number["values"] = {7};
  EXPECT_EQ(AllocatedNode(claim({{{"matchFields", {number}}}})), "");
}

TEST(DraCapacityTest, RequestPoliciesRoundAsTheApiSays) {
  Capacity c;
  c.value = 100;
  c.default_value = 100;
  c.min = 1;
  c.max = 100;
  c.step = 1;
  EXPECT_EQ(c.Consumed(std::nullopt), 100);
  EXPECT_EQ(c.Consumed(30), 30);
  EXPECT_EQ(c.Consumed(0), 1);
  EXPECT_EQ(c.Consumed(101), std::nullopt);
  Capacity m;
  m.value = 32LL << 30;
  m.min = 1 << 20;
  m.step = 1 << 20;
  EXPECT_EQ(m.Consumed((1 << 20) + 1), 2 << 20);  // rounded up to the step
  Capacity v;
  v.value = 100;
  v.valid_values = {25, 50, 100};
  EXPECT_EQ(v.Consumed(30), 50);
}

}  // namespace
}  // namespace tessera::scheduler::dra
