// Where the Kubernetes client connects and how it authenticates: in-cluster service-account configuration,
// kubeconfig files for development, or a ClientConfig filled in by hand (tests, the fake API server).
//
//   absl::StatusOr<ClientConfig> config = LoadDefaultConfig();      // in a pod: the service account;
//                                                                   // elsewhere: $KUBECONFIG or
//                                                                   ~/.kube/config
//   absl::StatusOr<ClientConfig> dev = LoadKubeconfig({.paths = "/tmp/kc", .context = "kind"});
//   absl::StatusOr<ClientConfig> pod = LoadInClusterConfig({.service_account_dir = "/tmp/fake-sa"});
//
// Errors name the file and the field and say what to fix. Relative paths in a kubeconfig are relative to the
// file that holds them (as kubectl reads them). Thread-safety: the loaders read files and the environment;
// ClientConfig is a plain value.
#ifndef TESSERA_K8S_CONFIG_H_
#define TESSERA_K8S_CONFIG_H_

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tessera::k8s {

// How the client holds connections. kPooled keeps a pool of curl handles, each with its open connection (and
// TLS session), reused across requests and threads. kNone opens a new connection for every request: the
// baseline the benchmark compares against; never useful in production.
enum class ConnectionReuse { kPooled, kNone };

struct ClientConfig {
  // "https://10.0.0.1:443" or "http://127.0.0.1:8080"; a path prefix is kept
  // ("https://host/k8s/clusters/c1").
  std::string server;

  // TLS. PEM text wins over files when both are set. An https server with no CA given is verified against the
  // system's trust store.
  std::string certificate_authority_file;
  std::string certificate_authority_pem;
  std::string client_certificate_file;
  std::string client_certificate_pem;
  std::string client_key_file;
  std::string client_key_pem;
  bool insecure_skip_tls_verify = false;

  // Bearer token: given directly, or read from a file that is re-read when it changes, at least every
  // token_reload_interval, and once more after a 401 (the kubelet rotates service-account tokens).
  std::string token;
  std::string token_file;
  std::chrono::seconds token_reload_interval{60};

  std::string proxy_url;
  // The namespace of the service account, or the kubeconfig context's namespace; "default" otherwise.
  std::string default_namespace = "default";
  // Where this configuration came from, for messages: "in-cluster (/var/run/...)", "kubeconfig /x (context
  // y)".
  std::string source = "explicit configuration";
  std::string user_agent = "tessera";

  std::chrono::milliseconds request_timeout{30000};
  std::chrono::milliseconds connect_timeout{10000};
  // A 429 or 5xx reply with Retry-After is retried up to max_retries times, waiting as told (capped).
  int max_retries = 3;
  std::chrono::milliseconds max_retry_wait{10000};

  ConnectionReuse connection_reuse = ConnectionReuse::kPooled;
  // Idle handles kept in the pool; more may be in use at once (one per concurrent request).
  size_t max_idle_connections = 64;
};

inline constexpr char kServiceAccountDir[] = "/var/run/secrets/kubernetes.io/serviceaccount";

// In-cluster configuration: KUBERNETES_SERVICE_HOST/PORT and the service account's token, ca.crt and
// namespace. Every input can be redirected for tests.
struct InClusterSource {
  std::string service_account_dir = kServiceAccountDir;
  std::optional<std::string> host;  // unset: $KUBERNETES_SERVICE_HOST
  std::optional<std::string> port;  // unset: $KUBERNETES_SERVICE_PORT
};
absl::StatusOr<ClientConfig> LoadInClusterConfig(const InClusterSource& source = {});

struct KubeconfigSource {
  // Files separated by ':' and merged as kubectl merges them (the first file to define a name wins).
  // Empty: $KUBECONFIG, else ~/.kube/config.
  std::string paths;
  // Empty: the current-context of the files.
  std::string context;
};
absl::StatusOr<ClientConfig> LoadKubeconfig(const KubeconfigSource& source = {});

// Parses one kubeconfig's text. `path` names it in messages; relative file paths resolve against `base_dir`.
absl::StatusOr<ClientConfig> ParseKubeconfig(std::string_view yaml, std::string_view path,
                                             std::string_view base_dir, std::string_view context = "");

// True when this process runs in a pod (KUBERNETES_SERVICE_HOST is set).
bool InCluster();

// In-cluster when InCluster(), else LoadKubeconfig().
absl::StatusOr<ClientConfig> LoadDefaultConfig();

}  // namespace tessera::k8s

#endif  // TESSERA_K8S_CONFIG_H_
