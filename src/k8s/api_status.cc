#include "k8s/api_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "common/quote.h"
#include "core/strings.h"
#include "formats/bounded_json.h"

namespace tessera::k8s {

namespace {

constexpr char kPayloadUrl[] = "type.tessera.dev/k8s.ApiError";

// Every HTTP code the API server answers with a Status, with the reason it gives (metav1.StatusReason in
// k8s.io/apimachinery/pkg/apis/meta/v1/types.go, v0.37.2), how a caller should react (the absl code) and what
// it can do. The first row of a code gives that code's reason when a reply names none; a later row of the
// same code is another reason the server uses with it. 410: kube-apiserver's every 410 is Expired
// (errors.NewResourceExpired in k8s.io/apiserver's storage/cacher and storage/etcd3: a watch or list from a
// compacted resourceVersion, an expired continue token); metav1.StatusReasonGone is the generic 410, which
// client-go's errors.IsGone also accepts; both mean "list again".
struct HttpReason {
  int http_code;
  std::string_view reason;
  absl::StatusCode code;
  std::string_view hint;
};

constexpr std::string_view kCredentialsHint =
    "the server did not accept the credentials: check the token (or token file) and client certificate of "
    "the "
    "client's configuration";
constexpr std::string_view kRbacHint =
    "the identity lacks permission for this verb on this resource: grant it with RBAC (a Role or ClusterRole "
    "and a binding)";
constexpr std::string_view kConflictHint =
    "the object changed since it was read, or a precondition failed: read it again and retry";
constexpr std::string_view kGoneHint =
    "the resourceVersion or continue token is older than the server keeps: list again";
constexpr std::string_view kOverloadHint = "the server is overloaded: retry later";
constexpr std::string_view kServerHint = "the server failed: retry later";

constexpr HttpReason kHttpReasons[] = {
    {400, "BadRequest", absl::StatusCode::kInvalidArgument, ""},
    {401, "Unauthorized", absl::StatusCode::kUnauthenticated, kCredentialsHint},
    {403, "Forbidden", absl::StatusCode::kPermissionDenied, kRbacHint},
    {404, "NotFound", absl::StatusCode::kNotFound, ""},
    {405, "MethodNotAllowed", absl::StatusCode::kUnimplemented, ""},
    {406, "NotAcceptable", absl::StatusCode::kUnimplemented, ""},
    {409, "Conflict", absl::StatusCode::kAborted, kConflictHint},
    {409, "AlreadyExists", absl::StatusCode::kAlreadyExists, ""},
    {410, "Expired", absl::StatusCode::kOutOfRange, kGoneHint},
    {410, "Gone", absl::StatusCode::kOutOfRange, kGoneHint},
    {413, "RequestEntityTooLarge", absl::StatusCode::kInvalidArgument, ""},
    {415, "UnsupportedMediaType", absl::StatusCode::kInvalidArgument, ""},
    {422, "Invalid", absl::StatusCode::kInvalidArgument, ""},
    {429, "TooManyRequests", absl::StatusCode::kUnavailable, kOverloadHint},
    {500, "InternalError", absl::StatusCode::kUnavailable, kServerHint},
    {503, "ServiceUnavailable", absl::StatusCode::kUnavailable, kServerHint},
    {504, "Timeout", absl::StatusCode::kUnavailable, kServerHint},
};

// The row of (code, reason), else the code's first row; null for a code the table lacks.
const HttpReason* Find(int http_code, std::string_view reason) {
  const HttpReason* first = nullptr;
  for (const HttpReason& r : kHttpReasons) {
    if (r.http_code != http_code) continue;
    if (r.reason == reason) return &r;
    if (first == nullptr) first = &r;
  }
  return first;
}

// What a caller can do about an error of this kind.
std::string_view Hint(int http_code, std::string_view reason) {
  if (const HttpReason* r = Find(http_code, reason)) return r->hint;
  return http_code >= 500 ? kServerHint : "";
}

absl::Status Make(int http_code, std::string reason, std::string_view detail, std::string_view what,
                  std::optional<std::chrono::seconds> retry_after) {
  if (reason.empty()) reason = std::string(ReasonForHttp(http_code));
  if (reason.empty()) reason = "Unknown";
  std::string msg = StrCat(what, ": HTTP ", http_code, " ", reason);
  if (!detail.empty()) StrAppend(&msg, ": ", detail);
  std::string_view hint = Hint(http_code, reason);
  if (!hint.empty()) StrAppend(&msg, " (", hint, ")");
  absl::Status s(CodeForHttp(http_code, reason), msg);
  std::string payload = StrCat(http_code, "\n", reason, "\n", retry_after ? retry_after->count() : -1);
  s.SetPayload(kPayloadUrl, absl::Cord(payload));
  return s;
}

}  // namespace

std::string_view ReasonForHttp(int http_code) {
  const HttpReason* r = Find(http_code, "");
  return r != nullptr ? r->reason : "";
}

absl::StatusCode CodeForHttp(int http_code, std::string_view reason) {
  if (http_code >= 200 && http_code < 300) return absl::StatusCode::kOk;
  if (const HttpReason* r = Find(http_code, reason)) return r->code;
  return http_code >= 500 ? absl::StatusCode::kUnavailable : absl::StatusCode::kUnknown;
}

absl::Status StatusFromStatusObject(const nlohmann::json& status, std::string_view what) {
  if (!status.is_object()) {
    return absl::DataLossError(StrCat(what, ": expected a Status object, got ", Quote(status.dump())));
  }
  int code = 500;
  if (auto it = status.find("code"); it != status.end() && it->is_number_integer()) code = it->get<int>();
  std::string reason, message;
  if (auto it = status.find("reason"); it != status.end() && it->is_string()) reason = it->get<std::string>();
  if (auto it = status.find("message"); it != status.end() && it->is_string())
    message = it->get<std::string>();
  std::optional<std::chrono::seconds> retry;
  if (auto d = status.find("details"); d != status.end() && d->is_object()) {
    if (auto r = d->find("retryAfterSeconds"); r != d->end() && r->is_number_integer()) {
      retry = std::chrono::seconds(r->get<int64_t>());
    }
  }
  if (code >= 200 && code < 300) return absl::OkStatus();
  return Make(code, reason, message, what, retry);
}

absl::Status StatusFromHttp(int http_code, std::string_view body, std::string_view what,
                            std::optional<std::chrono::seconds> retry_after) {
  if (http_code >= 200 && http_code < 300) return absl::OkStatus();
  absl::StatusOr<nlohmann::json> parsed = formats::ParseBoundedJson(body, "the reply");
  nlohmann::json j = parsed.ok() ? *std::move(parsed) : nlohmann::json();
  if (j.is_object() && j.value("kind", "") == "Status") {
    if (!j.contains("code")) j["code"] = http_code;
    absl::Status s = StatusFromStatusObject(j, what);
    if (retry_after && s.code() != absl::StatusCode::kOk) {
      // The header wins over details.retryAfterSeconds, as in client-go.
      std::optional<ApiError> e = GetApiError(s);
      return Make(http_code, e ? e->reason : "", j.value("message", ""), what, retry_after);
    }
    return s;
  }
  std::string detail =
      body.empty() ? "empty body" : StrCat("the body is not a Kubernetes Status: '", Quote(body), "'");
  return Make(http_code, "", detail, what, retry_after);
}

std::optional<ApiError> GetApiError(const absl::Status& status) {
  absl::optional<absl::Cord> p = status.GetPayload(kPayloadUrl);
  if (!p) return std::nullopt;
  std::string text(*p);
  std::vector<std::string_view> parts = StrSplit(text, '\n');
  if (parts.size() != 3) return std::nullopt;
  ApiError e;
  int64_t retry = -1;
  if (!ParseInt(parts[0], &e.http_code) || !ParseInt(parts[2], &retry)) return std::nullopt;
  e.reason = std::string(parts[1]);
  if (retry >= 0) e.retry_after = std::chrono::seconds(retry);
  return e;
}

}  // namespace tessera::k8s
