// The admission webhook's AdmissionReview in and out (admission.k8s.io/v1).
#include "scheduler/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/clock.h"
#include "core/request_parser.h"
#include "formats/dra_placement.h"
#include "formats/pod_object.h"
#include "nlohmann/json.hpp"

namespace tessera::scheduler {
namespace {

using ::nlohmann::json;
using ::testing::HasSubstr;

std::string Decode64(const std::string& in) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string out;
  int bits = 0;
  uint32_t acc = 0;
  for (char c : in) {
    const int v = value(c);
    if (v < 0) break;
    acc = acc << 6 | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

std::string Review(const json& pod, const std::string& op = "CREATE") {
  return json{{"apiVersion", "admission.k8s.io/v1"},
              {"kind", "AdmissionReview"},
              {"request",
               {{"uid", "705ab4f5-6393-11e8-b7cc-42010a800002"},
                {"kind", {{"group", ""}, {"version", "v1"}, {"kind", "Pod"}}},
                {"resource", {{"group", ""}, {"version", "v1"}, {"resource", "pods"}}},
                {"namespace", "default"},
                {"operation", op},
                {"object", pod}}}}
      .dump();
}

json PodWith(const json& limits, const std::string& scheduler = "") {
  json pod = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", "p"}, {"namespace", "default"}}},
      {"spec", {{"containers", {{{"name", "main"}, {"image", "x"}, {"resources", {{"limits", limits}}}}}}}}};
  if (!scheduler.empty()) pod["spec"]["schedulerName"] = scheduler;
  return pod;
}

// Applies a JSON patch the way the API server does (RFC 6902), for the ops the webhook emits: "add" sets a
// member (replacing one that exists) of an object that must exist; "replace" needs the member to exist.
json Apply(json doc, const json& patch) {
  for (const json& op : patch) {
    const json::json_pointer path(op["path"].get<std::string>());
    const std::string kind = op["op"];
    if (kind == "add") {
      EXPECT_TRUE(doc.contains(path.parent_pointer())) << "add under a missing parent: " << path;
    } else if (kind == "replace") {
      EXPECT_TRUE(doc.contains(path)) << "replace of a missing member: " << path;
    } else {
      ADD_FAILURE() << "unexpected patch op " << kind;
    }
    doc[path] = op["value"];
  }
  return doc;
}

// The pod after the mutating webhook, or the pod itself when the webhook patches nothing.
json Mutated(const Admission& admission, const json& pod) {
  json out = json::parse(admission.Mutate(Review(pod)).body);
  EXPECT_TRUE(out["response"]["allowed"]);
  if (!out["response"].contains("patch")) return pod;
  return Apply(pod, json::parse(Decode64(out["response"]["patch"])));
}

// A pod as the API server hands it to admission: requests defaulted from limits.
json Defaulted(json pod) {
  for (json& c : pod["spec"]["containers"]) c["resources"]["requests"] = c["resources"]["limits"];
  return pod;
}

core::PodRequest Parsed(const json& pod) {
  absl::StatusOr<formats::PodObject> object = formats::ParsePodObject(pod);
  EXPECT_TRUE(object.ok()) << object.status();
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(object->spec);
  EXPECT_TRUE(request.ok()) << request.status();
  return request.ok() ? *request : core::PodRequest{};
}

TEST(AdmissionTest, MutateTranslatesHamiAndSetsTheScheduler) {
  Admission admission({"tessera-scheduler", {}});
  json pod = PodWith(
      {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "4000"}, {"cpu", "2"}});
  Response r = admission.Mutate(Review(pod));
  ASSERT_EQ(r.status, 200);
  json out = json::parse(r.body);
  EXPECT_EQ(out["kind"], "AdmissionReview");
  EXPECT_EQ(out["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
  EXPECT_TRUE(out["response"]["allowed"]);
  EXPECT_EQ(out["response"]["patchType"], "JSONPatch");
  json patched = Apply(pod, json::parse(Decode64(out["response"]["patch"])));
  json limits = patched["spec"]["containers"][0]["resources"]["limits"];
  EXPECT_EQ(limits["tessera.dev/gpu"], "1");
  EXPECT_EQ(limits["tessera.dev/gpu-cores"], "30");
  EXPECT_EQ(limits["tessera.dev/gpu-memory"], "4000");
  EXPECT_EQ(limits["cpu"], "2");
  EXPECT_FALSE(limits.contains("nvidia.com/gpucores"));
  EXPECT_EQ(patched["spec"]["schedulerName"], "tessera-scheduler");
}

// docs/migration.md line by line: what a HAMi (or gpushare) pod means after the webhook is what it meant before,
// and what cannot be kept is said in the response's warnings (kubectl prints them).
TEST(AdmissionTest, MigrationKeepsTheMeaningAndWarnsWhatIsIgnored) {
  Admission admission({"tessera-scheduler", {}});
  struct Case {
    const char* what;
    json limits;
    json annotations;
    json labels;
  };
  const std::vector<Case> cases = {
      {"no core limit: elastic", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}}, json::object(),
       json::object()},
      {"cores 0: elastic", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "0"}, {"nvidia.com/gpumem", "4000"}},
       json::object(), json::object()},
      {"task priority 0: high",
       {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/priority", "0"}},
       json::object(), json::object()},
      {"gpu type by a word", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}},
       {{"nvidia.com/use-gputype", "a100"}, {"nvidia.com/numa-bind", "true"}}, json::object()},
      {"gpushare over 4 GPUs", {{"aliyun.com/gpu-mem", "8"}}, json::object(), {{"aliyun.com/gpu-count", "4"}}},
      {"gpu-manager share: elastic", {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "8"}},
       json::object(), json::object()},
      {"gpu-manager share with its limit: hard", {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "8"}},
       {{"tencent.com/vcuda-core-limit", "30"}}, json::object()},
  };
  for (const Case& c : cases) {
    json pod = Defaulted(PodWith(c.limits));
    if (!c.annotations.empty()) pod["metadata"]["annotations"] = c.annotations;
    if (!c.labels.empty()) pod["metadata"]["labels"] = c.labels;
    const core::PodRequest before = Parsed(pod);
    json after = Mutated(admission, pod);
    for (const auto& [name, value] : after["spec"]["containers"][0]["resources"]["limits"].items()) {
      EXPECT_TRUE(name.starts_with("tessera.dev/")) << c.what << ": " << name << " left in the limits";
    }
    core::PodRequest translated = Parsed(after);
    EXPECT_EQ(translated.containers, before.containers) << c.what;
    EXPECT_EQ(translated.compute_policy, before.compute_policy) << c.what;
    EXPECT_EQ(translated.priority, before.priority) << c.what;
    EXPECT_EQ(translated.numa_bind, before.numa_bind) << c.what;
    EXPECT_EQ(translated.model_include_substring, before.model_include_substring) << c.what;
  }
  // What each case means, stated once: the webhook wrote it down as annotations the node agent reads.
  json elastic = Mutated(admission, Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}})));
  EXPECT_EQ(elastic["metadata"]["annotations"]["tessera.dev/compute-policy"], "elastic");
  json high = Mutated(admission, Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/priority", "0"}})));
  EXPECT_EQ(high["metadata"]["annotations"]["tessera.dev/priority"], "high");
  // Tessera's own rule on the operator's word.
  core::ParseOptions native;
  native.hami_no_core_limit = core::NoCoreLimit::kProportional;
  json hard = Mutated(Admission({"tessera-scheduler", native}),
                      Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}})));
  EXPECT_FALSE(hard["metadata"].contains("annotations") &&
               hard["metadata"]["annotations"].contains("tessera.dev/compute-policy"));

  // Warnings: the per-pod policies and MIG are not kept; the elastic translation is said.
  json pod = Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4000"}}));
  pod["metadata"]["annotations"] = {{"hami.io/gpu-scheduler-policy", "spread"}, {"nvidia.com/vgpu-mode", "mig"}};
  json out = json::parse(admission.Mutate(Review(pod)).body);
  ASSERT_TRUE(out["response"].contains("warnings")) << out.dump();
  std::string all;
  for (const json& w : out["response"]["warnings"]) all += w.get<std::string>() + "\n";
  EXPECT_THAT(all, HasSubstr("hami.io/gpu-scheduler-policy=spread is ignored"));
  EXPECT_THAT(all, HasSubstr("MIG"));
  EXPECT_THAT(all, HasSubstr("tessera.dev/compute-policy: elastic"));
  // A priority that disagrees with the pod's own: refused, naming both.
  json conflict = Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/priority", "0"}}));
  conflict["metadata"]["annotations"] = {{"tessera.dev/priority", "low"}};
  out = json::parse(admission.Mutate(Review(conflict)).body);
  EXPECT_FALSE(out["response"]["allowed"]);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(), HasSubstr("keep one of them"));
}

