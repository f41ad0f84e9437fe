// The libcurl implementation of KubeApi.
//
// Connections: a pool of (easy, multi) handle pairs. A pair's multi handle owns its connection cache, so a
// pair taken from the pool brings back its open connection (and TLS session) from its last request; a request
// takes a pair, resets the easy handle's options (connections survive curl_easy_reset) and gives it back.
// Every transfer runs through curl_multi_poll, so a stop_token can wake it at once with curl_multi_wakeup: an
// idle watch stops promptly.
#include <curl/curl.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/log.h"
#include "common/mutex.h"
#include "common/quote.h"
#include "core/strings.h"
#include "formats/bounded_json.h"
#include "k8s/api_status.h"
#include "k8s/kube_api.h"

namespace tessera::k8s {

namespace {

using Clock = std::chrono::steady_clock;

std::once_flag curl_init_once;

// The bearer token: fixed, or read from a file that the kubelet rotates.
class TokenSource {
 public:
  TokenSource(std::string token, std::string file, std::chrono::seconds reload)
      : fixed_(file.empty() ? token : std::string()),
        file_(std::move(file)),
        reload_(reload),
        token_(std::move(token)) {
    if (!file_.empty()) {
      MutexLock lock(&mu_);
      ReloadLocked(Clock::now());
    }
  }

  bool from_file() const { return !file_.empty(); }
  const std::string& file() const { return file_; }

  std::string Current() ABSL_LOCKS_EXCLUDED(mu_) {
    if (file_.empty()) return fixed_;
    MutexLock lock(&mu_);
    auto now = Clock::now();
    if (now - last_read_ >= reload_) {
      ReloadLocked(now);
    } else if (now - last_stat_ >= std::chrono::seconds(1)) {
      last_stat_ = now;
      struct stat st {};
      if (::stat(file_.c_str(), &st) == 0 && Changed(st)) ReloadLocked(now);
    }
    return token_;
  }

  // After a 401 with `rejected`: reads the file again. True when the token is now different.
  bool Refresh(const std::string& rejected) ABSL_LOCKS_EXCLUDED(mu_) {
    if (file_.empty()) return false;
    MutexLock lock(&mu_);
    ReloadLocked(Clock::now());
    return token_ != rejected;
  }

 private:
  bool Changed(const struct stat& st) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return st.st_ino != ino_ || st.st_size != size_ || st.st_mtim.tv_sec != mtime_.tv_sec ||
           st.st_mtim.tv_nsec != mtime_.tv_nsec;
  }

  void ReloadLocked(Clock::time_point now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    last_read_ = now;
    last_stat_ = now;
    std::FILE* f = std::fopen(file_.c_str(), "rb");
    if (f == nullptr) {
      log::Warn("cannot read the token file; keeping the previous token", {{"file", file_}});
      return;
    }
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, n);
    struct stat st {};
    if (::fstat(fileno(f), &st) == 0) {
      ino_ = st.st_ino;
      size_ = st.st_size;
      mtime_ = st.st_mtim;
    }
    std::fclose(f);
    std::string_view t = StripWhitespace(text);
    if (t.empty()) {
      log::Warn("the token file is empty; keeping the previous token", {{"file", file_}});
      return;
    }
    token_ = std::string(t);
  }

  const std::string fixed_;  // the token when there is no file
  const std::string file_;
  const std::chrono::seconds reload_;
  Mutex mu_;  // the token read from the file (the given one until a read succeeds), when and what was read
  std::string token_ ABSL_GUARDED_BY(mu_);
  Clock::time_point last_read_ ABSL_GUARDED_BY(mu_){};
  Clock::time_point last_stat_ ABSL_GUARDED_BY(mu_){};
  ino_t ino_ ABSL_GUARDED_BY(mu_) = 0;
  off_t size_ ABSL_GUARDED_BY(mu_) = 0;
  struct timespec mtime_ ABSL_GUARDED_BY(mu_) {};
};

struct HandlePair {
  CURL* easy = nullptr;
  CURLM* multi = nullptr;
};

void Destroy(HandlePair h) {
  if (h.easy) curl_easy_cleanup(h.easy);
  if (h.multi) curl_multi_cleanup(h.multi);
}

struct Waker {
  CURLM* multi;
  void operator()() const { curl_multi_wakeup(multi); }
};

