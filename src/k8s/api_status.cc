#include "k8s/api_status.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/types/optional.h"
#include "core/strings.h"
#include "formats/bounded_json.h"

namespace tessera::k8s {

namespace {

constexpr char kPayloadUrl[] = "type.tessera.dev/k8s.ApiError";

std::string_view DefaultReason(int code) {
  switch (code) {
    case 400:
      return "BadRequest";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "NotFound";
    case 405:
      return "MethodNotAllowed";
    case 406:
      return "NotAcceptable";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 413:
      return "RequestEntityTooLarge";
    case 415:
      return "UnsupportedMediaType";
    case 422:
      return "Invalid";
    case 429:
      return "TooManyRequests";
    case 500:
      return "InternalError";
    case 503:
      return "ServiceUnavailable";
    case 504:
      return "Timeout";
    default:
      return "Unknown";
  }
}

// What a caller can do about an error of this kind.
std::string_view Hint(int code, std::string_view reason) {
  switch (code) {
    case 401:
      return "the server did not accept the credentials: check the token (or token file) and client "
             "certificate "
             "of the client's configuration";
    case 403:
      return "the identity lacks permission for this verb on this resource: grant it with RBAC (a Role or "
             "ClusterRole and a binding)";
    case 409:
      if (reason == "AlreadyExists") return "";
      return "the object changed since it was read, or a precondition failed: read it again and retry";
    case 410:
      return "the resourceVersion or continue token is older than the server keeps: list again";
    case 429:
      return "the server is overloaded: retry later";
    default:
      if (code >= 500) return "the server failed: retry later";
      return "";
  }
}

absl::Status Make(int http_code, std::string reason, std::string_view detail, std::string_view what,
                  std::optional<std::chrono::seconds> retry_after) {
  if (reason.empty()) reason = std::string(DefaultReason(http_code));
  std::string msg = StrCat(what, ": HTTP ", http_code, " ", reason);
  if (!detail.empty()) StrAppend(&msg, ": ", detail);
  std::string_view hint = Hint(http_code, reason);
  if (!hint.empty()) StrAppend(&msg, " (", hint, ")");
  absl::Status s(CodeForHttp(http_code, reason), msg);
  std::string payload = StrCat(http_code, "\n", reason, "\n", retry_after ? retry_after->count() : -1);
  s.SetPayload(kPayloadUrl, absl::Cord(payload));
  return s;
}

std::string Quote(std::string_view body) {
  constexpr size_t kMax = 200;
  std::string out;
  for (char c : body.substr(0, kMax)) out.push_back(c == '\n' || c == '\r' ? ' ' : c);
  if (body.size() > kMax) out += "...";
  return out;
}

}  // namespace

absl::StatusCode CodeForHttp(int http_code, std::string_view reason) {
  if (http_code >= 200 && http_code < 300) return absl::StatusCode::kOk;
  switch (http_code) {
    case 400:
    case 413:
    case 415:
    case 422:
      return absl::StatusCode::kInvalidArgument;
    case 401:
      return absl::StatusCode::kUnauthenticated;
    case 403:
      return absl::StatusCode::kPermissionDenied;
    case 404:
      return absl::StatusCode::kNotFound;
    case 405:
    case 406:
      return absl::StatusCode::kUnimplemented;
    case 409:
      return reason == "AlreadyExists" ? absl::StatusCode::kAlreadyExists : absl::StatusCode::kAborted;
    case 410:
      return absl::StatusCode::kOutOfRange;
    case 429:
      return absl::StatusCode::kUnavailable;
    default:
      if (http_code >= 500) return absl::StatusCode::kUnavailable;
      return absl::StatusCode::kUnknown;
  }
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
