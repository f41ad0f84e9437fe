// The libcurl client against the fake API server over real HTTP(S) on loopback: CRUD, optimistic concurrency,
// the three patch forms, pods/binding, lists with selectors and pages, watches (bookmarks, 410, broken
// streams), retries after 429/5xx, authentication (tokens, token rotation, client certificates) and TLS.
#include "k8s/kube_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "certs.h"
#include "k8s/api_status.h"
#include "k8s/k8s_test_util.h"

namespace tessera::k8s {
namespace {

using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakeNodeObject;
using testing::MakePod;
using testing::TempDir;
using testing::WaitUntil;

// Runs a watch on its own thread and collects its events.
class WatchCollector {
 public:
  WatchCollector(KubeApi& api, const ResourceType& type, std::string ns, WatchOptions options) {
    options.stop = stop_.get_token();
    thread_ = std::thread([this, &api, type, ns, options] {
      absl::Status s = api.Watch(type, ns, options, [this](WatchEvent&& e) {
        std::lock_guard<std::mutex> lock(mu_);
        events_.push_back(std::move(e));
      });
      std::lock_guard<std::mutex> lock(mu_);
      result_ = s;
      done_ = true;
    });
  }
  ~WatchCollector() { Stop(); }
  void Stop() {
    stop_.request_stop();
    if (thread_.joinable()) thread_.join();
  }
  std::vector<WatchEvent> events() const {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  size_t count(WatchEvent::Type type) const {
    std::lock_guard<std::mutex> lock(mu_);
    size_t n = 0;
    for (const WatchEvent& e : events_) n += e.type == type ? 1 : 0;
    return n;
  }
  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  absl::Status result() const {
    std::lock_guard<std::mutex> lock(mu_);
    return result_;
  }

 private:
  std::stop_source stop_;
  mutable std::mutex mu_;
  std::vector<WatchEvent> events_;
  absl::Status result_;
  bool done_ = false;
  std::thread thread_;
};

TEST(KubeApiTest, CreateGetUpdateDelete) {
  FakeCluster c;
  absl::StatusOr<Json> created = c.api->Create(kPods, "default", MakePod("web-0"));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(Name(*created), "web-0");
  EXPECT_FALSE(Uid(*created).empty());
  EXPECT_FALSE(ResourceVersion(*created).empty());

  EXPECT_TRUE(absl::IsAlreadyExists(c.api->Create(kPods, "default", MakePod("web-0")).status()));

  absl::StatusOr<Json> got = c.api->Get(kPods, "default", "web-0");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(ResourceVersion(*got), ResourceVersion(*created));

  Json changed = *got;
  changed["metadata"]["labels"]["tier"] = "gpu";
  absl::StatusOr<Json> updated = c.api->Update(kPods, "", changed);
  ASSERT_TRUE(updated.ok()) << updated.status();
  EXPECT_EQ(Label(*updated, "tier"), "gpu");
  EXPECT_NE(ResourceVersion(*updated), ResourceVersion(*got));

  // A write based on the old resourceVersion is refused: read again and retry.
  changed["metadata"]["labels"]["tier"] = "cpu";
  absl::StatusOr<Json> stale = c.api->Update(kPods, "", changed);
  EXPECT_TRUE(IsConflict(stale.status())) << stale.status();
  std::optional<ApiError> e = GetApiError(stale.status());
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_code, 409);
  EXPECT_EQ(e->reason, "Conflict");

  // Delete with a stale precondition fails; a plain delete works.
  EXPECT_TRUE(IsConflict(c.api->Delete(kPods, "default", "web-0",
                                       {.precondition_uid = "",
                                        .precondition_resource_version = "1",
                                        .grace_period_seconds = std::nullopt,
                                        .propagation_policy = ""})));
  EXPECT_TRUE(c.api->Delete(kPods, "default", "web-0").ok());
  EXPECT_TRUE(absl::IsNotFound(c.api->Get(kPods, "default", "web-0").status()));
  EXPECT_TRUE(absl::IsNotFound(c.api->Delete(kPods, "default", "web-0")));