TEST(AdmissionTest, MutateLeavesOtherPodsAndOtherSchedulersAlone) {
  Admission admission({"tessera-scheduler", {}});
  json out = json::parse(admission.Mutate(Review(PodWith({{"cpu", "1"}}))).body);
  EXPECT_TRUE(out["response"]["allowed"]);
  EXPECT_FALSE(out["response"].contains("patch"));
  // Tessera's own names and a scheduler chosen by the user: nothing to change.
  out =
      json::parse(admission.Mutate(Review(PodWith({{"tessera.dev/gpu-cores", "50"}}, "my-scheduler"))).body);
  EXPECT_FALSE(out["response"].contains("patch"));
}

// docs/requests.md: the kubelet calls Allocate only for tessera.dev/gpu, the resource the device plugin
// advertises, so every GPU container must reach it with tessera.dev/gpu in limits and requests.
TEST(AdmissionTest, MutateAddsTheGpuCountToEveryShare) {
  Admission admission({"tessera-scheduler", {}});
  struct Case {
    json limits;
    const char* gpu;  // tessera.dev/gpu after the webhook
    size_t vgpus;
  };
  const Case cases[] = {
      {{{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}}, "1", 1},  // install.md's smoke pod
      {{{"tessera.dev/gpu-memory", "8192"}}, "1", 1},
      {{{"tessera.dev/gpu-memory-percentage", "50"}}, "1", 1},
      {{{"tessera.dev/gpu-cores", "250"}}, "3", 3},  // "2.5 GPUs": two whole and one half
      {{{"aliyun.com/gpu-mem", "4"}}, "1", 1},       // gpushare
      {{{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "16"}}, "1", 1},  // gpu-manager
      {{{"volcano.sh/vgpu-cores", "30"}, {"volcano.sh/vgpu-memory", "2048"}}, "1", 1},    // default scheduler
  };
  for (const Case& c : cases) {
    json before = Defaulted(PodWith(c.limits));
    json after = Mutated(admission, before);
    const json& resources = after["spec"]["containers"][0]["resources"];
    EXPECT_EQ(resources["limits"]["tessera.dev/gpu"], c.gpu) << c.limits;
    EXPECT_EQ(resources["requests"]["tessera.dev/gpu"], c.gpu) << c.limits;
    EXPECT_EQ(resources["limits"], resources["requests"]) << c.limits;
    EXPECT_EQ(after["metadata"]["annotations"]["tessera.dev/gpu-added"], "main") << c.limits;
    EXPECT_EQ(after["spec"]["schedulerName"], "tessera-scheduler") << c.limits;
    // The added count changes nothing in what the pod asks for.
    core::PodRequest request = Parsed(after);
    ASSERT_EQ(request.containers.size(), 1u) << c.limits;
    EXPECT_EQ(request.containers[0].vgpus.size(), c.vgpus) << c.limits;
    json again = Mutated(admission, after);  // a reinvocation adds nothing more
    EXPECT_EQ(again, after) << c.limits;
  }
  // "2.5 GPUs" stays two whole GPUs and half of a third.
  core::PodRequest request = Parsed(Mutated(admission, Defaulted(PodWith({{"tessera.dev/gpu-cores", "250"}}))));
  ASSERT_EQ(request.containers.size(), 1u);
  EXPECT_TRUE(request.containers[0].vgpus[0].exclusive());
  EXPECT_TRUE(request.containers[0].vgpus[1].exclusive());
  EXPECT_FALSE(request.containers[0].vgpus[2].exclusive());
  // Whole GPUs already carry tessera.dev/gpu: nothing added.
  json whole = Mutated(admission, Defaulted(PodWith({{"tessera.dev/gpu", "2"}})));
  EXPECT_FALSE(whole["metadata"].contains("annotations"));
}

