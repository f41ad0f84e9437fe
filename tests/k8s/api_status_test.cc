// The one table of HTTP codes and Kubernetes reasons (src/k8s/api_status.h) that the client and the fake API
// server share.
//
// Expected reasons are kube-apiserver's: the metav1.StatusReason constants of k8s.io/apimachinery v0.37.2,
// pkg/apis/meta/v1/types.go (each constant's comment names its code), and for 410 the reason kube-apiserver
// v1.37.2 actually sends: every 410 it writes comes from errors.NewResourceExpired, reason "Expired"
// (k8s.io/apiserver v0.37.2 pkg/storage/cacher/watch_cache_history.go and store/watch_cache_storage.go for a
// watch or list older than the watch cache, pkg/storage/etcd3/errors.go for a compacted revision and an
// expired continue token). metav1.StatusReasonGone ("Gone") is the generic 410 that client-go's
// errors.IsGone also accepts (k8s.io/apimachinery v0.37.2 pkg/api/errors/errors.go): both must read as
// "list again".
#include "k8s/api_status.h"

#include <curl/curl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "k8s/k8s_test_util.h"

namespace tessera::k8s {
namespace {

using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakePod;

// The body of a plain GET, as the server wrote it (the client would fill in a missing reason).
std::string RawBody(const std::string& url) {
  std::string body;
  CURL* e = curl_easy_init();
  curl_easy_setopt(e, CURLOPT_URL, url.c_str());
  curl_easy_setopt(
      e, CURLOPT_WRITEFUNCTION, +[](char* p, size_t size, size_t n, void* out) {
        static_cast<std::string*>(out)->append(p, size * n);
        return size * n;
      });
  curl_easy_setopt(e, CURLOPT_WRITEDATA, &body);
  curl_easy_perform(e);
  curl_easy_cleanup(e);
  return body;
}

TEST(ApiStatusTest, EachCodeHasTheApiServersReason) {
  const std::pair<int, std::string_view> reasons[] = {{400, "BadRequest"},
                                                      {401, "Unauthorized"},
                                                      {403, "Forbidden"},
                                                      {404, "NotFound"},
                                                      {405, "MethodNotAllowed"},
                                                      {406, "NotAcceptable"},
                                                      {409, "Conflict"},
                                                      {410, "Expired"},
                                                      {413, "RequestEntityTooLarge"},
                                                      {415, "UnsupportedMediaType"},
                                                      {422, "Invalid"},
                                                      {429, "TooManyRequests"},
                                                      {500, "InternalError"},
                                                      {503, "ServiceUnavailable"},
                                                      {504, "Timeout"}};
  for (const auto& [code, reason] : reasons) EXPECT_EQ(ReasonForHttp(code), reason) << code;
  // No reason for a code the API server does not give one (metav1.StatusReasonUnknown is "").
  EXPECT_EQ(ReasonForHttp(418), "");
  EXPECT_EQ(ReasonForHttp(200), "");
}

TEST(ApiStatusTest, GoneAndExpiredBothMeanListAgain) {
  for (std::string_view reason : {"Expired", "Gone"}) {
    absl::Status s = StatusFromStatusObject({{"kind", "Status"},
                                             {"code", 410},
                                             {"reason", std::string(reason)},
                                             {"message", "too old resource version: 5 (9)"}},
                                            "WATCH /api/v1/pods");
    EXPECT_TRUE(IsGone(s)) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("list again"));
    ASSERT_TRUE(GetApiError(s).has_value());
    EXPECT_EQ(GetApiError(s)->reason, reason);
  }
}

TEST(ApiStatusTest, AReplyThatNamesNoReasonTakesTheTables) {
  absl::Status gone = StatusFromHttp(410, "", "GET /api/v1/pods");
  EXPECT_TRUE(IsGone(gone)) << gone;
  EXPECT_EQ(GetApiError(gone)->reason, "Expired");
  EXPECT_THAT(std::string(gone.message()), HasSubstr("HTTP 410 Expired"));

  // 409 is AlreadyExists or Conflict by the reason given, Conflict when none is.
  EXPECT_TRUE(
      absl::IsAlreadyExists(StatusFromStatusObject({{"code", 409}, {"reason", "AlreadyExists"}}, "POST")));
  EXPECT_TRUE(IsConflict(StatusFromStatusObject({{"code", 409}, {"reason", "Conflict"}}, "PUT")));
  EXPECT_TRUE(IsConflict(StatusFromHttp(409, "", "PUT")));

  absl::Status teapot = StatusFromHttp(418, "<html>teapot</html>", "GET /");
  EXPECT_EQ(teapot.code(), absl::StatusCode::kUnknown) << teapot;
  EXPECT_EQ(GetApiError(teapot)->reason, "Unknown");
  EXPECT_TRUE(absl::IsUnavailable(StatusFromHttp(502, "bad gateway", "GET /")));
}

TEST(ApiStatusTest, TheFakeApiServerWritesTheSameReasons) {
  FakeCluster c;
  ASSERT_TRUE(c.server->Create("pods", "default", MakePod("a")).ok());
  for (int code : {403, 406, 410, 413, 422}) {
    SCOPED_TRACE(code);
    c.server->FailRequests({.verb = "get", .status = code, .count = 1});
    const Json written =
        Json::parse(RawBody(c.server->url() + "/api/v1/namespaces/default/pods/a"), nullptr, false);
    ASSERT_TRUE(written.is_object()) << code;
    EXPECT_EQ(written.value("reason", ""), ReasonForHttp(code));
    c.server->FailRequests({.verb = "get", .status = code, .count = 1});
    absl::Status s = c.api->Get(kPods, "default", "a").status();
    ASSERT_TRUE(GetApiError(s).has_value()) << s;
    EXPECT_EQ(GetApiError(s)->http_code, code);
    EXPECT_EQ(GetApiError(s)->reason, ReasonForHttp(code));
    EXPECT_EQ(s.code(), CodeForHttp(code, ReasonForHttp(code)));
  }
}

}  // namespace
}  // namespace tessera::k8s