  // Cluster-scoped objects and a namespaced call without a namespace.
  ASSERT_TRUE(c.api->Create(kNodes, "", MakeNodeObject("gpu-1")).ok());
  EXPECT_TRUE(c.api->Get(kNodes, "", "gpu-1").ok());
  absl::Status no_ns = c.api->Get(kPods, "", "web-0").status();
  EXPECT_TRUE(absl::IsInvalidArgument(no_ns));
  EXPECT_THAT(std::string(no_ns.message()), HasSubstr("namespace"));
}

TEST(KubeApiTest, PatchForms) {
  FakeCluster c;
  Json pod = MakePod("web-0");
  pod["metadata"]["annotations"] = {{"keep", "1"}, {"drop", "2"}};
  pod["spec"]["containers"] = {{{"name", "a"}, {"image", "img-a"}}, {{"name", "b"}, {"image", "img-b"}}};
  ASSERT_TRUE(c.api->Create(kPods, "default", pod).ok());

  // Merge patch: annotations merge, null deletes.
  absl::StatusOr<Json> merged =
      c.api->Patch(kPods, "default", "web-0", PatchType::kMerge,
                   {{"metadata", {{"annotations", {{"tessera.dev/phase", "bound"}, {"drop", nullptr}}}}}});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(Annotation(*merged, "tessera.dev/phase"), "bound");
  EXPECT_EQ(Annotation(*merged, "keep"), "1");
  EXPECT_FALSE(Annotation(*merged, "drop").has_value());

  // Strategic merge patch: containers merge by name (a merge patch would replace the whole list).
  absl::StatusOr<Json> strategic =
      c.api->Patch(kPods, "default", "web-0", PatchType::kStrategicMerge,
                   {{"metadata", {{"labels", {{"app", "web"}}}}},
                    {"spec", {{"containers", {{{"name", "b"}, {"image", "img-b2"}}}}}}});
  ASSERT_TRUE(strategic.ok()) << strategic.status();
  ASSERT_EQ((*strategic)["spec"]["containers"].size(), 2u);
  EXPECT_EQ((*strategic)["spec"]["containers"][0]["image"], "img-a");
  EXPECT_EQ((*strategic)["spec"]["containers"][1]["image"], "img-b2");
  EXPECT_EQ(Label(*strategic, "app"), "web");

  // JSON patch, including a failed test operation (422).
  absl::StatusOr<Json> json_patched =
      c.api->Patch(kPods, "default", "web-0", PatchType::kJson,
                   Json::array({{{"op", "add"}, {"path", "/metadata/annotations/x"}, {"value", "y"}}}));
  ASSERT_TRUE(json_patched.ok()) << json_patched.status();
  EXPECT_EQ(Annotation(*json_patched, "x"), "y");
  absl::Status failed_test =
      c.api
          ->Patch(kPods, "default", "web-0", PatchType::kJson,
                  Json::array({{{"op", "test"}, {"path", "/metadata/annotations/x"}, {"value", "z"}}}))
          .status();
  EXPECT_TRUE(absl::IsInvalidArgument(failed_test)) << failed_test;
  EXPECT_EQ(GetApiError(failed_test)->http_code, 422);

  // Node annotations, as the node agent writes them.
  ASSERT_TRUE(c.api->Create(kNodes, "", MakeNodeObject("gpu-1")).ok());
  absl::StatusOr<Json> node = c.api->Patch(
      kNodes, "", "gpu-1", PatchType::kMerge,
      {{"metadata",
        {{"annotations", {{"tessera.dev/gpu-inventory", "{\"v\":1}"}, {"tessera.dev/heartbeat", "t"}}}}}});
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(Annotation(*node, "tessera.dev/gpu-inventory"), "{\"v\":1}");

  EXPECT_TRUE(absl::IsNotFound(
      c.api->Patch(kPods, "default", "nope", PatchType::kMerge, {{"metadata", Json::object()}}).status()));
  // The server saw each form's content type.
  std::vector<std::string> types;
  for (const fake::RecordedRequest& r : c.server->recent_requests()) {
    if (r.verb == "patch") types.push_back(r.content_type);
  }
  EXPECT_THAT(types, ::testing::IsSupersetOf({"application/merge-patch+json",
                                              "application/strategic-merge-patch+json",
                                              "application/json-patch+json"}));
}

TEST(KubeApiTest, BindSetsNodeOnceAndCopiesAnnotations) {
  FakeCluster c;
  absl::StatusOr<Json> pod = c.api->Create(kPods, "default", MakePod("web-0"));
  ASSERT_TRUE(pod.ok());
  absl::Status wrong_uid =
      c.api->Bind("default", "web-0", "gpu-1", {.pod_uid = "not-the-uid", .annotations = {}});
  EXPECT_TRUE(IsConflict(wrong_uid)) << wrong_uid;

  ASSERT_TRUE(c.api
                  ->Bind("default", "web-0", "gpu-1",
                         {.pod_uid = Uid(*pod), .annotations = {{"tessera.dev/phase", "bound"}}})
                  .ok());
  absl::StatusOr<Json> bound = c.api->Get(kPods, "default", "web-0");
  ASSERT_TRUE(bound.ok());
  EXPECT_EQ(NodeName(*bound), "gpu-1");
  EXPECT_EQ(Annotation(*bound, "tessera.dev/phase"), "bound");

  absl::Status again = c.api->Bind("default", "web-0", "gpu-2");
  EXPECT_TRUE(IsConflict(again)) << again;
  EXPECT_THAT(std::string(again.message()), HasSubstr("gpu-1"));
  EXPECT_TRUE(absl::IsNotFound(c.api->Bind("default", "ghost", "gpu-1")));
}

TEST(KubeApiTest, ListSelectorsAndPages) {
  FakeCluster c;
  for (int i = 0; i < 7; ++i) {
    std::string node = i % 2 == 0 ? "gpu-a" : "gpu-b";
    ASSERT_TRUE(c.server
                    ->Create("pods", i < 5 ? "default" : "other",
                             MakePod(StrCat("p", i), i < 5 ? "default" : "other", node,
                                     {{"app", i < 3 ? "web" : "db"}}))
                    .ok());
  }
  absl::StatusOr<ObjectList> all = c.api->ListAll(kPods, "", {.limit = 2});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->items.size(), 7u);
  EXPECT_FALSE(all->resource_version.empty());
  EXPECT_GE(c.server->requests("list"), 4);  // pages of 2