TEST(AdmissionTest, MutateKeepsExistingAnnotationsAndOtherContainers) {
  Admission admission({"tessera-scheduler", {}});
  json pod = Defaulted(PodWith({{"tessera.dev/gpu-cores", "20"}}));
  pod["metadata"]["annotations"] = {{"team", "a"}};
  pod["spec"]["containers"].push_back({{"name", "side"}, {"image", "x"}});
  json after = Mutated(admission, pod);
  EXPECT_EQ(after["metadata"]["annotations"]["team"], "a");
  EXPECT_EQ(after["metadata"]["annotations"]["tessera.dev/gpu-added"], "main");
  EXPECT_EQ(after["spec"]["containers"][1], pod["spec"]["containers"][1]);
}

TEST(AdmissionTest, ParserChecksAnAddedCount) {
  json pod = PodWith({{"tessera.dev/gpu-cores", "250"}, {"tessera.dev/gpu", "2"}});
  pod["metadata"]["annotations"] = {{"tessera.dev/gpu-added", "main"}};
  absl::StatusOr<formats::PodObject> object = formats::ParsePodObject(pod);
  ASSERT_TRUE(object.ok());
  absl::StatusOr<core::PodRequest> request = core::ParsePodRequest(object->spec);
  ASSERT_FALSE(request.ok());
  EXPECT_THAT(request.status().message(), HasSubstr("asks for 3 vGPUs"));
}

// Pods of other schedulers keep their own resource names: their scheduler reads them (docs/migration.md).
TEST(AdmissionTest, PodsOfOtherSchedulersAreLeftUntouched) {
  Admission admission({"tessera-scheduler", {}});
  const std::pair<json, const char*> cases[] = {
      {{{"volcano.sh/vgpu-number", "1"}, {"volcano.sh/vgpu-cores", "30"}}, "volcano"},
      {{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "3000"}}, "hami-scheduler"},
      {{{"tessera.dev/gpu-cores", "0"}}, "someone-else"},  // not ours to refuse either
  };
  for (const auto& [limits, scheduler] : cases) {
    json pod = Defaulted(PodWith(limits, scheduler));
    json out = json::parse(admission.Mutate(Review(pod)).body);
    EXPECT_TRUE(out["response"]["allowed"]) << scheduler;
    EXPECT_FALSE(out["response"].contains("patch")) << scheduler;
    out = json::parse(admission.Validate(Review(pod)).body);
    EXPECT_TRUE(out["response"]["allowed"]) << scheduler;
  }
}

TEST(AdmissionTest, ValidateRefusesWithWhatToChange) {
  Admission admission({"tessera-scheduler", {}});
  json out = json::parse(admission.Validate(Review(PodWith({{"tessera.dev/gpu-cores", "0"}}))).body);
  EXPECT_FALSE(out["response"]["allowed"]);
  EXPECT_EQ(out["response"]["status"]["code"], 422);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(), HasSubstr("gpu-cores"));
  // A privileged container asking for a share.
  json privileged = PodWith({{"tessera.dev/gpu-cores", "50"}});
  privileged["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  out = json::parse(admission.Validate(Review(privileged)).body);
  EXPECT_FALSE(out["response"]["allowed"]);
  EXPECT_THAT(out["response"]["status"]["message"].get<std::string>(), HasSubstr("privileged"));
  // A good pod passes; an update is not judged again.
  out = json::parse(admission.Validate(Review(PodWith({{"tessera.dev/gpu-cores", "50"}}))).body);
  EXPECT_TRUE(out["response"]["allowed"]);
  out = json::parse(admission.Validate(Review(PodWith({{"tessera.dev/gpu-cores", "0"}}), "UPDATE")).body);
  EXPECT_TRUE(out["response"]["allowed"]);
}

