// The webhook's registration as shipped (deploy/scheduler/50-webhooks.yaml and the Helm chart's template):
// one mutating webhook, failurePolicy Fail, and matchConditions that name exactly the resource names the
// request parser reads, so that the list cannot drift from the parser. What the API server does with it (a
// non-GPU pod created without a call, a GPU pod refused while the webhook is down) is the cluster tier's
// (tests/cluster/test_cluster.py).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "core/request_parser.h"

namespace tessera::scheduler {
namespace {

std::string Read(const std::string& path) {
  std::ifstream in(std::string(TESSERA_SOURCE_DIR) + "/" + path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The quoted names of the matchConditions' `r in [...]` list.
std::set<std::string> ListedNames(const std::string& text) {
  const size_t start = text.find("r in [");
  EXPECT_NE(start, std::string::npos);
  const size_t end = text.find(']', start);
  const std::string list = text.substr(start, end - start);
  std::set<std::string> names;
  const std::regex quoted("'([^']+)'");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), quoted); it != std::sregex_iterator(); ++it) {
    names.insert((*it)[1]);
  }
  return names;
}

// The parser's names, less Tessera's own (the conditions take every tessera.dev/ name, typos included, so
// that the webhook can refuse them with a message).
std::set<std::string> ParserNames() {
  std::set<std::string> names;
  for (const std::string& n : core::GpuResourceNames()) {
    if (!n.starts_with("tessera.dev/")) names.insert(n);
  }
  return names;
}

TEST(WebhookRegistrationTest, ManifestListsExactlyTheParsersNames) {
  for (const char* path :
       {"deploy/scheduler/50-webhooks.yaml", "deploy/helm/tessera/templates/webhooks.yaml"}) {
    const std::string text = Read(path);
    EXPECT_EQ(ListedNames(text), ParserNames()) << path;
    EXPECT_THAT(text, ::testing::HasSubstr("r.startsWith('tessera.dev/')")) << path;
    EXPECT_THAT(text, ::testing::HasSubstr("k.startsWith('tessera.dev/')")) << path;  // annotations
    EXPECT_THAT(text, ::testing::HasSubstr("object.spec.initContainers")) << path;
    EXPECT_THAT(text, ::testing::HasSubstr("c.resources.requests")) << path;
    // One call per pod: no validating webhook.
    EXPECT_THAT(text, ::testing::Not(::testing::HasSubstr("kind: ValidatingWebhookConfiguration"))) << path;
  }
  EXPECT_THAT(Read("deploy/scheduler/50-webhooks.yaml"), ::testing::HasSubstr("failurePolicy: Fail"));
  EXPECT_THAT(Read("deploy/helm/tessera/values.yaml"), ::testing::HasSubstr("failurePolicy: Fail"));
}

// HAMi's names as a cluster renamed them are the parser's too, and the chart's extraResourceNames adds them.
TEST(WebhookRegistrationTest, RenamedHamiNamesAreTheParsers) {
  core::ParseOptions options;
  ASSERT_TRUE(core::ParseHamiNames("gpu=example.com/vgpu", &options.hami).ok());
  const std::vector<std::string> names = core::GpuResourceNames(options);
  EXPECT_THAT(names, ::testing::Contains("example.com/vgpu"));
  EXPECT_THAT(names, ::testing::Not(::testing::Contains("nvidia.com/gpu")));
  EXPECT_THAT(Read("deploy/helm/tessera/templates/webhooks.yaml"),
              ::testing::HasSubstr("range .Values.webhook.extraResourceNames"));
}

}  // namespace
}  // namespace tessera::scheduler
