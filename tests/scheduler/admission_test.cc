// The admission webhook's AdmissionReview in and out (admission.k8s.io/v1).
#include "scheduler/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

// Applies a JSON patch the way the API server would (only the ops the webhook emits).
json Apply(json doc, const json& patch) {
  for (const json& op : patch) {
    doc[json::json_pointer(op["path"].get<std::string>())] = op["value"];
  }
  return doc;
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

}  // namespace
}  // namespace tessera::scheduler