// One webhook call per pod: the mutating webhook refuses what the validating one refused, with the same
// answer (it used to allow them all, leaving them to a second call). Only /mutate is registered (deploy/).
TEST(AdmissionTest, MutateRefusesWhatValidateRefusesWithTheSameMessage) {
  Admission admission({"tessera-scheduler", {}});
  json privileged = PodWith({{"tessera.dev/gpu-cores", "50"}});
  privileged["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  json hami_privileged = PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "3000"}});
  hami_privileged["spec"]["containers"][0]["securityContext"] = {{"privileged", true}};
  json as_annotation = PodWith({{"tessera.dev/gpu-cores", "50"}});
  as_annotation["metadata"]["annotations"] = {{"tessera.dev/gpu-memory", "8Gi"}};
  json unreadable = PodWith({{"tessera.dev/gpu-cores", "50"}});
  unreadable["metadata"].erase("name");
  const std::pair<json, const char*> cases[] = {
      {Defaulted(PodWith({{"tessera.dev/gpu-cores", "0"}})), "gpu-cores"},
      {Defaulted(privileged), "privileged"},
      {Defaulted(hami_privileged), "privileged"},
      {Defaulted(as_annotation), "tessera.dev/gpu-memory"},
      {unreadable, "metadata.name is missing"},
  };
  for (const auto& [pod, says] : cases) {
    json mutate = json::parse(admission.Mutate(Review(pod)).body)["response"];
    json validate = json::parse(admission.Validate(Review(pod)).body)["response"];
    EXPECT_FALSE(mutate["allowed"]) << pod.dump();
    EXPECT_FALSE(mutate.contains("patch")) << pod.dump();
    EXPECT_EQ(mutate["status"], validate["status"]) << pod.dump();
    EXPECT_THAT(mutate["status"]["message"].get<std::string>(), HasSubstr(says));
  }
  EXPECT_EQ(admission.decisions(Admission::Verb::kMutate, Admission::Decision::kDenied), std::size(cases));
  // An update is not judged again; a good pod is patched as before.
  json update =
      json::parse(admission.Mutate(Review(PodWith({{"tessera.dev/gpu-cores", "0"}}), "UPDATE")).body);
  EXPECT_TRUE(update["response"]["allowed"]);
  json good =
      json::parse(admission.Mutate(Review(Defaulted(PodWith({{"tessera.dev/gpu-cores", "50"}})))).body);
  EXPECT_TRUE(good["response"]["allowed"]);
  EXPECT_TRUE(good["response"].contains("patch"));
}

// A 300,000-deep array inside spec used to crash the webhook (a recursive copy of the spec).
TEST(AdmissionTest, DeeplyNestedReviewsGet400) {
  Admission admission({"tessera-scheduler", {}});
  const std::string deep = std::string(300000, '[') + std::string(300000, ']');
  const std::string pod = PodWith({{"nvidia.com/gpu", "1"}}).dump();
  const std::string body = Review(json::object())
                               .replace(Review(json::object()).find("{}"), 2,
                                        pod.substr(0, pod.size() - 2) + R"(,"x":)" + deep + "}}");
  for (const Response& r : {admission.Mutate(body), admission.Validate(body)}) {
    EXPECT_EQ(r.status, 400);
    EXPECT_THAT(json::parse(r.body)["error"].get<std::string>(), HasSubstr("nested deeper than 128"));
  }
}

// Found by fuzz/admission_review_fuzz: the parser's message quotes the bytes it stopped at, and dumping
// invalid UTF-8 threw (std::terminate). Every answer is JSON, whatever the body holds.
TEST(AdmissionTest, InvalidUtf8GetsAJsonAnswer) {
  Admission admission({"tessera-scheduler", {}});
  for (const std::string& body :
       {std::string("{\"request\": \"\xA1\"}"), std::string("{\"a\":1}\xff\xfe"), std::string("\xA1")}) {
    for (const Response& r : {admission.Mutate(body), admission.Validate(body)}) {
      EXPECT_EQ(r.status, 400);
      EXPECT_TRUE(json::accept(r.body)) << r.body;
    }
  }
}

TEST(AdmissionTest, MalformedReviewsGet400) {
  Admission admission({"tessera-scheduler", {}});
  for (const char* body : {"", "{", "[]", R"({"request":{}})", R"({"request":"x"})"}) {
    Response r = admission.Mutate(body);
    EXPECT_EQ(r.status, 400) << body;
    EXPECT_THAT(json::parse(r.body)["error"].get<std::string>(), HasSubstr("admission")) << body;
    EXPECT_EQ(admission.Validate(body).status, 400) << body;
  }
}

// --- Extended resources on DRA GPUs (docs/dra.md): the webhook's rewrite. ---

// A webhook that converts: the offer is a cluster whose DRA GPUs have 32 GiB (a V100-SXM2-32GB's 32768 MiB,
// as tessera-node publishes it), the templates it "creates" are recorded, and every pod with claims is gated.
struct Converting {
  explicit Converting(ExtendedToDra mode = ExtendedToDra::kAlways,
                      DraOffer offer = {.driver = true, .memory_mib = {32768}})
      : admission({"tessera-scheduler", {}}) {
    admission.SetDraGate([this](const json& pod) {
      gated_pods.push_back(pod);
      return true;
    });
    admission.SetDraConversion({.mode = mode,
                                .offer = [offer] { return offer; },
                                .ensure =
                                    [this](std::string_view ns, const ClaimTemplate& t) {
                                      made.push_back({std::string(ns), t});
                                      return ensure_error;
                                    }});
  }
  json Out(const json& pod, bool dry_run = false) {
    json review = json::parse(Review(pod));
    if (dry_run) review["request"]["dryRun"] = true;
    return json::parse(admission.Mutate(review.dump()).body)["response"];
  }
  json After(const json& pod, bool dry_run = false) {
    json out = Out(pod, dry_run);
    EXPECT_TRUE(out["allowed"]) << out.dump();
    if (!out.contains("patch")) return pod;
    return Apply(pod, json::parse(Decode64(out["patch"])));
  }
  const ClaimTemplate* Made(const std::string& name) const {
    for (const auto& [ns, t] : made) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }

  Admission admission;
  std::vector<std::pair<std::string, ClaimTemplate>> made;
  std::vector<json> gated_pods;
  absl::Status ensure_error;
};

// The share forms of Tessera's driver (examples/dra/claims.yaml, bench/dra_quality.py): one request "gpu" of
// class gpu.tessera.dev with capacity.requests {cores: percent, memory}.
json ShareSpec(const char* cores, const char* memory, const char* cls = "gpu.tessera.dev", int count = 1) {
  return {{"devices",
           {{"requests",
             {{{"name", "gpu"},
               {"exactly",
                {{"deviceClassName", cls},
                 {"allocationMode", "ExactCount"},
                 {"count", count},
                 {"capacity", {{"requests", {{"cores", cores}, {"memory", memory}}}}}}}}}}}}};
}

TEST(AdmissionDraTest, HamiShareBecomesAClaimOwnedThroughATemplateAndIsGated) {
  Converting w;
  json pod = Defaulted(PodWith(
      {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "4096"}, {"cpu", "2"}}));
  json after = w.After(pod);
  const json& c = after["spec"]["containers"][0];
  EXPECT_EQ(c["resources"]["limits"], json({{"cpu", "2"}})) << "GPU resources left: " << c.dump();
  EXPECT_EQ(c["resources"]["requests"], json({{"cpu", "2"}}));
  EXPECT_EQ(c["resources"]["claims"], json::array({{{"name", "gpu-main"}}}));
  EXPECT_EQ(after["spec"]["resourceClaims"],
            json::array({{{"name", "gpu-main"}, {"resourceClaimTemplateName", "tessera-gpu-c30-m4096"}}}));
  // kube-scheduler's own profile binds it once Tessera's DRA placement lifts the gate added here.
  EXPECT_FALSE(after["spec"].contains("schedulerName"));
  EXPECT_EQ(after["spec"]["schedulingGates"], json::array({{{"name", "tessera.dev/dra-placement"}}}));
  EXPECT_EQ(after["metadata"]["labels"]["tessera.dev/dra-placement"], "gated");
  EXPECT_TRUE(after["metadata"]["annotations"].contains("tessera.dev/dra-gated-at"));
  EXPECT_FALSE(after["metadata"]["annotations"].contains("tessera.dev/gpu-added"));
  // The gate was decided on the pod with its claims.
  ASSERT_EQ(w.gated_pods.size(), 1u);
  EXPECT_EQ(w.gated_pods[0]["spec"]["resourceClaims"], after["spec"]["resourceClaims"]);
  ASSERT_EQ(w.made.size(), 1u);
  EXPECT_EQ(w.made[0].first, "default");
  EXPECT_EQ(w.made[0].second.name, "tessera-gpu-c30-m4096");
  EXPECT_EQ(w.made[0].second.spec, ShareSpec("30", "4Gi"));
  // The object the maker creates: labelled as Tessera's.
  json object = TemplateObject(w.made[0].second, "default");
  EXPECT_EQ(object["metadata"]["labels"]["app.kubernetes.io/managed-by"], "tessera-scheduler");
  EXPECT_EQ(object["spec"]["spec"], ShareSpec("30", "4Gi"));
  // And kubectl says where the GPUs went.
  json out = w.Out(pod);
  EXPECT_THAT(out["warnings"].dump(), HasSubstr("tessera-gpu-c30-m4096"));
}

