#include "fake_apiserver.h"

#include <httplib.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <cctype>
#include <condition_variable>
#include <list>

#include "absl/strings/escaping.h"
#include "core/strings.h"
#include "k8s/api_status.h"

namespace tessera::fake {

namespace {

// The content type of a watch stream, as the real API server names a framed JSON stream. It also keeps
// cpp-httplib from gzip-compressing the stream for clients that accept gzip (Go clients do by default): the
// compressor holds events back until its buffer fills, so a watching client would see none of them.
constexpr char kWatchContentType[] = "application/json;stream=watch";

// httplib runs each connection on a task-queue thread for the connection's whole life (a watch holds one for
// hours), so a fixed pool would stall with more open watches than threads. This queue starts a thread
// whenever no idle one is waiting, up to a cap.
class GrowingThreadPool final : public httplib::TaskQueue {
 public:
  GrowingThreadPool(size_t max_threads, std::atomic<int64_t>* connections)
      : max_threads_(max_threads), connections_(connections) {}

  void enqueue(std::function<void()> fn) override {
    ++*connections_;
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(fn));
    if (idle_ < jobs_.size() && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
    cv_.notify_one();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      shutdown_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      ++idle_;
      cv_.wait(lock, [this] { return shutdown_ || !jobs_.empty(); });
      --idle_;
      if (jobs_.empty()) return;  // shutting down
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
    }
  }

  const size_t max_threads_;
  std::atomic<int64_t>* connections_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::list<std::function<void()>> jobs_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

std::string StatusBody(int code, std::string_view reason, std::string_view message,
                       const Json& details = nullptr) {
  Json s = {{"kind", "Status"},
            {"apiVersion", "v1"},
            {"metadata", Json::object()},
            {"status", code < 300 ? "Success" : "Failure"},
            {"message", message},
            {"reason", reason},
            {"code", code}};
  if (!details.is_null()) s["details"] = details;
  if (code < 300) {
    s.erase("message");
    s.erase("reason");
  }
  return s.dump();
}

// The parts of a resource URL.
struct Route {
  Resource* resource = nullptr;
  std::string ns;
  std::string name;
  std::string subresource;
};

std::string ClientCertificateUser(const httplib::Request& req) {
  if (req.ssl == nullptr) return "";
  SSL* ssl = const_cast<SSL*>(req.ssl);
  if (SSL_get_verify_result(ssl) != X509_V_OK) return "";
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr) return "";
  char cn[256];
  if (X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn)) <= 0) return "";
  return cn;
}

}  // namespace

FakeApiServer::FakeApiServer(FakeApiServerOptions options)
    : options_(std::move(options)), store_(options_.store), tokens_(options_.tokens) {}

absl::StatusOr<std::unique_ptr<FakeApiServer>> FakeApiServer::Start(FakeApiServerOptions options) {
  std::unique_ptr<FakeApiServer> s(new FakeApiServer(std::move(options)));
  if (absl::Status st = s->Listen(); !st.ok()) return st;
  return s;
}

FakeApiServer::~FakeApiServer() {
  Stop();
}

