// The fake API server's own rules, checked directly: the three patch formats, label and field selectors, the
// store's write rules (status subresource, finalizers, binding, history limits), resources it did not know,
// and the fake-apiserver binary as a user runs it.
#include "fake_apiserver.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "k8s/api_status.h"
#include "k8s/config.h"
#include "k8s/k8s_test_util.h"
#include "patch.h"
#include "selectors.h"
#include "store.h"

namespace tessera::fake {
namespace {

using k8s::testing::FakeCluster;
using k8s::testing::MakePod;
using k8s::testing::TempDir;
using k8s::testing::WaitUntil;
using ::testing::HasSubstr;

Json Apply(const Json& target, PatchKind kind, const Json& patch) {
  absl::StatusOr<Json> out = ApplyPatch(target, kind, patch);
  EXPECT_TRUE(out.ok()) << out.status() << " patching " << target.dump() << " with " << patch.dump();
  return out.ok() ? *out : Json();
}

TEST(PatchTest, MergePatchFollowsRfc7386) {
  Json target = Json::parse(R"({"a":"b","c":{"d":"e","f":"g"},"list":[1,2]})");
  Json patch = Json::parse(R"({"a":"z","c":{"f":null,"h":"i"},"list":[3],"new":{"x":null}})");
  EXPECT_EQ(Apply(target, PatchKind::kMerge, patch),
            Json::parse(R"({"a":"z","c":{"d":"e","h":"i"},"list":[3],"new":{}})"));
  // An object cannot become an array: the API refuses such a patch.
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyPatch(target, PatchKind::kMerge, Json::array({1})).status()));
}

TEST(PatchTest, StrategicMergeByKeyAndDirectives) {
  Json pod = Json::parse(R"({
    "metadata": {"finalizers": ["a", "b"], "annotations": {"x": "1"}},
    "spec": {"containers": [
      {"name": "main", "image": "v1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
      {"name": "side", "image": "s1"}],
      "tolerations": [{"key": "t1"}]},
    "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "PodScheduled", "status": "True"}]}
  })");
  Json patch = Json::parse(R"({
    "metadata": {"finalizers": ["c", "a"], "annotations": {"x": null, "y": "2"}},
    "spec": {"containers": [
      {"name": "main", "image": "v2", "env": [{"name": "B", "value": "3"}, {"name": "C", "value": "4"}]},
      {"name": "side", "$patch": "delete"},
      {"name": "new", "image": "n1"}],
      "tolerations": [{"key": "t2"}]},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]}
  })");
  Json out = Apply(pod, PatchKind::kStrategic, patch);
  EXPECT_EQ(out["metadata"]["finalizers"], Json::parse(R"(["a","b","c"])"));
  EXPECT_EQ(out["metadata"]["annotations"], Json::parse(R"({"y":"2"})"));
  const Json& containers = out["spec"]["containers"];
  ASSERT_EQ(containers.size(), 2u);
  EXPECT_EQ(containers[0]["name"], "main");
  EXPECT_EQ(containers[0]["image"], "v2");
  EXPECT_EQ(containers[0]["env"], Json::parse(R"([{"name":"A","value":"1"},{"name":"B","value":"3"},
                                                  {"name":"C","value":"4"}])"));
  EXPECT_EQ(containers[1]["name"], "new");
  EXPECT_EQ(out["spec"]["tolerations"], Json::parse(R"([{"key":"t2"}])"));  // no merge key: replaced
  EXPECT_EQ(out["status"]["conditions"][0]["status"], "True");
  EXPECT_EQ(out["status"]["conditions"][1]["type"], "PodScheduled");

  Json replaced = Apply(pod, PatchKind::kStrategic,
                        Json::parse(R"({"metadata":{"annotations":{"$patch":"replace","z":"9"}}})"));
  EXPECT_EQ(replaced["metadata"]["annotations"], Json::parse(R"({"z":"9"})"));
  Json removed = Apply(pod, PatchKind::kStrategic,
                       Json::parse(R"({"metadata":{"$deleteFromPrimitiveList/finalizers":["a"]}})"));
  EXPECT_EQ(removed["metadata"]["finalizers"], Json::parse(R"(["b"])"));
  Json retained = Apply(pod, PatchKind::kStrategic,
                        Json::parse(R"({"spec":{"$retainKeys":["containers"],"containers":[]}})"));
  EXPECT_FALSE(retained["spec"].contains("tolerations"));

  EXPECT_TRUE(absl::IsInvalidArgument(
      ApplyPatch(pod, PatchKind::kStrategic, Json::parse(R"({"spec":{"containers":{"name":"x"}}})"))
          .status()));
}