// One transfer's state, reachable from curl's callbacks.
struct TransferState {
  CURL* easy = nullptr;
  long code = 0;
  std::string body;
  std::string content_type;
  std::optional<std::chrono::seconds> retry_after;
  // Set for a watch: gets the body of a 200 reply as it arrives; false aborts the transfer.
  const std::function<bool(std::string_view)>* stream = nullptr;
  bool aborted_by_stream = false;
};

size_t OnWrite(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<TransferState*>(user);
  size_t len = size * count;
  if (t->stream != nullptr) {
    if (t->code == 0) curl_easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &t->code);
    if (t->code == 200) {
      if (!(*t->stream)(std::string_view(data, len))) {
        t->aborted_by_stream = true;
        return CURL_WRITEFUNC_ERROR;
      }
      return len;
    }
  }
  t->body.append(data, len);
  return len;
}

size_t OnHeader(char* data, size_t size, size_t count, void* user) {
  auto* t = static_cast<TransferState*>(user);
  size_t len = size * count;
  std::string_view line(data, len);
  if (line.starts_with("HTTP/")) {  // a new reply (after a 100 Continue or a redirect): forget the last one
    t->retry_after.reset();
    t->content_type.clear();
    return len;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return len;
  std::string name = AsciiLower(line.substr(0, colon));
  std::string_view value = StripWhitespace(line.substr(colon + 1));
  if (name == "retry-after") {
    int64_t secs = 0;
    if (ParseInt(value, &secs) && secs >= 0) t->retry_after = std::chrono::seconds(secs);
  } else if (name == "content-type") {
    t->content_type = std::string(value);
  }
  return len;
}

// Splits a watch stream into lines and turns each into a WatchEvent.
class WatchDecoder {
 public:
  WatchDecoder(const WatchHandler& handler, std::string what) : handler_(handler), what_(std::move(what)) {}

  bool Feed(std::string_view data) {
    buffer_.append(data);
    size_t start = 0;
    while (true) {
      size_t nl = buffer_.find('\n', start);
      if (nl == std::string::npos) break;
      std::string_view line(buffer_.data() + start, nl - start);
      start = nl + 1;
      if (!StripWhitespace(line).empty() && !Line(line)) return false;
    }
    buffer_.erase(0, start);
    return true;
  }

  // The stream ended cleanly: anything left over is half an event.
  absl::Status Finish() {
    if (!status_.ok()) return status_;
    if (!StripWhitespace(buffer_).empty()) {
      return absl::DataLossError(StrCat(what_, ": the watch stream ended in the middle of an event after ",
                                        events_, " events ('", Quote(buffer_),
                                        "'); watch again from the last resourceVersion"));
    }
    return absl::OkStatus();
  }

  const absl::Status& status() const { return status_; }
  int64_t events() const { return events_; }

 private:
  bool Line(std::string_view line) {
    absl::StatusOr<Json> parsed = formats::ParseBoundedJson(line, "a watch event");
    Json j = parsed.ok() ? *std::move(parsed) : Json();
    if (!j.is_object()) {
      status_ =
          absl::DataLossError(StrCat(what_, ": the server sent a line that is not a JSON watch event ('",
                                     Quote(line), "'); watch again from the last resourceVersion"));
      return false;
    }
    auto type = j.find("type");
    auto object = j.find("object");
    if (type == j.end() || !type->is_string() || object == j.end()) {
      status_ = absl::DataLossError(StrCat(what_, ": a watch event without type or object ('", Quote(line),
                                           "'); watch again from the last resourceVersion"));
      return false;
    }
    const std::string& t = type->get_ref<const std::string&>();
    WatchEvent e;
    if (t == "ADDED") {
      e.type = WatchEvent::Type::kAdded;
    } else if (t == "MODIFIED") {
      e.type = WatchEvent::Type::kModified;
    } else if (t == "DELETED") {
      e.type = WatchEvent::Type::kDeleted;
    } else if (t == "BOOKMARK") {
      e.type = WatchEvent::Type::kBookmark;
    } else if (t == "ERROR") {
      status_ = StatusFromStatusObject(*object, what_);
      if (status_.ok())
        status_ = absl::UnknownError(StrCat(what_, ": an ERROR watch event with a success Status"));
      return false;
    } else {
      status_ = absl::DataLossError(StrCat(what_, ": unknown watch event type '", t, "'"));
      return false;
    }
    if (!object->is_object()) {
      status_ =
          absl::DataLossError(StrCat(what_, ": a ", t, " watch event whose object is not a JSON object"));
      return false;
    }
    e.object = std::move(*object);
    ++events_;
    try {
      handler_(std::move(e));
    } catch (const std::exception& ex) {
      status_ = absl::InternalError(StrCat(what_, ": the watch handler threw: ", ex.what()));
      return false;
    }
    return true;
  }

  const WatchHandler& handler_;
  const std::string what_;
  std::string buffer_;
  absl::Status status_;
  int64_t events_ = 0;
};

class CurlKubeApi final : public KubeApi {
 public:
  explicit CurlKubeApi(ClientConfig config)
      : config_(std::move(config)),
        tokens_(config_.token, config_.token_file, config_.token_reload_interval) {}

  ~CurlKubeApi() override {
    for (HandlePair& h : idle_) Destroy(h);
  }

  absl::Status Init() {
    std::call_once(curl_init_once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    if (config_.server.empty()) {
      return absl::InvalidArgumentError(
          StrCat(config_.source, ": no API server URL; set the cluster's server (https://HOST:PORT)"));
    }
    if (!config_.server.starts_with("http://") && !config_.server.starts_with("https://")) {
      return absl::InvalidArgumentError(
          StrCat(config_.source, ": the server '", config_.server, "' is not an http:// or https:// URL"));
    }
    while (config_.server.ends_with("/")) config_.server.pop_back();
    return absl::OkStatus();
  }

  const ClientConfig& config() const override { return config_; }

  absl::StatusOr<Json> Get(const ResourceType& type, std::string_view ns, std::string_view name) override {
    absl::StatusOr<std::string> path = ObjectPath(type, ns, name, "");
    if (!path.ok()) return path.status();
    return JsonCall("GET", *path, nullptr, "", {});
  }

  absl::StatusOr<ObjectList> List(const ResourceType& type, std::string_view ns,
                                  const ListOptions& o) override {
    std::string path = CollectionPath(type, ns);
    std::vector<std::string> q;
    if (!o.label_selector.empty()) q.push_back("labelSelector=" + UrlEncode(o.label_selector));
    if (!o.field_selector.empty()) q.push_back("fieldSelector=" + UrlEncode(o.field_selector));
    if (o.limit > 0) q.push_back(StrCat("limit=", o.limit));
    if (!o.continue_token.empty()) q.push_back("continue=" + UrlEncode(o.continue_token));
    if (!o.resource_version.empty()) q.push_back("resourceVersion=" + UrlEncode(o.resource_version));
    if (!q.empty()) path += "?" + StrJoin(q, "&");
    absl::StatusOr<Json> reply = JsonCall("GET", path, nullptr, "", o.stop);
    if (!reply.ok()) return reply.status();
    std::string what = StrCat("GET ", path);
    if (!reply->is_object() || !reply->contains("items")) {
      return absl::DataLossError(StrCat(what, ": the reply is not a list (no items); is ", config_.server,
                                        " a Kubernetes API server?"));
    }
    ObjectList list;
    Json& items = (*reply)["items"];
    if (items.is_array()) {
      list.items.reserve(items.size());
      for (Json& item : items) list.items.push_back(std::move(item));
    } else if (!items.is_null()) {
      return absl::DataLossError(StrCat(what, ": items is not an array"));
    }
    if (auto m = reply->find("metadata"); m != reply->end() && m->is_object()) {
      list.resource_version = m->value("resourceVersion", "");
      list.continue_token = m->value("continue", "");
      if (auto r = m->find("remainingItemCount"); r != m->end() && r->is_number_integer()) {
        list.remaining_item_count = r->get<int64_t>();
      }
    }
    return list;
  }

  absl::StatusOr<Json> Create(const ResourceType& type, std::string_view ns, const Json& object) override {
    std::string body = formats::DumpJson(object);
    return JsonCall("POST", CollectionPath(type, NamespaceFor(type, ns, object)), &body, "application/json",
                    {});
  }

  absl::StatusOr<Json> Update(const ResourceType& type, std::string_view ns, const Json& object,
                              std::string_view subresource) override {
    absl::StatusOr<std::string> path =
        ObjectPath(type, NamespaceFor(type, ns, object), Name(object), subresource);
    if (!path.ok()) return path.status();
    std::string body = formats::DumpJson(object);
    return JsonCall("PUT", *path, &body, "application/json", {});
  }

  absl::StatusOr<Json> Patch(const ResourceType& type, std::string_view ns, std::string_view name,
                             PatchType patch_type, const Json& patch, std::string_view subresource) override {
    absl::StatusOr<std::string> path = ObjectPath(type, ns, name, subresource);
    if (!path.ok()) return path.status();
    std::string body = formats::DumpJson(patch);
    return JsonCall("PATCH", *path, &body, std::string(ContentType(patch_type)), {});
  }

  absl::Status Delete(const ResourceType& type, std::string_view ns, std::string_view name,
                      const DeleteOptions& o) override {
    absl::StatusOr<std::string> path = ObjectPath(type, ns, name, "");
    if (!path.ok()) return path.status();
    Json opts = {{"kind", "DeleteOptions"}, {"apiVersion", "v1"}};
    if (!o.precondition_uid.empty()) opts["preconditions"]["uid"] = o.precondition_uid;
    if (!o.precondition_resource_version.empty()) {
      opts["preconditions"]["resourceVersion"] = o.precondition_resource_version;
    }
    if (o.grace_period_seconds) opts["gracePeriodSeconds"] = *o.grace_period_seconds;
    if (!o.propagation_policy.empty()) opts["propagationPolicy"] = o.propagation_policy;
    std::string body = formats::DumpJson(opts);
    return JsonCall("DELETE", *path, &body, "application/json", {}).status();
  }

  absl::StatusOr<Json> CreateSubresource(const ResourceType& type, std::string_view ns, std::string_view name,
                                         std::string_view subresource, const Json& body) override {
    absl::StatusOr<std::string> path = ObjectPath(type, ns, name, subresource);
    if (!path.ok()) return path.status();
    std::string text = formats::DumpJson(body);
    return JsonCall("POST", *path, &text, "application/json", {});
  }

  absl::StatusOr<Json> GetPath(std::string_view path) override {
    std::string p(path);
    if (!p.starts_with("/")) p = "/" + p;
    Request req{"GET", p, nullptr, "", config_.request_timeout, {}, nullptr};
    absl::StatusOr<Reply> reply = Call(req);
    if (!reply.ok()) return reply.status();
    absl::Status s =
        StatusFromHttp(static_cast<int>(reply->code), reply->body, StrCat("GET ", p), reply->retry_after);
    if (!s.ok()) return s;
    absl::StatusOr<Json> j = formats::ParseBoundedJson(reply->body, "the reply");
    if (!j.ok()) return Json(reply->body);
    return j;
  }

  absl::Status Watch(const ResourceType& type, std::string_view ns, const WatchOptions& o,
                     const WatchHandler& handler) override {
    std::string path = CollectionPath(type, ns);
    std::vector<std::string> q = {"watch=1"};
    if (!o.resource_version.empty()) q.push_back("resourceVersion=" + UrlEncode(o.resource_version));
    if (o.allow_bookmarks) q.push_back("allowWatchBookmarks=true");
    if (!o.label_selector.empty()) q.push_back("labelSelector=" + UrlEncode(o.label_selector));
    if (!o.field_selector.empty()) q.push_back("fieldSelector=" + UrlEncode(o.field_selector));
    if (o.timeout_seconds > 0) q.push_back(StrCat("timeoutSeconds=", o.timeout_seconds));
    path += "?" + StrJoin(q, "&");
    std::string what = StrCat("watch ", type.GroupResource(), " (GET ", path, ")");
    WatchDecoder decoder(handler, what);
    std::function<bool(std::string_view)> stream = [&decoder](std::string_view d) { return decoder.Feed(d); };
    // No overall timeout unless the server was asked to end the stream: then allow it a margin.
    std::chrono::milliseconds timeout{0};
    if (o.timeout_seconds > 0) timeout = std::chrono::seconds(o.timeout_seconds + 30);
    Request req{"GET", path, nullptr, "", timeout, o.stop, &stream};
    req.watch = true;
    absl::StatusOr<Reply> reply = Call(req);
    if (!reply.ok()) {
      if (!decoder.status().ok()) return decoder.status();
      if (reply.status().code() == absl::StatusCode::kCancelled) return reply.status();
      return absl::UnavailableError(StrCat(what, ": the stream broke after ", decoder.events(),
                                           " events: ", reply.status().message(),
                                           "; watch again from the last resourceVersion"));
    }
    if (reply->code != 200) {
      return StatusFromHttp(static_cast<int>(reply->code), reply->body, what, reply->retry_after);
    }
    return decoder.Finish();
  }

 private:
  struct Request {
    std::string method;
    std::string path;  // with the query
    const std::string* body = nullptr;
    std::string content_type;
    std::chrono::milliseconds timeout{0};
    std::stop_token stop;
    const std::function<bool(std::string_view)>* stream = nullptr;
    bool watch = false;
  };
  struct Reply {
    long code = 0;
    std::string body;
    std::string content_type;
    std::optional<std::chrono::seconds> retry_after;
  };

  std::string_view NamespaceFor(const ResourceType& type, std::string_view ns, const Json& object) const {
    if (!type.namespaced) return "";
    if (!ns.empty()) return ns;
    if (auto m = object.find("metadata"); object.is_object() && m != object.end() && m->is_object()) {
      if (auto n = m->find("namespace");
          n != m->end() && n->is_string() && !n->get_ref<const std::string&>().empty()) {
        return n->get_ref<const std::string&>();
      }
    }
    return config_.default_namespace;
  }

  std::string CollectionPath(const ResourceType& type, std::string_view ns) const {
    std::string p = type.ApiPrefix();
    if (type.namespaced && !ns.empty()) StrAppend(&p, "/namespaces/", UrlEncode(ns));
    StrAppend(&p, "/", type.resource);
    return p;
  }

  absl::StatusOr<std::string> ObjectPath(const ResourceType& type, std::string_view ns, std::string_view name,
                                         std::string_view subresource) const {
    if (name.empty()) {
      return absl::InvalidArgumentError(StrCat(type.GroupResource(), ": no object name given"));
    }
    if (type.namespaced && ns.empty()) {
      return absl::InvalidArgumentError(
          StrCat(type.GroupResource(), " are namespaced: give the namespace of \"", name, "\""));
    }
    std::string p = CollectionPath(type, ns);
    StrAppend(&p, "/", UrlEncode(name));
    if (!subresource.empty()) StrAppend(&p, "/", subresource);
    return p;
  }

  absl::StatusOr<Json> JsonCall(const char* method, const std::string& path, const std::string* body,
                                const std::string& content_type, std::stop_token stop) {
    Request req{method, path, body, content_type, config_.request_timeout, std::move(stop), nullptr};
    absl::StatusOr<Reply> reply = Call(req);
    std::string what = StrCat(method, " ", path);
    if (!reply.ok()) return reply.status();
    absl::Status s = StatusFromHttp(static_cast<int>(reply->code), reply->body, what, reply->retry_after);
    if (!s.ok()) return s;
    absl::StatusOr<Json> parsed = formats::ParseBoundedJson(reply->body, "the reply");
    if (!parsed.ok()) {
      return absl::DataLossError(StrCat(what, ": the reply (HTTP ", reply->code, ", ",
                                        reply->content_type.empty() ? "no content type" : reply->content_type,
                                        ") is not JSON: '", Quote(reply->body), "'; is ", config_.server,
                                        " a Kubernetes API server? (", Message(parsed.status()), ")"));
    }
    return *std::move(parsed);
  }

  // One request with the client's retry rules: once more with a fresh token after a 401 when the token comes
  // from a file, and after a 429/5xx with Retry-After, up to max_retries times.
  absl::StatusOr<Reply> Call(const Request& req) {
    std::string token = tokens_.Current();
    bool refreshed = false;
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<Reply> reply = Perform(req, token);
      if (!reply.ok()) return reply;
      if (reply->code == 401 && !refreshed && tokens_.from_file()) {
        refreshed = true;
        if (tokens_.Refresh(token)) {
          log::Info("the API server rejected the token; retrying with the token file's new content",
                    {{"file", tokens_.file()}});
          token = tokens_.Current();
          continue;
        }
      }
      bool retryable = reply->code == 429 || (reply->code >= 500 && reply->code <= 599);
      if (retryable && reply->retry_after && attempt < config_.max_retries && !req.watch) {
        auto wait = std::min<std::chrono::milliseconds>(*reply->retry_after, config_.max_retry_wait);
        log::Info("the API server asked to retry later",
                  {{"path", req.path}, {"code", StrCat(reply->code)}, {"wait_ms", StrCat(wait.count())}});
        if (!SleepFor(wait, req.stop))
          return absl::CancelledError(StrCat(req.method, " ", req.path, ": stopped"));
        continue;
      }
      return reply;
    }
  }

  HandlePair Acquire(bool fresh) {
    if (!fresh) {
      MutexLock lock(&pool_mu_);
      if (!idle_.empty()) {
        HandlePair h = idle_.back();
        idle_.pop_back();
        return h;
      }
    }
    return HandlePair{curl_easy_init(), curl_multi_init()};
  }

  void Release(HandlePair h, bool fresh) {
    if (!fresh) {
      MutexLock lock(&pool_mu_);
      if (idle_.size() < config_.max_idle_connections) {
        idle_.push_back(h);
        return;
      }
    }
    Destroy(h);
  }

  void SetTls(CURL* e) {
    if (!config_.server.starts_with("https://")) return;
    if (config_.insecure_skip_tls_verify) {
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(e, CURLOPT_SSL_VERIFYHOST, 0L);
    } else if (!config_.certificate_authority_pem.empty()) {
      curl_blob blob{config_.certificate_authority_pem.data(), config_.certificate_authority_pem.size(),
                     CURL_BLOB_NOCOPY};
      curl_easy_setopt(e, CURLOPT_CAINFO_BLOB, &blob);
    } else if (!config_.certificate_authority_file.empty()) {
      curl_easy_setopt(e, CURLOPT_CAINFO, config_.certificate_authority_file.c_str());
    }
    if (!config_.client_certificate_pem.empty()) {
      curl_blob blob{config_.client_certificate_pem.data(), config_.client_certificate_pem.size(),
                     CURL_BLOB_NOCOPY};
      curl_easy_setopt(e, CURLOPT_SSLCERT_BLOB, &blob);
      curl_easy_setopt(e, CURLOPT_SSLCERTTYPE, "PEM");
    } else if (!config_.client_certificate_file.empty()) {
      curl_easy_setopt(e, CURLOPT_SSLCERT, config_.client_certificate_file.c_str());
    }
    if (!config_.client_key_pem.empty()) {
      curl_blob blob{config_.client_key_pem.data(), config_.client_key_pem.size(), CURL_BLOB_NOCOPY};
      curl_easy_setopt(e, CURLOPT_SSLKEY_BLOB, &blob);
      curl_easy_setopt(e, CURLOPT_SSLKEYTYPE, "PEM");
    } else if (!config_.client_key_file.empty()) {
      curl_easy_setopt(e, CURLOPT_SSLKEY, config_.client_key_file.c_str());
    }
  }

  absl::Status TransportError(const Request& req, CURLcode code, const char* detail) const {
    std::string what = StrCat(req.method, " ", config_.server, req.path);
    std::string text = detail[0] != '\0' ? std::string(detail) : std::string(curl_easy_strerror(code));
    switch (code) {
      case CURLE_PEER_FAILED_VERIFICATION:
      case CURLE_SSL_CACERT_BADFILE:
      case CURLE_SSL_CERTPROBLEM:
      case CURLE_SSL_ISSUER_ERROR:
      case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
        return absl::FailedPreconditionError(
            StrCat(what, ": TLS failed: ", text, "; check the certificate authority (",
                   !config_.certificate_authority_pem.empty()    ? "certificate-authority-data"
                   : !config_.certificate_authority_file.empty() ? config_.certificate_authority_file
                                                                 : "the system's trust store",
                   ") and client certificate of ", config_.source));
      case CURLE_UNSUPPORTED_PROTOCOL:
      case CURLE_URL_MALFORMAT:
        return absl::InvalidArgumentError(
            StrCat(what, ": ", text, "; fix the server URL in ", config_.source));
      case CURLE_OPERATION_TIMEDOUT:
        return absl::DeadlineExceededError(StrCat(what, ": ", text));
      default:
        return absl::UnavailableError(
            StrCat(what, ": ", text, " (is the API server at ", config_.server, " up?)"));
    }
  }

  absl::StatusOr<Reply> Perform(const Request& req, const std::string& token) {
    const bool fresh = config_.connection_reuse == ConnectionReuse::kNone || req.watch;
    HandlePair h = Acquire(fresh);
    if (h.easy == nullptr || h.multi == nullptr) {
      Destroy(h);
      return absl::ResourceExhaustedError("libcurl could not create a handle (out of memory?)");
    }
    CURL* e = h.easy;
    curl_easy_reset(e);
    TransferState st;
    st.easy = e;
    st.stream = req.stream;
    char errbuf[CURL_ERROR_SIZE];
    errbuf[0] = '\0';
    std::string url = config_.server + req.path;
    curl_easy_setopt(e, CURLOPT_URL, url.c_str());
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, &OnWrite);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &st);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &st);
    curl_easy_setopt(e, CURLOPT_USERAGENT, config_.user_agent.c_str());
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(config_.connect_timeout.count()));
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(req.timeout.count()));
    curl_easy_setopt(e, CURLOPT_PROXY, config_.proxy_url.c_str());
    if (req.watch) {
      curl_easy_setopt(e, CURLOPT_TCP_KEEPALIVE, 1L);
      curl_easy_setopt(e, CURLOPT_TCP_KEEPIDLE, 30L);
      curl_easy_setopt(e, CURLOPT_TCP_KEEPINTVL, 10L);
    }
    SetTls(e);
    if (req.method == "GET") {
      curl_easy_setopt(e, CURLOPT_HTTPGET, 1L);
    } else {
      curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    }
    if (req.body != nullptr) {
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, req.body->data());
      curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body->size()));
    }
    curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "Accept: application/json");
    headers = curl_slist_append(headers, "Expect:");
    if (!req.content_type.empty())
      headers = curl_slist_append(headers, ("Content-Type: " + req.content_type).c_str());
    if (!token.empty()) headers = curl_slist_append(headers, ("Authorization: Bearer " + token).c_str());
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);

    CURLcode result = CURLE_OK;
    bool cancelled = false;
    bool reusable = true;
    if (fresh && !req.stop.stop_possible()) {
      result = curl_easy_perform(e);
    } else {
      result = RunMulti(h, req.stop, &cancelled);
    }
    curl_slist_free_all(headers);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, nullptr);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, nullptr);
    if (st.code == 0) curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &st.code);
    if (cancelled || result != CURLE_OK) reusable = false;
    if (reusable) {
      Release(h, fresh);
    } else {
      Destroy(h);  // a broken or abandoned connection is never reused
    }
    if (cancelled) return absl::CancelledError(StrCat(req.method, " ", req.path, ": stopped"));
    if (result != CURLE_OK) {
      if (st.aborted_by_stream) return absl::AbortedError("stopped by the watch decoder");
      return TransportError(req, result, errbuf);
    }
    Reply reply;
    reply.code = st.code;
    reply.body = std::move(st.body);
    reply.content_type = std::move(st.content_type);
    reply.retry_after = st.retry_after;
    return reply;
  }

  static CURLcode RunMulti(HandlePair h, const std::stop_token& stop, bool* cancelled) {
    if (curl_multi_add_handle(h.multi, h.easy) != CURLM_OK) return CURLE_FAILED_INIT;
    CURLcode result = CURLE_OK;
    {
      std::optional<std::stop_callback<Waker>> waker;
      if (stop.stop_possible()) waker.emplace(stop, Waker{h.multi});
      bool done = false;
      while (!done) {
        int running = 0;
        CURLMcode mc = curl_multi_perform(h.multi, &running);
        if (mc != CURLM_OK) {
          result = CURLE_FAILED_INIT;
          break;
        }
        int left = 0;
        while (CURLMsg* msg = curl_multi_info_read(h.multi, &left)) {
          if (msg->msg == CURLMSG_DONE) {
            result = msg->data.result;
            done = true;
          }
        }
        if (done) break;
        if (stop.stop_requested()) {
          *cancelled = true;
          break;
        }
        curl_multi_poll(h.multi, nullptr, 0, 1000, nullptr);
      }
    }
    curl_multi_remove_handle(h.multi, h.easy);
    return result;
  }

  ClientConfig config_;
  TokenSource tokens_;
  Mutex pool_mu_;  // the idle connections
  std::vector<HandlePair> idle_ ABSL_GUARDED_BY(pool_mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<KubeApi>> NewKubeApi(const ClientConfig& config) {
  auto api = std::make_unique<CurlKubeApi>(config);
  if (absl::Status s = api->Init(); !s.ok()) return s;
  return std::unique_ptr<KubeApi>(std::move(api));
}

}  // namespace tessera::k8s
