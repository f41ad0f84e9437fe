// FakeApiServer: a faithful fake of the Kubernetes API server's REST protocol, over real HTTP or HTTPS on
// loopback, for tests, benchmarks and demos (build/bin/fake-apiserver). It keeps objects in memory
// (ObjectStore) and speaks the API's paths, verbs, content types, Status errors, list pagination and watch
// streams. It fakes no scheduling, kubelet, garbage collection, admission or RBAC; docs/k8s-client.md
// lists what it does.
//
//   absl::StatusOr<std::unique_ptr<FakeApiServer>> s = FakeApiServer::Start({.tokens = {"secret"}});
//   ClientConfig c; c.server = (*s)->url(); c.token = "secret";
//   (*s)->Create("pods", "default", pod_json);                 // in-process, no HTTP
//   (*s)->FailRequests({.verb = "patch", .status = 503, .count = 2, .retry_after_seconds = 0});
//   (*s)->DropWatches();                                       // every open watch breaks
//   (*s)->Stop();
//
// TLS: give a certificate and key (certs.h makes them at test time); with client_ca_pem, client certificates
// signed by that CA authenticate (the user is their CN), as with kube-apiserver's --client-ca-file.
//
// Thread-safety: every method is safe from any thread; the server answers requests on its own threads.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_FAKE_APISERVER_H_
#define TESSERA_TOOLS_FAKE_APISERVER_FAKE_APISERVER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "store.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace tessera::fake {

struct FakeApiServerOptions {
  std::string address = "127.0.0.1";
  int port = 0;  // 0: a free port (see port())
  // HTTPS when both are set.
  std::string tls_certificate_pem;
  std::string tls_private_key_pem;
  // Client certificates signed by this CA authenticate (requires TLS).
  std::string client_ca_pem;
  // Accepted bearer tokens. With no tokens and no client CA, every request is accepted (as the
  // unauthenticated insecure port of old API servers was).
  std::vector<std::string> tokens;
  StoreOptions store;
  // A watch from a resourceVersion older than the history: an ERROR event (code 410) in a 200 stream, as
  // kube-apiserver's watch cache answers (true), or an HTTP 410 reply (false).
  bool gone_as_error_event = true;
  int keep_alive_timeout_seconds = 5;
  size_t max_threads = 2048;  // one per open connection
};

// Makes matching requests fail with a given reply.
struct FaultRule {
  std::string verb;         // get, list, watch, create, update, patch, delete; "" for any
  std::string path_prefix;  // a prefix of the URL path; "" for any
  int status = 500;
  int count = 1;       // how many requests; -1 until ClearFaults()
  std::string reason;  // of the Status object sent when body is empty ("" : from the status code)
  std::string message = "injected by the test";
  std::string body;  // sent as is when set (to send a reply that is not a Status, or not JSON)
  std::string content_type = "application/json";
  std::optional<int> retry_after_seconds;
};

struct RecordedRequest {
  std::string method;
  std::string target;  // path and query, as sent
  std::string verb;    // get, list, watch, create, update, patch, delete ("" for non-resource paths)
  std::string user;    // "" when unauthenticated
  std::string content_type;
  int status = 0;
};

class FakeApiServer {
 public:
  static absl::StatusOr<std::unique_ptr<FakeApiServer>> Start(FakeApiServerOptions options = {});
  ~FakeApiServer();

  FakeApiServer(const FakeApiServer&) = delete;
  FakeApiServer& operator=(const FakeApiServer&) = delete;

  // Ends every watch and stops serving. Idle keep-alive connections may hold it up to keep_alive_timeout.
  void Stop();

  std::string url() const;  // "http://127.0.0.1:PORT" or "https://..."
  int port() const { return port_; }
  ObjectStore& store() { return store_; }

  // In-process access to the objects (no HTTP). `resource` is a group resource: "pods", "nodes",
  // "leases.coordination.k8s.io". The object is returned as stored; failures as the API would report them.
  absl::StatusOr<Json> Create(std::string_view resource, std::string_view ns, Json object);
  absl::StatusOr<Json> Get(std::string_view resource, std::string_view ns, std::string_view name);
  absl::StatusOr<Json> MergePatch(std::string_view resource, std::string_view ns, std::string_view name,
                                  const Json& patch);
  absl::Status Delete(std::string_view resource, std::string_view ns, std::string_view name);
  std::vector<Json> List(std::string_view resource, std::string_view ns = "");

  // Fault injection.
  void FailRequests(FaultRule rule);
  void ClearFaults();
  void SetLatency(std::chrono::milliseconds latency);
  void SetTokens(std::vector<std::string> tokens);
  void DropWatches() { store_.DropWatches(); }
  void ExpireWatches() { store_.ExpireWatches(); }
  void CompactHistory() { store_.CompactHistory(); }
  void InjectWatchData(std::string data, bool then_drop) {
    store_.InjectWatchData(std::move(data), then_drop);
  }

  // What happened.
  int64_t requests(std::string_view verb = "") const;
  int64_t connections() const { return connections_.load(); }
  int open_watches() const { return store_.open_watches(); }
  std::vector<RecordedRequest> recent_requests() const;  // the last 1,000

  // A kubeconfig for this server (current-context "fake"). Empty arguments leave the fields out.
  std::string Kubeconfig(const std::string& token, const std::string& ca_pem = "",
                         const std::string& client_certificate_pem = "",
                         const std::string& client_key_pem = "") const;

 private:
  explicit FakeApiServer(FakeApiServerOptions options);
  absl::Status Listen();
  void Handle(const httplib::Request& req, httplib::Response& res);
  Resource* FindGroupResource(std::string_view group_resource) const;

  FakeApiServerOptions options_;
  ObjectStore store_;
  std::unique_ptr<httplib::Server> server_;
  std::thread listener_;
  int port_ = 0;
  bool tls_ = false;

  mutable std::mutex mu_;
  std::vector<FaultRule> faults_;           // guarded by mu_
  std::vector<std::string> tokens_;         // guarded by mu_
  std::chrono::milliseconds latency_{0};    // guarded by mu_
  std::map<std::string, int64_t> by_verb_;  // guarded by mu_
  std::deque<RecordedRequest> recent_;      // guarded by mu_
  std::atomic<int64_t> total_requests_{0};
  std::atomic<int64_t> connections_{0};
  std::atomic<bool> stopped_{false};
};

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_FAKE_APISERVER_H_