absl::Status FakeApiServer::Listen() {
  tls_ = !options_.tls_certificate_pem.empty();
  if (tls_) {
    if (options_.tls_private_key_pem.empty()) {
      return absl::InvalidArgumentError("fake API server: a TLS certificate needs its private key");
    }
    std::string cert_pem = options_.tls_certificate_pem;
    std::string key_pem = options_.tls_private_key_pem;
    std::string ca_pem = options_.client_ca_pem;
    bool ok = true;
    auto server = std::make_unique<httplib::SSLServer>([&](SSL_CTX& ctx) {
      BIO* cb = BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size()));
      X509* cert = PEM_read_bio_X509(cb, nullptr, nullptr, nullptr);
      BIO_free(cb);
      BIO* kb = BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size()));
      EVP_PKEY* key = PEM_read_bio_PrivateKey(kb, nullptr, nullptr, nullptr);
      BIO_free(kb);
      ok = cert != nullptr && key != nullptr && SSL_CTX_use_certificate(&ctx, cert) == 1 &&
           SSL_CTX_use_PrivateKey(&ctx, key) == 1;
      X509_free(cert);
      EVP_PKEY_free(key);
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      if (ok && !ca_pem.empty()) {
        X509_STORE* store = X509_STORE_new();
        BIO* ab = BIO_new_mem_buf(ca_pem.data(), static_cast<int>(ca_pem.size()));
        while (X509* ca = PEM_read_bio_X509(ab, nullptr, nullptr, nullptr)) {
          X509_STORE_add_cert(store, ca);
          X509_free(ca);
        }
        ERR_clear_error();
        BIO_free(ab);
        SSL_CTX_set_cert_store(&ctx, store);
        // Ask for a client certificate but do not require one: tokens authenticate too.
        SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);
      }
      return ok;
    });
    if (!ok || !server->is_valid()) {
      return absl::InvalidArgumentError("fake API server: the TLS certificate or key is not valid PEM");
    }
    server_ = std::move(server);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  size_t max_threads = options_.max_threads;
  std::atomic<int64_t>* connections = &connections_;
  server_->new_task_queue = [max_threads, connections] {
    return new GrowingThreadPool(max_threads, connections);
  };
  server_->set_keep_alive_max_count(1000000);
  server_->set_keep_alive_timeout(options_.keep_alive_timeout_seconds);
  server_->set_read_timeout(30);
  server_->set_write_timeout(30);
  server_->set_tcp_nodelay(true);
  auto handler = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
  server_->Get(".*", handler);
  server_->Post(".*", handler);
  server_->Put(".*", handler);
  server_->Patch(".*", handler);
  server_->Delete(".*", handler);
  if (options_.port == 0) {
    port_ = server_->bind_to_any_port(options_.address);
  } else {
    port_ = server_->bind_to_port(options_.address, options_.port) ? options_.port : -1;
  }
  if (port_ <= 0) {
    return absl::UnavailableError(StrCat("fake API server: cannot listen on ", options_.address, ":",
                                         options_.port, " (in use? pick another --port)"));
  }
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing before the accept loop runs: wait for it, so that Stop() always works.
  while (!server_->is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return absl::OkStatus();
}

void FakeApiServer::Stop() {
  if (stopped_.exchange(true)) return;
  store_.Shutdown();
  if (server_) server_->stop();
  if (listener_.joinable()) listener_.join();
}

std::string FakeApiServer::url() const {
  bool v6 = options_.address.find(':') != std::string::npos;
  return StrCat(tls_ ? "https://" : "http://", v6 ? "[" : "", options_.address, v6 ? "]" : "", ":", port_);
}

Resource* FakeApiServer::FindGroupResource(std::string_view group_resource) const {
  std::string resource(group_resource), group;
  if (size_t dot = group_resource.find('.'); dot != std::string_view::npos) {
    resource = std::string(group_resource.substr(0, dot));
    group = std::string(group_resource.substr(dot + 1));
  }
  for (const ResourceInfo& info : store_.Resources()) {
    if (info.resource == resource && info.group == group)
      return store_.Find(info.group, info.version, resource);
  }
  return nullptr;
}

namespace {

absl::Status ToStatus(const Outcome& o) {
  if (o.ok()) return absl::OkStatus();
  return absl::Status(k8s::CodeForHttp(o.code, o.reason),
                      StrCat("HTTP ", o.code, " ", o.reason, ": ", o.message));
}

}  // namespace

absl::StatusOr<Json> FakeApiServer::Create(std::string_view resource, std::string_view ns, Json object) {
  Resource* r = FindGroupResource(resource);
  if (r == nullptr) return absl::NotFoundError(StrCat("no resource ", resource));
  Outcome o = store_.Create(*r, ns, std::move(object));
  if (!o.ok()) return ToStatus(o);
  return *o.object;
}