// Every system's names, one share of the same meaning: what ParsePodRequest reads from the pod before the
// webhook is what the template states (GPU of 32768 MiB for what is in proportion; docs/requests.md).
TEST(AdmissionDraTest, EachSystemsNamesGiveTheClaimOfTheirMeaning) {
  struct Case {
    const char* what;
    json limits;
    const char* template_name;
    json spec;
  };
  const std::vector<Case> cases = {
      {"tessera",
       {{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}},
       "tessera-gpu-c30-m4096",
       ShareSpec("30", "4Gi")},
      {"tessera, memory in proportion",
       {{"tessera.dev/gpu-cores", "25"}},
       "tessera-gpu-c25-m8192",
       ShareSpec("25", "8Gi")},
      {"tessera, memory percent",
       {{"tessera.dev/gpu-cores", "50"}, {"tessera.dev/gpu-memory-percentage", "25"}},
       "tessera-gpu-c50-m8192",
       ShareSpec("50", "8Gi")},
      {"HAMi",
       {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "1536"}},
       "tessera-gpu-c30-m1536",
       ShareSpec("30", "1536Mi")},
      // HAMi without gpucores: elastic, compute in proportion to memory (4096 of 32768: 12.5%, rounded up).
      {"HAMi, no core limit",
       {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "4096"}},
       "tessera-gpu-elastic-c13-m4096",
       ShareSpec("13", "4Gi", "gpu-elastic.tessera.dev")},
      // gpu-manager: vcuda-memory in units of 256 MiB; elastic without tencent.com/vcuda-core-limit.
      {"gpu-manager",
       {{"tencent.com/vcuda-core", "30"}, {"tencent.com/vcuda-memory", "16"}},
       "tessera-gpu-elastic-c30-m4096",
       ShareSpec("30", "4Gi", "gpu-elastic.tessera.dev")},
      // gpushare: GiB, compute in proportion (8 of 32 GiB: 25%).
      {"gpushare", {{"aliyun.com/gpu-mem", "8"}}, "tessera-gpu-c25-m8192", ShareSpec("25", "8Gi")},
      {"Volcano",
       {{"volcano.sh/vgpu-number", "1"}, {"volcano.sh/vgpu-cores", "20"}, {"volcano.sh/vgpu-memory", "2048"}},
       "tessera-gpu-c20-m2048",
       ShareSpec("20", "2Gi")},
      // Whole GPUs: a count, no capacity (the device's defaults are all of it).
      {"HAMi whole GPUs",
       {{"nvidia.com/gpu", "2"}},
       "tessera-gpu-x2",
       {{"devices",
         {{"requests",
           {{{"name", "gpu"},
             {"exactly",
              {{"deviceClassName", "gpu.tessera.dev"},
               {"allocationMode", "ExactCount"},
               {"count", 2}}}}}}}}}},
      {"two shares on two GPUs",
       {{"tessera.dev/gpu", "2"}, {"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}},
       "tessera-gpu-x2-c30-m4096",
       ShareSpec("30", "4Gi", "gpu.tessera.dev", 2)},
  };
  for (const Case& c : cases) {
    Converting w;
    json after = w.After(Defaulted(PodWith(c.limits)));
    EXPECT_EQ(after["spec"]["resourceClaims"][0]["resourceClaimTemplateName"], c.template_name) << c.what;
    for (const char* list : {"limits", "requests"}) {
      EXPECT_EQ(after["spec"]["containers"][0]["resources"][list], json::object()) << c.what << " " << list;
    }
    const ClaimTemplate* t = w.Made(c.template_name);
    ASSERT_NE(t, nullptr) << c.what;
    EXPECT_EQ(t->spec, c.spec) << c.what << ": " << t->spec.dump();
  }
}