  absl::StatusOr<ObjectList> page = c.api->List(kPods, "", {.limit = 3});
  ASSERT_TRUE(page.ok());
  EXPECT_EQ(page->items.size(), 3u);
  EXPECT_FALSE(page->continue_token.empty());
  EXPECT_EQ(page->remaining_item_count, 4);

  absl::StatusOr<ObjectList> on_a = c.api->ListAll(kPods, "", {.field_selector = "spec.nodeName=gpu-a"});
  ASSERT_TRUE(on_a.ok());
  EXPECT_EQ(on_a->items.size(), 4u);
  absl::StatusOr<ObjectList> web_default = c.api->ListAll(kPods, "default", {.label_selector = "app=web"});
  ASSERT_TRUE(web_default.ok());
  EXPECT_EQ(web_default->items.size(), 3u);
  absl::StatusOr<ObjectList> by_name = c.api->ListAll(kPods, "", {.field_selector = "metadata.name=p6"});
  ASSERT_TRUE(by_name.ok());
  ASSERT_EQ(by_name->items.size(), 1u);
  EXPECT_EQ(Namespace(by_name->items[0]), "other");
  absl::StatusOr<ObjectList> set = c.api->ListAll(kPods, "", {.label_selector = "app in (db),app!=web"});
  ASSERT_TRUE(set.ok());
  EXPECT_EQ(set->items.size(), 4u);

  absl::Status bad_field = c.api->List(kPods, "", {.field_selector = "spec.unknownField=x"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad_field)) << bad_field;
  absl::Status bad_label = c.api->List(kPods, "", {.label_selector = "app in (web"}).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad_label)) << bad_label;
}

TEST(KubeApiTest, ListAllRestartsWhenContinueTokenExpires) {
  FakeCluster c;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c.server->Create("pods", "default", MakePod(StrCat("p", i))).ok());
  absl::StatusOr<ObjectList> first = c.api->List(kPods, "", {.limit = 2});
  ASSERT_TRUE(first.ok());
  c.server->CompactHistory();  // continue tokens expire
  absl::Status expired =
      c.api->List(kPods, "", {.limit = 2, .continue_token = first->continue_token}).status();
  EXPECT_TRUE(IsGone(expired)) << expired;
  absl::StatusOr<ObjectList> all = c.api->ListAll(kPods, "", {.limit = 2});
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->items.size(), 5u);
}