TEST(PatchTest, JsonPatchOperations) {
  Json doc = Json::parse(R"({"metadata":{"annotations":{"a/b":"1"}},"list":[1,2]})");
  Json ops = Json::parse(R"([
    {"op":"add","path":"/list/-","value":3},
    {"op":"replace","path":"/metadata/annotations/a~1b","value":"2"},
    {"op":"copy","from":"/list","path":"/copy"},
    {"op":"move","from":"/copy","path":"/moved"},
    {"op":"remove","path":"/list/0"},
    {"op":"test","path":"/moved/2","value":3}
  ])");
  EXPECT_EQ(Apply(doc, PatchKind::kJson, ops),
            Json::parse(R"({"metadata":{"annotations":{"a/b":"2"}},"list":[2,3],"moved":[1,2,3]})"));
  EXPECT_TRUE(absl::IsFailedPrecondition(
      ApplyPatch(doc, PatchKind::kJson, Json::parse(R"([{"op":"remove","path":"/nope"}])")).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ApplyPatch(doc, PatchKind::kJson, Json::object()).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      ApplyPatch(doc, PatchKind::kJson, Json::parse(R"([{"op":"frobnicate","path":"/a"}])")).status()));
}

TEST(SelectorTest, LabelSelectors) {
  Json labels = {{"app", "web"}, {"tier", "front"}, {"canary", "true"}};
  auto matches = [&](const std::string& s) {
    absl::StatusOr<LabelSelector> l = LabelSelector::Parse(s);
    EXPECT_TRUE(l.ok()) << s << ": " << l.status();
    return l.ok() && l->Matches(labels);
  };
  EXPECT_TRUE(matches(""));
  EXPECT_TRUE(matches("app=web"));
  EXPECT_TRUE(matches("app==web,tier!=back"));
  EXPECT_TRUE(matches("tier in (front, middle)"));
  EXPECT_FALSE(matches("tier notin (front)"));
  EXPECT_TRUE(matches("canary"));
  EXPECT_FALSE(matches("!canary"));
  EXPECT_TRUE(matches("!missing,missing!=x"));
  EXPECT_FALSE(matches("app=db"));
  EXPECT_FALSE(LabelSelector::Parse("app in web").ok());
  EXPECT_FALSE(LabelSelector::Parse("=x").ok());
  EXPECT_FALSE(LabelSelector::Parse("a=b=c").ok());
}

TEST(SelectorTest, FieldSelectors) {
  Json pod = {{"metadata", {{"name", "p"}, {"namespace", "ns"}}},
              {"spec", {{"nodeName", "gpu-1"}}},
              {"status", {{"phase", "Running"}}}};
  absl::StatusOr<FieldSelector> f = FieldSelector::Parse("spec.nodeName=gpu-1,status.phase!=Failed");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE(f->Matches(pod));
  EXPECT_EQ(f->EqualityValue("spec.nodeName"), "gpu-1");
  EXPECT_FALSE(FieldSelector::Parse("metadata.name==q")->Matches(pod));
  EXPECT_TRUE(FieldSelector::Parse("spec.schedulerName=")->Matches(pod));  // absent reads as ""
  EXPECT_FALSE(FieldSelector::Parse("spec.nodeName").ok());
}