TEST(AdmissionDraTest, TwoAndAHalfGpusAreTwoRequestsOfOneClaim) {
  Converting w;
  w.After(Defaulted(PodWith({{"tessera.dev/gpu-cores", "250"}, {"tessera.dev/gpu-memory", "8192"}})));
  ASSERT_EQ(w.made.size(), 1u);
  EXPECT_EQ(w.made[0].second.name, "tessera-gpu-x2-c50-m8192");
  const json& requests = w.made[0].second.spec["devices"]["requests"];
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_EQ(requests[0]["name"], "gpu-0");
  EXPECT_EQ(requests[0]["exactly"]["count"], 2);
  EXPECT_FALSE(requests[0]["exactly"].contains("capacity"));
  EXPECT_EQ(requests[1]["name"], "gpu-1");
  EXPECT_EQ(requests[1]["exactly"]["capacity"]["requests"], json({{"cores", "50"}, {"memory", "8Gi"}}));
}

TEST(AdmissionDraTest, MultiContainerSidecarAndAPodThatHasClaimsAlready) {
  Converting w;
  json pod = Defaulted(PodWith({{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}}));
  json second = {
      {"name", "side"},
      {"image", "x"},
      {"resources",
       {{"limits", {{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "2048"}, {"nvidia.com/gpucores", "10"}}},
        {"claims", json::array({{{"name", "data"}}})}}}};
  second["resources"]["requests"] = second["resources"]["limits"];
  pod["spec"]["containers"].push_back(second);
  // A native sidecar with a whole GPU, and an ordinary init container without one.
  json sidecar = {
      {"name", "proxy"},
      {"image", "x"},
      {"restartPolicy", "Always"},
      {"resources", {{"limits", {{"tessera.dev/gpu", "1"}}}, {"requests", {{"tessera.dev/gpu", "1"}}}}}};
  json setup = {{"name", "setup"}, {"image", "x"}};
  pod["spec"]["initContainers"] = json::array({setup, sidecar});
  pod["spec"]["resourceClaims"] = json::array({{{"name", "data"}, {"resourceClaimName", "dataset"}}});
  json after = w.After(pod);
  EXPECT_EQ(after["spec"]["resourceClaims"],
            json::array({{{"name", "data"}, {"resourceClaimName", "dataset"}},
                         {{"name", "gpu-proxy"}, {"resourceClaimTemplateName", "tessera-gpu-x1"}},
                         {{"name", "gpu-main"}, {"resourceClaimTemplateName", "tessera-gpu-c30-m4096"}},
                         {{"name", "gpu-side"}, {"resourceClaimTemplateName", "tessera-gpu-c10-m2048"}}}));
  EXPECT_EQ(after["spec"]["containers"][0]["resources"]["claims"], json::array({{{"name", "gpu-main"}}}));
  EXPECT_EQ(after["spec"]["containers"][1]["resources"]["claims"],
            json::array({{{"name", "data"}}, {{"name", "gpu-side"}}}));
  EXPECT_EQ(after["spec"]["initContainers"][1]["resources"]["claims"],
            json::array({{{"name", "gpu-proxy"}}}));
  EXPECT_EQ(after["spec"]["initContainers"][1]["resources"]["limits"], json::object());
  EXPECT_EQ(after["spec"]["initContainers"][0], setup);
  EXPECT_EQ(w.made.size(), 3u);
  // The gate is decided on every claim of the pod, the user's own included.
  ASSERT_EQ(w.gated_pods.size(), 1u);
  EXPECT_EQ(w.gated_pods[0]["spec"]["resourceClaims"].size(), 4u);
}