absl::StatusOr<Json> FakeApiServer::Get(std::string_view resource, std::string_view ns,
                                        std::string_view name) {
  Resource* r = FindGroupResource(resource);
  if (r == nullptr) return absl::NotFoundError(StrCat("no resource ", resource));
  Outcome o = store_.Get(*r, ns, name);
  if (!o.ok()) return ToStatus(o);
  return *o.object;
}

absl::StatusOr<Json> FakeApiServer::MergePatch(std::string_view resource, std::string_view ns,
                                               std::string_view name, const Json& patch) {
  Resource* r = FindGroupResource(resource);
  if (r == nullptr) return absl::NotFoundError(StrCat("no resource ", resource));
  Outcome o = store_.Patch(*r, ns, name, PatchKind::kMerge, patch);
  if (!o.ok()) return ToStatus(o);
  return *o.object;
}

absl::Status FakeApiServer::Delete(std::string_view resource, std::string_view ns, std::string_view name) {
  Resource* r = FindGroupResource(resource);
  if (r == nullptr) return absl::NotFoundError(StrCat("no resource ", resource));
  return ToStatus(store_.Delete(*r, ns, name, Json()));
}

std::vector<Json> FakeApiServer::List(std::string_view resource, std::string_view ns) {
  std::vector<Json> out;
  Resource* r = FindGroupResource(resource);
  if (r == nullptr) return out;
  ListResult l = store_.List(*r, ns, {});
  for (const ObjectPtr& o : l.items) out.push_back(*o);
  return out;
}

void FakeApiServer::FailRequests(FaultRule rule) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.push_back(std::move(rule));
}

void FakeApiServer::ClearFaults() {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.clear();
}

void FakeApiServer::SetLatency(std::chrono::milliseconds latency) {
  std::lock_guard<std::mutex> lock(mu_);
  latency_ = latency;
}

void FakeApiServer::SetTokens(std::vector<std::string> tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  tokens_ = std::move(tokens);
}

int64_t FakeApiServer::requests(std::string_view verb) const {
  if (verb.empty()) return total_requests_.load();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_verb_.find(std::string(verb));
  return it == by_verb_.end() ? 0 : it->second;
}

std::vector<RecordedRequest> FakeApiServer::recent_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<RecordedRequest>(recent_.begin(), recent_.end());
}

std::string FakeApiServer::Kubeconfig(const std::string& token, const std::string& ca_pem,
                                      const std::string& client_certificate_pem,
                                      const std::string& client_key_pem) const {
  auto b64 = [](const std::string& s) {
    std::string out;
    absl::Base64Escape(s, &out);
    return out;
  };
  std::string y =
      StrCat("apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: ", url(), "\n");
  if (!ca_pem.empty()) StrAppend(&y, "    certificate-authority-data: ", b64(ca_pem), "\n");
  StrAppend(&y, "users:\n- name: fake\n  user:\n");
  if (!token.empty()) StrAppend(&y, "    token: ", token, "\n");
  if (!client_certificate_pem.empty())
    StrAppend(&y, "    client-certificate-data: ", b64(client_certificate_pem), "\n");
  if (!client_key_pem.empty()) StrAppend(&y, "    client-key-data: ", b64(client_key_pem), "\n");
  if (token.empty() && client_certificate_pem.empty()) StrAppend(&y, "    {}\n");
  StrAppend(
      &y, "contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n",
      "current-context: fake\n");
  return y;
}