TEST(StoreTest, StatusSubresourceFinalizersAndHistory) {
  StoreOptions options;
  options.history_limit = 3;
  FakeCluster c({.store = options});
  k8s::KubeApi& api = *c.api;
  absl::StatusOr<Json> pod = api.Create(k8s::kPods, "default", MakePod("p"));
  ASSERT_TRUE(pod.ok());
  EXPECT_EQ((*pod)["status"]["phase"], "Pending");

  // Writes to the object keep its status; writes to /status change only the status.
  Json changed = *pod;
  changed["status"]["phase"] = "Running";
  changed["metadata"]["labels"]["a"] = "b";
  absl::StatusOr<Json> main = api.Update(k8s::kPods, "", changed);
  ASSERT_TRUE(main.ok()) << main.status();
  EXPECT_EQ((*main)["status"]["phase"], "Pending");
  absl::StatusOr<Json> status =
      api.Patch(k8s::kPods, "default", "p", k8s::PatchType::kMerge,
                {{"status", {{"phase", "Running"}}}, {"metadata", {{"labels", {{"c", "d"}}}}}}, "status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ((*status)["status"]["phase"], "Running");
  EXPECT_FALSE(k8s::Label(*status, "c").has_value());

  // Pod specs are immutable apart from the fields the API allows.
  absl::Status spec =
      api.Patch(k8s::kPods, "default", "p", k8s::PatchType::kMerge, {{"spec", {{"restartPolicy", "Never"}}}})
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(spec)) << spec;

  // A finalizer holds a deleted object until it is removed.
  ASSERT_TRUE(api.Patch(k8s::kPods, "default", "p", k8s::PatchType::kMerge,
                        {{"metadata", {{"finalizers", {"tessera.dev/cleanup"}}}}})
                  .ok());
  ASSERT_TRUE(api.Delete(k8s::kPods, "default", "p").ok());
  absl::StatusOr<Json> deleting = api.Get(k8s::kPods, "default", "p");
  ASSERT_TRUE(deleting.ok());
  EXPECT_TRUE((*deleting)["metadata"].contains("deletionTimestamp"));
  ASSERT_TRUE(
      api.Patch(k8s::kPods, "default", "p", k8s::PatchType::kMerge, {{"metadata", {{"finalizers", nullptr}}}})
          .ok());
  EXPECT_TRUE(absl::IsNotFound(api.Get(k8s::kPods, "default", "p").status()));

  // Only the last 3 events are kept: a watch from the first version is gone.
  absl::Status gone =
      api.Watch(k8s::kPods, "", {.resource_version = k8s::ResourceVersion(*pod)}, [](k8s::WatchEvent&&) {});
  EXPECT_TRUE(k8s::IsGone(gone)) << gone;
}

TEST(StoreTest, BindingMarksThePodScheduled) {
  FakeCluster c;
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("p")).ok());
  ASSERT_TRUE(c.api->Bind("default", "p", "gpu-1").ok());
  absl::StatusOr<Json> p = c.server->Get("pods", "default", "p");
  ASSERT_TRUE(p.ok());
  bool scheduled = false;
  for (const Json& cond : (*p)["status"]["conditions"]) {
    scheduled = scheduled || (cond["type"] == "PodScheduled" && cond["status"] == "True");
  }
  EXPECT_TRUE(scheduled);
  absl::Status bad =
      c.api->CreateSubresource(k8s::kPods, "default", "p", "binding", {{"kind", "Binding"}}).status();
  EXPECT_FALSE(bad.ok());
}