TEST(AdmissionDraTest, TwoContainersOfOneShapeShareOneTemplate) {
  Converting w;
  json pod = Defaulted(PodWith({{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "4096"}}));
  json second = pod["spec"]["containers"][0];
  second["name"] = "second";
  pod["spec"]["containers"].push_back(second);
  json after = w.After(pod);
  EXPECT_EQ(w.made.size(), 1u);
  EXPECT_EQ(after["spec"]["resourceClaims"].size(), 2u);
  EXPECT_EQ(after["spec"]["resourceClaims"][1],
            json({{"name", "gpu-second"}, {"resourceClaimTemplateName", "tessera-gpu-c30-m4096"}}));
}

TEST(AdmissionDraTest, PriorityModelsAndUuidsAreCarriedAsConfigAndSelectors) {
  Converting w;
  json pod = Defaulted(PodWith({{"nvidia.com/gpu", "1"},
                                {"nvidia.com/gpucores", "30"},
                                {"nvidia.com/gpumem", "4096"},
                                {"nvidia.com/priority", "0"}}));
  pod["metadata"]["annotations"] = {{"tessera.dev/gpu-model", "Tesla V100-SXM2-32GB,A100-SXM4-80GB"},
                                    {"tessera.dev/gpu-uuid-exclude", "GPU-1234"}};
  w.After(pod);
  ASSERT_EQ(w.made.size(), 1u);
  const ClaimTemplate& t = w.made[0].second;
  // The shape and a hash of what the name does not say.
  EXPECT_THAT(t.name, ::testing::StartsWith("tessera-gpu-c30-m4096-"));
  EXPECT_EQ(t.name.size(), std::string("tessera-gpu-c30-m4096-").size() + 8);
  EXPECT_EQ(
      t.spec["devices"]["config"],
      json::array({{{"opaque", {{"driver", "gpu.tessera.dev"}, {"parameters", {{"priority", "high"}}}}}}}));
  EXPECT_EQ(
      t.spec["devices"]["requests"][0]["exactly"]["selectors"],
      json::array(
          {{{"cel",
             {{"expression",
               "device.attributes[\"gpu.tessera.dev\"].model == \"Tesla V100-SXM2-32GB\" || "
               "device.attributes[\"gpu.tessera.dev\"].model == \"A100-SXM4-80GB\""}}}},
           {{"cel", {{"expression", "device.attributes[\"gpu.tessera.dev\"].uuid != \"GPU-1234\""}}}}}));
  // HAMi's use-gputype matches a word in any case: CEL's contains on the lowered model.
  Converting hami;
  json word = Defaulted(
      PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}, {"nvidia.com/gpumem", "4096"}}));
  word["metadata"]["annotations"] = {{"nvidia.com/use-gputype", "A100"}};
  hami.After(word);
  ASSERT_EQ(hami.made.size(), 1u);
  EXPECT_EQ(
      hami.made[0].second.spec["devices"]["requests"][0]["exactly"]["selectors"][0]["cel"]["expression"],
      "device.attributes[\"gpu.tessera.dev\"].model.lowerAscii().contains(\"a100\")");
  // A model name that would need escaping in CEL is refused, not pasted.
  Converting hostile;
  json quote = word;
  quote["metadata"]["annotations"] = {{"tessera.dev/gpu-model", "A100\") || true || (\""}};
  json out = hostile.Out(quote);
  EXPECT_FALSE(out["allowed"]);
  EXPECT_THAT(out["status"]["message"].get<std::string>(), HasSubstr("CEL selector"));
  EXPECT_TRUE(hostile.made.empty());
}

TEST(AdmissionDraTest, DryRunCreatesNothing) {
  Converting w;
  json after = w.After(Defaulted(PodWith({{"tessera.dev/gpu", "1"}})), /*dry_run=*/true);
  EXPECT_TRUE(w.made.empty());
  EXPECT_EQ(after["spec"]["resourceClaims"][0]["resourceClaimTemplateName"], "tessera-gpu-x1");
}

TEST(AdmissionDraTest, ATemplateThatCannotBeMadeRefusesThePodSayingWhy) {
  Converting w;
  w.ensure_error = absl::FailedPreconditionError(
      "ResourceClaimTemplate default/tessera-gpu-x1 exists but was not made by tessera-scheduler");
  json out = w.Out(Defaulted(PodWith({{"tessera.dev/gpu", "1"}})));
  EXPECT_FALSE(out["allowed"]);
  EXPECT_THAT(out["status"]["message"].get<std::string>(),
              HasSubstr("tessera: pod default/p: ResourceClaimTemplate"));
  EXPECT_EQ(w.admission.decisions(Admission::Verb::kMutate, Admission::Decision::kDenied), 1u);
}