void FakeApiServer::Handle(const httplib::Request& req, httplib::Response& res) {
  ++total_requests_;
  RecordedRequest rec;
  rec.method = req.method;
  rec.target = req.target;
  rec.content_type = req.get_header_value("Content-Type");
  std::chrono::milliseconds latency;
  std::vector<std::string> tokens;
  {
    std::lock_guard<std::mutex> lock(mu_);
    latency = latency_;
    tokens = tokens_;
  }
  if (latency.count() > 0) std::this_thread::sleep_for(latency);

  auto reply = [&](int code, const std::string& body, const std::string& content_type = "application/json") {
    res.status = code;
    res.set_content(body, content_type.c_str());
    rec.status = code;
  };
  auto fail = [&](int code, std::string_view reason, std::string_view message,
                  const Json& details = nullptr) { reply(code, StatusBody(code, reason, message, details)); };
  auto record = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    if (!rec.verb.empty()) ++by_verb_[rec.verb];
    recent_.push_back(rec);
    if (recent_.size() > 1000) recent_.pop_front();
  };

  const std::string& path = req.path;
  if (path == "/healthz" || path == "/readyz" || path == "/livez") {
    reply(200, "ok", "text/plain");
    record();
    return;
  }

  // Authentication.
  std::string user = ClientCertificateUser(req);
  std::string auth = req.get_header_value("Authorization");
  bool require = !tokens.empty() || !options_.client_ca_pem.empty();
  if (auth.starts_with("Bearer ")) {
    std::string t = auth.substr(7);
    bool known = false;
    for (const std::string& k : tokens) known = known || k == t;
    if (known) {
      user = "token:" + t.substr(0, 4);
    } else if (require) {
      user.clear();
    }
  }
  rec.user = user;
  if (require && user.empty()) {
    fail(401, "Unauthorized", "Unauthorized");
    record();
    return;
  }

  if (path == "/version") {
    reply(200, Json{{"major", "1"},
                    {"minor", "29"},
                    {"gitVersion", "v1.29.0-tessera-fake"},
                    {"platform", "linux/amd64"}}
                   .dump());
    record();
    return;
  }

  // Discovery.
  std::vector<std::string_view> segs;
  for (std::string_view s : StrSplit(path, '/')) {
    if (!s.empty()) segs.push_back(s);
  }
  if (path == "/api") {
    reply(200, Json{{"kind", "APIVersions"}, {"versions", {"v1"}}}.dump());
    record();
    return;
  }
  if (path == "/apis") {
    Json groups = Json::array();
    std::map<std::string, std::string> seen;
    for (const ResourceInfo& info : store_.Resources()) {
      if (!info.group.empty()) seen[info.group] = info.version;
    }
    for (const auto& [g, v] : seen) {
      Json gv = {{"groupVersion", g + "/" + v}, {"version", v}};
      groups.push_back({{"name", g}, {"versions", {gv}}, {"preferredVersion", gv}});
    }
    reply(200, Json{{"kind", "APIGroupList"}, {"apiVersion", "v1"}, {"groups", groups}}.dump());
    record();
    return;
  }
  bool core = !segs.empty() && segs[0] == "api";
  bool grouped = !segs.empty() && segs[0] == "apis";
  if ((core && segs.size() == 2) || (grouped && segs.size() == 3)) {
    std::string group = core ? "" : std::string(segs[1]);
    std::string version(segs[core ? 1 : 2]);
    Json list = Json::array();
    for (const ResourceInfo& info : store_.Resources()) {
      if (info.group != group || info.version != version) continue;
      list.push_back({{"name", info.resource},
                      {"namespaced", info.namespaced},
                      {"kind", info.kind},
                      {"verbs", {"create", "delete", "get", "list", "patch", "update", "watch"}}});
      if (info.has_status) {
        list.push_back({{"name", info.resource + "/status"},
                        {"namespaced", info.namespaced},
                        {"kind", info.kind},
                        {"verbs", {"get", "patch", "update"}}});
      }
    }
    reply(200, Json{{"kind", "APIResourceList"},
                    {"groupVersion", group.empty() ? version : group + "/" + version},
                    {"resources", list}}
                   .dump());
    record();
    return;
  }

  // Resource paths.
  Route route;
  size_t rest = core ? 2 : 3;
  bool parsed = (core && segs.size() > 2) || (grouped && segs.size() > 3);
  if (parsed) {
    std::string group = core ? "" : std::string(segs[1]);
    std::string version(segs[core ? 1 : 2]);
    std::vector<std::string_view> r(segs.begin() + static_cast<std::ptrdiff_t>(rest), segs.end());
    Resource* namespaced =
        r.size() >= 3 && r[0] == "namespaces" ? store_.Find(group, version, r[2]) : nullptr;
    if (namespaced != nullptr && ObjectStore::Info(*namespaced).namespaced) {
      route.resource = namespaced;
      route.ns = std::string(r[1]);
      if (r.size() > 3) route.name = std::string(r[3]);
      if (r.size() > 4) route.subresource = std::string(r[4]);
      parsed = r.size() <= 5;
    } else {
      route.resource = store_.Find(group, version, r[0]);
      if (r.size() > 1) route.name = std::string(r[1]);
      if (r.size() > 2) route.subresource = std::string(r[2]);
      parsed = r.size() <= 3;
      // A namespaced resource's object needs its namespace in the path.
      if (route.resource != nullptr && ObjectStore::Info(*route.resource).namespaced && !route.name.empty()) {
        parsed = false;
      }
    }
  }
  // A resource the server does not know (a custom resource) comes into being with its first object, created
  // at the collection path: /apis/GROUP/VERSION/namespaces/NS/RESOURCE (namespaced) or
  // /apis/GROUP/VERSION/RESOURCE (cluster-scoped). Until then, as for a CRD that is not installed, its paths
  // answer 404.
  std::vector<std::string_view> tail;
  if (parsed) tail.assign(segs.begin() + static_cast<std::ptrdiff_t>(rest), segs.end());
  bool unknown_namespaced = tail.size() == 3 && tail[0] == "namespaces" && tail[2] != "status" &&
                            tail[2] != "finalize" &&
                            store_.Find(core ? "" : segs[1], segs[core ? 1 : 2], tail[2]) == nullptr;
  if (parsed && (route.resource == nullptr || unknown_namespaced) && req.method == "POST") {
    std::string group = core ? "" : std::string(segs[1]);
    std::string version(segs[core ? 1 : 2]);
    const std::vector<std::string_view>& r = tail;
    route = Route();
    ResourceInfo info;
    info.group = group;
    info.version = version;
    if (r.size() == 3 && r[0] == "namespaces") {
      info.resource = std::string(r[2]);
      info.namespaced = true;
      route.ns = std::string(r[1]);
    } else if (r.size() == 1) {
      info.resource = std::string(r[0]);
      info.namespaced = false;
    }
    Json body = Json::parse(req.body, nullptr, false);
    if (!info.resource.empty() && body.is_object() && body.contains("kind") && body["kind"].is_string()) {
      info.kind = body["kind"].get<std::string>();
    } else if (!info.resource.empty()) {
      info.kind = info.resource;
      if (info.kind.ends_with("s")) info.kind.pop_back();
      if (!info.kind.empty())
        info.kind[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(info.kind[0])));
    }
    if (!info.resource.empty()) {
      store_.Register(info);
      route.resource = store_.Find(group, version, info.resource);
    }
  }
  if (!parsed || route.resource == nullptr) {
    fail(404, "NotFound", "the server could not find the requested resource");
    record();
    return;
  }
  const ResourceInfo& info = ObjectStore::Info(*route.resource);
  bool watch = req.get_param_value("watch") == "1" || req.get_param_value("watch") == "true";
  const std::string& m = req.method;
  if (m == "GET") {
    rec.verb = route.name.empty() ? (watch ? "watch" : "list") : "get";
  } else if (m == "POST") {
    rec.verb = "create";
  } else if (m == "PUT") {
    rec.verb = "update";
  } else if (m == "PATCH") {
    rec.verb = "patch";
  } else if (m == "DELETE") {
    rec.verb = route.name.empty() ? "deletecollection" : "delete";
  }

  // Injected failures.
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = faults_.begin(); it != faults_.end(); ++it) {
      if (!it->verb.empty() && it->verb != rec.verb) continue;
      if (!it->path_prefix.empty() && !path.starts_with(it->path_prefix)) continue;
      FaultRule f = *it;
      if (it->count > 0 && --it->count == 0) faults_.erase(it);
      if (f.retry_after_seconds) res.set_header("Retry-After", std::to_string(*f.retry_after_seconds));
      std::string body = f.body;
      if (body.empty()) {
        std::string reason = f.reason.empty() ? std::string(k8s::ReasonForHttp(f.status)) : f.reason;
        Json details = nullptr;
        if (f.retry_after_seconds) details = Json{{"retryAfterSeconds", *f.retry_after_seconds}};
        body = StatusBody(f.status, reason, f.message, details);
      }
      res.status = f.status;
      res.set_content(body, f.content_type.c_str());
      rec.status = f.status;
      if (!rec.verb.empty()) ++by_verb_[rec.verb];
      recent_.push_back(rec);
      if (recent_.size() > 1000) recent_.pop_front();
      return;
    }
  }

  auto body_json = [&](Json* out) {
    *out = Json::parse(req.body, nullptr, false);
    if (out->is_discarded()) {
      fail(400, "BadRequest", StrCat("the request body is not JSON: '", req.body.substr(0, 100), "'"));
      return false;
    }
    return true;
  };
  auto send_outcome = [&](const Outcome& o) {
    if (!o.ok()) {
      Json details = {{"name", route.name}, {"kind", info.resource}};
      if (!info.group.empty()) details["group"] = info.group;
      fail(o.code, o.reason, o.message, details);
    } else if (o.object) {
      reply(o.code, o.object->dump());
    } else {
      fail(o.code, "", "", Json{{"name", route.name}, {"kind", info.resource}});
    }
  };

  if (rec.verb == "get") {
    if (!route.subresource.empty() && route.subresource != "status") {
      fail(404, "NotFound", "the server could not find the requested resource");
    } else {
      send_outcome(store_.Get(*route.resource, route.ns, route.name));
    }
  } else if (rec.verb == "list") {
    ListQuery q;
    q.label_selector = req.get_param_value("labelSelector");
    q.field_selector = req.get_param_value("fieldSelector");
    q.continue_token = req.get_param_value("continue");
    std::string limit = req.get_param_value("limit");
    if (!limit.empty() && !ParseInt(limit, &q.limit)) {
      fail(400, "BadRequest", StrCat("limit '", limit, "' is not a number"));
      record();
      return;
    }
    ListResult l = store_.List(*route.resource, route.ns, q);
    if (!l.status.ok()) {
      send_outcome(l.status);
    } else {
      std::string out = StrCat("{\"kind\":\"", info.kind, "List\",\"apiVersion\":\"", info.ApiVersion(),
                               "\",\"metadata\":{\"resourceVersion\":\"", l.resource_version, "\"");
      if (!l.continue_token.empty()) StrAppend(&out, ",\"continue\":\"", l.continue_token, "\"");
      if (l.remaining) StrAppend(&out, ",\"remainingItemCount\":", *l.remaining);
      out += "},\"items\":[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i > 0) out += ",";
        out += l.items[i]->dump();
      }
      out += "]}";
      reply(200, out);
    }
  } else if (rec.verb == "watch") {
    WatchQuery q;
    q.resource_version = req.get_param_value("resourceVersion");
    q.label_selector = req.get_param_value("labelSelector");
    q.field_selector = req.get_param_value("fieldSelector");
    q.bookmarks = req.get_param_value("allowWatchBookmarks") == "true";
    int64_t timeout = 0;
    if (std::string t = req.get_param_value("timeoutSeconds");
        !t.empty() && ParseInt(t, &timeout) && timeout > 0) {
      q.timeout = std::chrono::seconds(timeout);
    }
    auto opened = store_.Watch(*route.resource, route.ns, q);
    if (auto* o = std::get_if<Outcome>(&opened)) {
      if (o->code == 410 && options_.gone_as_error_event) {
        std::string line =
            StrCat("{\"type\":\"ERROR\",\"object\":", StatusBody(410, o->reason, o->message), "}\n");
        res.status = 200;
        res.set_chunked_content_provider(kWatchContentType, [line](size_t, httplib::DataSink& sink) {
          sink.write(line.data(), line.size());
          sink.done();
          return true;
        });
        rec.status = 200;
      } else {
        send_outcome(*o);
      }
    } else {
      std::shared_ptr<WatchCursor> cursor = std::move(std::get<std::unique_ptr<WatchCursor>>(opened));
      res.status = 200;
      rec.status = 200;
      res.set_chunked_content_provider(kWatchContentType, [cursor](size_t, httplib::DataSink& sink) {
        std::string out;
        WatchCursor::Step step = cursor->Next(std::chrono::milliseconds(200), &out);
        if (!out.empty() && !sink.write(out.data(), out.size())) return false;
        if (step == WatchCursor::Step::kEnd) {
          sink.done();
          return true;
        }
        return step != WatchCursor::Step::kAbort;
      });
    }
  } else if (rec.verb == "create") {
    Json body;
    if (body_json(&body)) {
      if (route.name.empty()) {
        send_outcome(store_.Create(*route.resource, route.ns, std::move(body)));
      } else if (route.subresource == "binding" && info.resource == "pods" && info.group.empty()) {
        send_outcome(store_.Bind(*route.resource, route.ns, route.name, body));
      } else {
        fail(405, "MethodNotAllowed",
             StrCat("POST is not supported on ", info.resource, "/", route.subresource));
      }
    }
  } else if (rec.verb == "update") {
    Json body;
    if (route.name.empty()) {
      fail(405, "MethodNotAllowed", "PUT needs an object name");
    } else if (body_json(&body)) {
      send_outcome(store_.Update(*route.resource, route.ns, route.name, std::move(body), route.subresource));
    }
  } else if (rec.verb == "patch") {
    std::string ct = rec.content_type.substr(0, rec.content_type.find(';'));
    std::optional<PatchKind> kind;
    if (ct == "application/merge-patch+json") kind = PatchKind::kMerge;
    if (ct == "application/strategic-merge-patch+json") kind = PatchKind::kStrategic;
    if (ct == "application/json-patch+json") kind = PatchKind::kJson;
    Json body;
    if (!kind) {
      fail(415, "UnsupportedMediaType",
           StrCat("the body of the request was in an unknown format - accepted media types include: "
                  "application/json-patch+json, application/merge-patch+json, "
                  "application/strategic-merge-patch+json (got '",
                  ct, "')"));
    } else if (route.name.empty()) {
      fail(405, "MethodNotAllowed", "PATCH needs an object name");
    } else if (body_json(&body)) {
      send_outcome(store_.Patch(*route.resource, route.ns, route.name, *kind, body, route.subresource));
    }
  } else if (rec.verb == "delete") {
    Json options;
    if (!req.body.empty()) {
      options = Json::parse(req.body, nullptr, false);
      if (options.is_discarded()) options = nullptr;
    }
    Outcome o = store_.Delete(*route.resource, route.ns, route.name, options);
    if (o.ok() && o.reason == "deleted") {
      fail(200, "", "",
           Json{{"name", route.name},
                {"kind", info.resource},
                {"uid", (*o.object)["metadata"].value("uid", "")}});
    } else {
      send_outcome(o);
    }
  } else {
    fail(405, "MethodNotAllowed", StrCat(m, " is not supported here"));
  }
  record();
}

}  // namespace tessera::fake