TEST(StoreTest, ResourcesItDoesNotKnowAreServedByPath) {
  FakeCluster c;
  k8s::ResourceType widgets{"example.com", "v1", "widgets", "Widget", true};
  absl::StatusOr<Json> w = c.api->Create(widgets, "default",
                                         {{"apiVersion", "example.com/v1"},
                                          {"kind", "Widget"},
                                          {"metadata", {{"name", "w1"}, {"labels", {{"size", "big"}}}}},
                                          {"spec", {{"teeth", 3}}}});
  ASSERT_TRUE(w.ok()) << w.status();
  absl::StatusOr<k8s::ObjectList> list = c.api->ListAll(widgets, "", {.label_selector = "size=big"});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->items.size(), 1u);
  absl::StatusOr<Json> patched =
      c.api->Patch(widgets, "default", "w1", k8s::PatchType::kMerge, {{"spec", {{"teeth", 4}}}});
  ASSERT_TRUE(patched.ok()) << patched.status();
  EXPECT_EQ((*patched)["spec"]["teeth"], 4);
  k8s::ResourceType gadgets{"example.com", "v1", "gadgets", "Gadget", false};
  EXPECT_TRUE(c.api->Create(gadgets, "", {{"metadata", {{"name", "g"}}}}).ok());
  EXPECT_TRUE(c.api->Get(gadgets, "", "g").ok());
  EXPECT_EQ(c.server->List("gadgets.example.com").size(), 1u);
}

TEST(FaultTest, LatencyAndPathPrefixes) {
  FakeCluster c;
  ASSERT_TRUE(c.server->Create("pods", "a", MakePod("p", "a")).ok());
  ASSERT_TRUE(c.server->Create("pods", "b", MakePod("p", "b")).ok());
  c.server->FailRequests({.verb = "", .path_prefix = "/api/v1/namespaces/a/", .status = 404, .count = -1});
  EXPECT_TRUE(absl::IsNotFound(c.api->Get(k8s::kPods, "a", "p").status()));
  EXPECT_TRUE(c.api->Get(k8s::kPods, "b", "p").ok());
  c.server->ClearFaults();
  c.server->SetLatency(std::chrono::milliseconds(30));
  auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(c.api->Get(k8s::kPods, "a", "p").ok());
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(30));  // a lower bound only
}

// The binary as a user runs it: flags, the kubeconfig it writes, a client using it, a clean stop.
TEST(FakeApiServerBinaryTest, ServesAndWritesAKubeconfig) {
  TempDir dir;
  std::string kubeconfig = dir.path() + "/kubeconfig";
  std::string ca = dir.path() + "/ca.crt";
  std::string bin = std::string(TESSERA_BINARY_DIR) + "/bin/fake-apiserver";
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  const pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // Dies with the test binary (killed by its timeout, or done after an assertion ended this test early).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    execl(bin.c_str(), bin.c_str(), "--listen", "127.0.0.1:0", "--token", "demo", "--tls", "--ca-out",
          ca.c_str(), "--nodes", "3", "--write-kubeconfig", kubeconfig.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(out[1]);
  FILE* f = fdopen(out[0], "r");
  char line[256] = {0};
  ASSERT_NE(fgets(line, sizeof(line), f), nullptr) << "no output from " << bin;
  EXPECT_THAT(std::string(line), HasSubstr("listening on https://127.0.0.1:"));

  absl::StatusOr<k8s::ClientConfig> config = k8s::LoadKubeconfig({.paths = kubeconfig});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->token, "demo");
  absl::StatusOr<std::unique_ptr<k8s::KubeApi>> api = k8s::NewKubeApi(*config);
  ASSERT_TRUE(api.ok());
  absl::StatusOr<k8s::ObjectList> nodes = (*api)->ListAll(k8s::kNodes, "");
  ASSERT_TRUE(nodes.ok()) << nodes.status();
  EXPECT_EQ(nodes->items.size(), 3u);

  kill(pid, SIGTERM);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  fclose(f);

  // Bad flags: a clear message and a non-zero exit.
  std::string cmd = bin + " --listen nonsense 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string text;
  while (fgets(line, sizeof(line), p) != nullptr) text += line;
  EXPECT_NE(pclose(p), 0);
  EXPECT_THAT(text, HasSubstr("ADDRESS:PORT"));
}

}  // namespace
}  // namespace tessera::fake
