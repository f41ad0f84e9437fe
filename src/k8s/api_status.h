// Kubernetes API errors as absl::Status values.
//
// The API server answers a failed request with an HTTP code and a `Status` object (code, reason, message).
// This file maps them to absl codes chosen by how a caller should react, keeps the HTTP code, the reason and
// any Retry-After as a payload, and writes a message that says what happened and what to do:
//
//   | HTTP                    | absl code            | reaction                                          |
//   |-------------------------|----------------------|---------------------------------------------------|
//   | 400 BadRequest, 422     | kInvalidArgument     | fix the request                                   |
//   | 401 Unauthorized        | kUnauthenticated     | fix the credentials (the client retried once)     |
//   | 403 Forbidden           | kPermissionDenied    | grant RBAC                                        |
//   | 404 NotFound            | kNotFound            |                                                   |
//   | 409 AlreadyExists       | kAlreadyExists       |                                                   |
//   | 409 Conflict            | kAborted             | read again and retry (optimistic concurrency)     |
//   | 410 Expired (or Gone)   | kOutOfRange          | list again (IsGone): the resourceVersion is too old|
//   | 429, 5xx                | kUnavailable         | retry later (the client honours Retry-After)      |
//   | transport, TLS trouble  | kUnavailable / kFailedPrecondition (TLS verification: fix the CA)        |
//
//   absl::StatusOr<nlohmann::json> pod = api.Get(kPods, "default", "x");
//   if (absl::IsNotFound(pod.status())) ...
//   if (std::optional<ApiError> e = GetApiError(status)) log(e->http_code, e->reason);
//
// Thread-safety: pure functions.
#ifndef TESSERA_K8S_API_STATUS_H_
#define TESSERA_K8S_API_STATUS_H_

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace tessera::k8s {

// What the API server said, kept on the absl::Status as a payload.
struct ApiError {
  int http_code = 0;                                // 0 when the request never got an answer
  std::string reason;                               // the Status's reason: NotFound, Conflict, Expired...
  std::optional<std::chrono::seconds> retry_after;  // the Retry-After header or details.retryAfterSeconds
};

// The status of a reply. `what` names the request ("GET /api/v1/pods") for the message; `body` is the reply's
// body (a Status object, or anything else: the message then quotes its start). 2xx gives OK.
absl::Status StatusFromHttp(int http_code, std::string_view body, std::string_view what,
                            std::optional<std::chrono::seconds> retry_after = std::nullopt);

// The status of a Status object (a watch ERROR event carries one).
absl::Status StatusFromStatusObject(const nlohmann::json& status, std::string_view what);

// The reason kube-apiserver gives `http_code` (metav1.StatusReason): "NotFound" for 404, "Conflict" for 409,
// "Expired" for 410 (what it sends for a resourceVersion or continue token older than its history; a Status
// may also say "Gone", metav1's generic 410, which reads the same), "" for a code it has no reason for
// (metav1.StatusReasonUnknown). The client names an error by it when a reply gives none, and the fake API
// server (tools/fake-apiserver) writes it into the Status of an injected failure: one table for both.
std::string_view ReasonForHttp(int http_code);

// The absl code for an HTTP code and a Status reason.
absl::StatusCode CodeForHttp(int http_code, std::string_view reason);

std::optional<ApiError> GetApiError(const absl::Status& status);

// 404 and 409 AlreadyExists: absl::IsNotFound and absl::IsAlreadyExists.
// 409 Conflict: the object changed since it was read (stale resourceVersion) or a precondition failed.
inline bool IsConflict(const absl::Status& s) {
  return s.code() == absl::StatusCode::kAborted;
}
// 410 Expired (or Gone): the resourceVersion (or continue token) is older than the server's history.
inline bool IsGone(const absl::Status& s) {
  return s.code() == absl::StatusCode::kOutOfRange;
}

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_API_STATUS_H_