TEST(KubeApiTest, WatchFromResourceVersion) {
  FakeCluster c;
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("before")).ok());
  absl::StatusOr<ObjectList> list = c.api->ListAll(kPods, "");
  ASSERT_TRUE(list.ok());

  WatchCollector w(*c.api, kPods, "", {.resource_version = list->resource_version, .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  ASSERT_TRUE(c.api->Create(kPods, "default", MakePod("web-0")).ok());
  ASSERT_TRUE(c.api
                  ->Patch(kPods, "default", "web-0", PatchType::kMerge,
                          {{"metadata", {{"annotations", {{"a", "b"}}}}}})
                  .ok());
  ASSERT_TRUE(c.api->Delete(kPods, "default", "web-0").ok());
  ASSERT_TRUE(WaitUntil([&] { return w.events().size() >= 3; }));
  w.Stop();
  EXPECT_TRUE(absl::IsCancelled(w.result())) << w.result();
  std::vector<WatchEvent> events = w.events();
  ASSERT_EQ(events.size(), 3u);  // nothing about "before": it is older than the list
  EXPECT_EQ(events[0].type, WatchEvent::Type::kAdded);
  EXPECT_EQ(events[1].type, WatchEvent::Type::kModified);
  EXPECT_EQ(Annotation(events[1].object, "a"), "b");
  EXPECT_EQ(events[2].type, WatchEvent::Type::kDeleted);
  for (const WatchEvent& e : events) EXPECT_EQ(Name(e.object), "web-0");
}

TEST(KubeApiTest, WatchWithoutVersionStartsWithAddedForEachObject) {
  FakeCluster c;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(c.server->Create("nodes", "", MakeNodeObject(StrCat("n", i))).ok());
  WatchCollector w(*c.api, kNodes, "", {.allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return w.count(WatchEvent::Type::kAdded) == 3; }));
}

TEST(KubeApiTest, WatchFieldSelectorSeesPodsEnterAndLeave) {
  FakeCluster c;
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("web-0")).ok());
  absl::StatusOr<ObjectList> list = c.api->ListAll(kPods, "", {.field_selector = "spec.nodeName=gpu-1"});
  ASSERT_TRUE(list.ok());
  EXPECT_TRUE(list->items.empty());
  WatchCollector w(*c.api, kPods, "",
                   {.resource_version = list->resource_version,
                    .field_selector = "spec.nodeName=gpu-1",
                    .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  ASSERT_TRUE(c.api->Bind("default", "web-0", "gpu-1").ok());  // enters the selection: ADDED
  ASSERT_TRUE(c.api->Delete(kPods, "default", "web-0").ok());
  ASSERT_TRUE(WaitUntil([&] { return w.events().size() >= 2; }));
  std::vector<WatchEvent> events = w.events();
  EXPECT_EQ(events[0].type, WatchEvent::Type::kAdded);
  EXPECT_EQ(NodeName(events[0].object), "gpu-1");
  EXPECT_EQ(events[1].type, WatchEvent::Type::kDeleted);
}

TEST(KubeApiTest, WatchBookmarksCarryTheResourceVersion) {
  fake::FakeApiServerOptions options;
  options.store.bookmark_interval = std::chrono::milliseconds(20);
  FakeCluster c(options);
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("a")).ok());
  absl::StatusOr<ObjectList> list = c.api->ListAll(kPods, "");
  ASSERT_TRUE(list.ok());
  ASSERT_TRUE(c.server->Create("configmaps", "default", {{"metadata", {{"name", "cm"}}}}).ok());
  WatchCollector w(*c.api, kPods, "", {.resource_version = list->resource_version, .allow_bookmarks = true});
  ASSERT_TRUE(WaitUntil([&] { return w.count(WatchEvent::Type::kBookmark) >= 1; }));
  WatchEvent b = w.events().front();
  ASSERT_EQ(b.type, WatchEvent::Type::kBookmark);
  EXPECT_EQ(b.object["kind"], "Pod");
  uint64_t rv = std::stoull(ResourceVersion(b.object));
  EXPECT_GE(rv, std::stoull(list->resource_version));

  // Without allowWatchBookmarks, no bookmark is sent.
  WatchCollector quiet(*c.api, kPods, "",
                       {.resource_version = list->resource_version, .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 2; }));
  ASSERT_TRUE(WaitUntil([&] { return w.count(WatchEvent::Type::kBookmark) >= 3; }));  // time passes
  EXPECT_EQ(quiet.count(WatchEvent::Type::kBookmark), 0u);
}