TEST(AdmissionDraTest, WhenToConvert) {
  const json pod = Defaulted(PodWith({{"tessera.dev/gpu", "1"}}));
  auto converts = [&](ExtendedToDra mode, DraOffer offer) {
    Converting w(mode, offer);
    return w.After(pod)["spec"].contains("resourceClaims");
  };
  EXPECT_TRUE(converts(ExtendedToDra::kAuto, {.driver = true}));
  EXPECT_FALSE(converts(ExtendedToDra::kAuto, {.device_plugin = true, .driver = true}));
  EXPECT_FALSE(converts(ExtendedToDra::kAuto, {}));
  EXPECT_TRUE(converts(ExtendedToDra::kAlways, {.device_plugin = true}));
  EXPECT_FALSE(converts(ExtendedToDra::kNever, {.driver = true}));
  // Not converted: the device-plugin path's patch, as before.
  Converting never(ExtendedToDra::kNever);
  json after = never.After(Defaulted(PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "30"}})));
  EXPECT_EQ(after["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/gpu-cores"], "30");
  EXPECT_EQ(after["spec"]["schedulerName"], "tessera-scheduler");
  EXPECT_TRUE(never.made.empty());
  // A pod without GPUs is never touched.
  Converting w;
  EXPECT_EQ(w.After(PodWith({{"cpu", "1"}})), PodWith({{"cpu", "1"}}));
  EXPECT_TRUE(w.made.empty());
}

TEST(AdmissionDraTest, HostileRequestsAreRefusedBeforeAnythingIsMade) {
  struct Case {
    json limits;
    const char* message;
  };
  const std::vector<Case> cases = {
      {{{"tessera.dev/gpu", "1000000"}}, "tessera.dev/gpu"},
      {{{"tessera.dev/gpu", "9223372036854775807"}}, "tessera.dev/gpu"},
      {{{"tessera.dev/gpu-cores", "-5"}}, "gpu-cores"},
      {{{"tessera.dev/gpu-cores", "30"}, {"tessera.dev/gpu-memory", "-1"}}, "gpu-memory"},
      {{{"nvidia.com/gpu", "1"}, {"nvidia.com/gpumem", "99999999999999999999"}}, "nvidia.com/gpumem"},
  };
  for (const Case& c : cases) {
    Converting w;
    json out = w.Out(Defaulted(PodWith(c.limits)));
    EXPECT_FALSE(out["allowed"]) << c.limits.dump();
    EXPECT_THAT(out["status"]["message"].get<std::string>(), HasSubstr(c.message)) << c.limits.dump();
    EXPECT_TRUE(w.made.empty()) << c.limits.dump();
  }
  // The pod's own claim of the name the webhook would give: refused, saying which.
  Converting w;
  json pod = Defaulted(PodWith({{"tessera.dev/gpu", "1"}}));
  pod["spec"]["resourceClaims"] = json::array({{{"name", "gpu-main"}, {"resourceClaimName", "mine"}}});
  json out = w.Out(pod);
  EXPECT_FALSE(out["allowed"]);
  EXPECT_THAT(out["status"]["message"].get<std::string>(), HasSubstr("\"gpu-main\""));
  EXPECT_TRUE(w.made.empty());
  // Memory in proportion when the DRA GPUs differ in memory: no claim can say it; the message says what to
  // write.
  Converting mixed(ExtendedToDra::kAlways, {.driver = true, .memory_mib = {16384, 32768}});
  out = mixed.Out(Defaulted(PodWith({{"aliyun.com/gpu-mem", "8"}})));
  EXPECT_FALSE(out["allowed"]);
  EXPECT_THAT(out["status"]["message"].get<std::string>(), HasSubstr("16384, 32768 MiB"));
  EXPECT_THAT(out["status"]["message"].get<std::string>(), HasSubstr("tessera.dev/gpu-memory"));
  EXPECT_TRUE(mixed.made.empty());
  // The same pod with both stated converts on that cluster.
  Converting stated(ExtendedToDra::kAlways, {.driver = true, .memory_mib = {16384, 32768}});
  stated.After(Defaulted(
      PodWith({{"nvidia.com/gpu", "1"}, {"nvidia.com/gpucores", "25"}, {"nvidia.com/gpumem", "8192"}})));
  EXPECT_EQ(stated.made.size(), 1u);
}

TEST(AdmissionTest, MutateDraStampsTheGateWithItsClock) {
  // The gated-at annotation is the time tessera-node's fallback measures a pod's wait from (docs/dra.md), so
  // the webhook reads it from its clock. The expected text is FakeClock's start, 2024-01-01T00:00:00Z, as
  // formats::FormatHeartbeat writes RFC 3339 (milliseconds, UTC; src/formats/dra_placement.h).
  FakeClock clock;
  AdmissionOptions options;
  options.clock = &clock;
  Admission admission(options);
  admission.SetDraGate([](const json&) { return true; });
  const json pod = {{"apiVersion", "v1"},
                    {"kind", "Pod"},
                    {"metadata", {{"name", "p"}, {"namespace", "default"}}},
                    {"spec", {{"containers", {{{"name", "main"}, {"image", "x"}}}}}}};
  auto gated_at = [&] {
    const Response r = admission.MutateDra(Review(pod));
    EXPECT_EQ(r.status, 200);
    const json out = json::parse(r.body);
    EXPECT_TRUE(out["response"]["allowed"]);
    const json patched = Apply(pod, json::parse(Decode64(out["response"]["patch"])));
    EXPECT_EQ(patched["metadata"]["labels"][formats::kDraPlacementLabel], formats::kDraGated);
    return patched["metadata"]["annotations"][formats::kDraGatedAtAnnotation].get<std::string>();
  };
  EXPECT_EQ(gated_at(), "2024-01-01T00:00:00.000Z");
  clock.Advance(std::chrono::milliseconds(90'500));
  EXPECT_EQ(gated_at(), "2024-01-01T00:01:30.500Z");
}

}  // namespace
}  // namespace tessera::scheduler