TEST(KubeApiTest, WatchFromCompactedVersionIsGone) {
  for (bool as_event : {true, false}) {
    SCOPED_TRACE(as_event ? "410 as an ERROR event" : "410 as an HTTP status");
    fake::FakeApiServerOptions options;
    options.gone_as_error_event = as_event;
    FakeCluster c(options);
    ASSERT_TRUE(c.server->Create("pods", "default", MakePod("a")).ok());
    absl::StatusOr<ObjectList> list = c.api->ListAll(kPods, "");
    ASSERT_TRUE(list.ok());
    ASSERT_TRUE(c.server->Create("pods", "default", MakePod("b")).ok());
    c.server->CompactHistory();
    absl::Status s =
        c.api->Watch(kPods, "", {.resource_version = list->resource_version}, [](WatchEvent&&) {});
    EXPECT_TRUE(IsGone(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("too old resource version"));
  }
}

TEST(KubeApiTest, OpenWatchExpiresWithGone) {
  FakeCluster c;
  WatchCollector w(*c.api, kPods, "", {.resource_version = "", .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  c.server->ExpireWatches();
  ASSERT_TRUE(WaitUntil([&] { return w.done(); }));
  EXPECT_TRUE(IsGone(w.result())) << w.result();
}

TEST(KubeApiTest, DroppedWatchIsUnavailable) {
  FakeCluster c;
  WatchCollector w(*c.api, kPods, "", {.resource_version = "", .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  c.server->DropWatches();
  ASSERT_TRUE(WaitUntil([&] { return w.done(); }));
  EXPECT_TRUE(absl::IsUnavailable(w.result())) << w.result();
  EXPECT_THAT(std::string(w.result().message()), HasSubstr("watch again"));
}

TEST(KubeApiTest, MalformedWatchLineIsDataLoss) {
  FakeCluster c;
  WatchCollector w(*c.api, kPods, "", {.resource_version = "", .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  c.server->InjectWatchData("this is not json\n", /*then_drop=*/false);
  ASSERT_TRUE(WaitUntil([&] { return w.done(); }));
  EXPECT_TRUE(absl::IsDataLoss(w.result())) << w.result();
  EXPECT_THAT(std::string(w.result().message()), HasSubstr("not a JSON watch event"));
}

TEST(KubeApiTest, StopEndsAnIdleWatch) {
  FakeCluster c;
  WatchCollector w(*c.api, kPods, "", {.resource_version = "", .allow_bookmarks = false});
  ASSERT_TRUE(WaitUntil([&] { return c.server->open_watches() == 1; }));
  w.Stop();  // would hang here if the stop did not wake the transfer
  EXPECT_TRUE(absl::IsCancelled(w.result()));
}

TEST(KubeApiTest, RetriesAfterRetryAfterThenGivesUp) {
  ClientConfig config;
  config.max_retries = 3;
  FakeCluster c({}, config);
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("a")).ok());
  c.server->FailRequests({.verb = "get", .status = 503, .count = 2, .retry_after_seconds = 0});
  absl::StatusOr<Json> got = c.api->Get(kPods, "default", "a");
  EXPECT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(c.server->requests("get"), 3);

  c.server->FailRequests({.verb = "patch", .status = 429, .count = -1, .retry_after_seconds = 0});
  absl::Status s =
      c.api->Patch(kPods, "default", "a", PatchType::kMerge, {{"metadata", Json::object()}}).status();
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_EQ(c.server->requests("patch"), 4);  // the first try and 3 retries
  EXPECT_EQ(GetApiError(s)->http_code, 429);
  ASSERT_TRUE(GetApiError(s)->retry_after.has_value());
  c.server->ClearFaults();

  // A 500 without Retry-After is returned at once (the caller's backoff decides).
  c.server->FailRequests({.verb = "create", .status = 500, .count = 1});
  absl::Status once = c.api->Create(kPods, "default", MakePod("b")).status();
  EXPECT_TRUE(absl::IsUnavailable(once)) << once;
  EXPECT_THAT(std::string(once.message()), HasSubstr("injected by the test"));
  EXPECT_TRUE(c.api->Create(kPods, "default", MakePod("b")).ok());
}

TEST(KubeApiTest, NonJsonRepliesAndDeadServersSayWhatIsWrong) {
  FakeCluster c;
  c.server->FailRequests(
      {.verb = "get", .status = 200, .count = 1, .body = "<html>proxy</html>", .content_type = "text/html"});
  absl::Status html = c.api->Get(kNodes, "", "x").status();
  EXPECT_TRUE(absl::IsDataLoss(html)) << html;
  EXPECT_THAT(std::string(html.message()), HasSubstr("not JSON"));

  c.server->FailRequests(
      {.verb = "get", .status = 502, .count = 1, .body = "bad gateway", .content_type = "text/plain"});
  absl::Status gateway = c.api->Get(kNodes, "", "x").status();
  EXPECT_TRUE(absl::IsUnavailable(gateway)) << gateway;
  EXPECT_THAT(std::string(gateway.message()), HasSubstr("bad gateway"));

  std::string url = c.server->url();
  c.server->Stop();
  absl::Status down = c.api->Get(kNodes, "", "x").status();
  EXPECT_TRUE(absl::IsUnavailable(down)) << down;
  EXPECT_THAT(std::string(down.message()), HasSubstr(url));

  EXPECT_TRUE(absl::IsInvalidArgument(NewKubeApi(ClientConfig{}).status()));
  ClientConfig ftp;
  ftp.server = "ftp://example";
  EXPECT_TRUE(absl::IsInvalidArgument(NewKubeApi(ftp).status()));
}

TEST(KubeApiTest, BearerTokensAndTokenFileRotation) {
  TempDir dir;
  std::string token_file = dir.Write("token", "first\n");
  ClientConfig config;
  config.token_file = token_file;
  FakeCluster c({.tokens = {"first"}}, config);
  EXPECT_TRUE(c.api->Create(kNodes, "", MakeNodeObject("n")).ok());

  // The kubelet rotates the token: the server accepts only the new one, the client has not re-read the file
  // yet. Its request gets 401, it reads the file again and retries once.
  c.server->SetTokens({"second"});
  dir.Write("token", "second\n");
  absl::StatusOr<Json> got = c.api->Get(kNodes, "", "n");
  EXPECT_TRUE(got.ok()) << got.status();
  std::vector<fake::RecordedRequest> recent = c.server->recent_requests();
  ASSERT_GE(recent.size(), 2u);
  EXPECT_EQ(recent[recent.size() - 2].status, 401);
  EXPECT_EQ(recent.back().user, "token:seco");

  // A fixed wrong token fails with a clear status.
  ClientConfig wrong;
  wrong.server = c.server->url();
  wrong.token = "guess";
  absl::StatusOr<std::unique_ptr<KubeApi>> other = NewKubeApi(wrong);
  ASSERT_TRUE(other.ok());
  absl::Status denied = (*other)->Get(kNodes, "", "n").status();
  EXPECT_TRUE(absl::IsUnauthenticated(denied)) << denied;
}

TEST(KubeApiTest, TokenFileChangeIsPickedUpWithoutA401) {
  TempDir dir;
  std::string token_file = dir.Write("token", "first\n");
  ClientConfig config;
  config.token_file = token_file;
  FakeCluster c({.tokens = {"first", "second"}}, config);
  ASSERT_TRUE(c.api->Create(kNodes, "", MakeNodeObject("n")).ok());
  EXPECT_EQ(c.server->recent_requests().back().user, "token:firs");
  // The kubelet replaces the projected token by a symlink swap: a new inode.
  std::string next = dir.Write("token.new", "second\n");
  ASSERT_EQ(std::rename(next.c_str(), token_file.c_str()), 0);
  // The client notices the change within about a second (it stats the file at most once a second).
  EXPECT_TRUE(WaitUntil([&] {
    EXPECT_TRUE(c.api->Get(kNodes, "", "n").ok());
    return c.server->recent_requests().back().user == "token:seco";
  }));
  for (const fake::RecordedRequest& r : c.server->recent_requests()) EXPECT_NE(r.status, 401);
}

TEST(KubeApiTest, TlsWithCaAndClientCertificates) {
  absl::StatusOr<fake::Pem> ca = fake::MakeCa("test CA");
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<fake::Pem> server_cert = fake::IssueCertificate(*ca, {.common_name = "fake",
                                                                       .organizations = {},
                                                                       .dns_names = {"localhost"},
                                                                       .ips = {"127.0.0.1"},
                                                                       .client = false});
  ASSERT_TRUE(server_cert.ok()) << server_cert.status();
  absl::StatusOr<fake::Pem> alice = fake::IssueCertificate(
      *ca, {.common_name = "alice", .organizations = {"dev"}, .dns_names = {}, .ips = {}, .client = true});
  ASSERT_TRUE(alice.ok()) << alice.status();

  fake::FakeApiServerOptions options;
  options.tls_certificate_pem = server_cert->certificate;
  options.tls_private_key_pem = server_cert->private_key;
  options.client_ca_pem = ca->certificate;
  ClientConfig config;
  config.certificate_authority_pem = ca->certificate;
  config.client_certificate_pem = alice->certificate;
  config.client_key_pem = alice->private_key;
  FakeCluster c(options, config);
  ASSERT_TRUE(c.server->url().starts_with("https://"));
  EXPECT_TRUE(c.api->Create(kNodes, "", MakeNodeObject("n")).ok());
  EXPECT_EQ(c.server->recent_requests().back().user, "alice");

  // No client certificate and no token: 401.
  ClientConfig anonymous;
  anonymous.server = c.server->url();
  anonymous.certificate_authority_pem = ca->certificate;
  absl::Status s = (*NewKubeApi(anonymous))->Get(kNodes, "", "n").status();
  EXPECT_TRUE(absl::IsUnauthenticated(s)) << s;

  // Another CA: the server's certificate is not trusted.
  absl::StatusOr<fake::Pem> other_ca = fake::MakeCa("other CA");
  ASSERT_TRUE(other_ca.ok());
  ClientConfig untrusting = config;
  untrusting.server = c.server->url();
  untrusting.certificate_authority_pem = other_ca->certificate;
  absl::Status tls = (*NewKubeApi(untrusting))->Get(kNodes, "", "n").status();
  EXPECT_TRUE(absl::IsFailedPrecondition(tls)) << tls;
  EXPECT_THAT(std::string(tls.message()), HasSubstr("certificate authority"));
}

TEST(KubeApiTest, CreateEventAboutAPod) {
  FakeCluster c;
  absl::StatusOr<Json> pod = c.api->Create(kPods, "team-a", MakePod("web-0", "team-a"));
  ASSERT_TRUE(pod.ok());
  absl::StatusOr<Json> event = c.api->CreateEvent({.involved_object = ReferenceTo(*pod, kPods),
                                                   .type = "Warning",
                                                   .reason = "FailedScheduling",
                                                   .message = "no node has 2 free GPUs",
                                                   .count = 1,
                                                   .component = "tessera-scheduler",
                                                   .host = "",
                                                   .reporting_instance = "sched-0"});
  ASSERT_TRUE(event.ok()) << event.status();
  std::vector<Json> events = c.server->List("events", "team-a");
  ASSERT_EQ(events.size(), 1u);
  const Json& e = events[0];
  EXPECT_EQ(e["involvedObject"]["name"], "web-0");
  EXPECT_EQ(e["involvedObject"]["uid"], Uid(*pod));
  EXPECT_EQ(e["involvedObject"]["kind"], "Pod");
  EXPECT_EQ(e["reason"], "FailedScheduling");
  EXPECT_EQ(e["type"], "Warning");
  EXPECT_EQ(e["source"]["component"], "tessera-scheduler");
  EXPECT_FALSE(e.value("firstTimestamp", "").empty());
}

TEST(KubeApiTest, VersionAndHealthPaths) {
  FakeCluster c;
  absl::StatusOr<Json> version = c.api->GetPath("/version");
  ASSERT_TRUE(version.ok()) << version.status();
  EXPECT_EQ((*version)["major"], "1");
  absl::StatusOr<Json> ready = c.api->GetPath("readyz");
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(*ready, "ok");
}

}  // namespace
}  // namespace tessera::k8s
