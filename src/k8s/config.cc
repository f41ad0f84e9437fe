#include "k8s/config.h"

#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/files.h"
#include "core/strings.h"

namespace tessera::k8s {

namespace {

namespace fs = std::filesystem;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

// One named entry of a kubeconfig list (clusters, users, contexts) and where it came from.
struct Entry {
  YAML::Node body;    // the entry's "cluster" / "user" / "context" map
  std::string where;  // "kubeconfig /x: clusters[0] (\"kind\").cluster"
  std::string base_dir;
};

struct Merged {
  std::map<std::string, Entry> clusters, users, contexts;
  std::string current_context;
  std::vector<std::string> files;
};

std::string Quoted(std::string_view s) {
  return StrCat("\"", s, "\"");
}

absl::Status Scalar(const YAML::Node& map, const char* key, const std::string& where, std::string* out) {
  YAML::Node n = map[key];
  if (!n || n.IsNull()) return absl::OkStatus();
  if (!n.IsScalar()) {
    return absl::InvalidArgumentError(StrCat(where, ".", key, ": expected a string, found a ",
                                             n.IsMap() ? "map" : "list", "; write it as `", key, ": VALUE`"));
  }
  *out = n.Scalar();
  return absl::OkStatus();
}

absl::Status Bool(const YAML::Node& map, const char* key, const std::string& where, bool* out) {
  std::string text;
  if (absl::Status s = Scalar(map, key, where, &text); !s.ok()) return s;
  if (text.empty()) return absl::OkStatus();
  if (text == "true" || text == "True" || text == "TRUE") {
    *out = true;
  } else if (text == "false" || text == "False" || text == "FALSE") {
    *out = false;
  } else {
    return absl::InvalidArgumentError(
        StrCat(where, ".", key, ": '", text, "' is not a boolean; write true or false"));
  }
  return absl::OkStatus();
}

absl::Status AddEntries(const YAML::Node& root, const char* list, const char* inner, const std::string& file,
                        const std::string& base_dir, std::map<std::string, Entry>* out) {
  YAML::Node items = root[list];
  if (!items || items.IsNull()) return absl::OkStatus();
  if (!items.IsSequence()) {
    return absl::InvalidArgumentError(StrCat("kubeconfig ", file, ": ", list,
                                             ": expected a list of {name: ..., ", inner, ": {...}} entries"));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const YAML::Node& item = items[i];
    std::string where = StrCat("kubeconfig ", file, ": ", list, "[", static_cast<int64_t>(i), "]");
    if (!item.IsMap())
      return absl::InvalidArgumentError(StrCat(where, ": expected a map with name and ", inner));
    std::string name;
    if (absl::Status s = Scalar(item, "name", where, &name); !s.ok()) return s;
    if (name.empty())
      return absl::InvalidArgumentError(StrCat(where, ".name: missing; every entry needs a name"));
    YAML::Node body = item[inner];
    if (!body || body.IsNull()) body = YAML::Node(YAML::NodeType::Map);
    if (!body.IsMap()) {
      return absl::InvalidArgumentError(StrCat(where, " (", Quoted(name), ").", inner, ": expected a map"));
    }
    // The first file to define a name wins, as kubectl merges.
    out->try_emplace(name, Entry{body, StrCat(where, " (", Quoted(name), ").", inner), base_dir});
  }
  return absl::OkStatus();
}

absl::Status MergeText(std::string_view yaml, const std::string& file, const std::string& base_dir,
                       Merged* m) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(StrCat("kubeconfig ", file, " is not valid YAML: line ",
                                             e.mark.line + 1, ", column ", e.mark.column + 1, ": ", e.msg));
  }
  m->files.push_back(file);
  if (root.IsNull()) return absl::OkStatus();  // an empty file contributes nothing, as with kubectl
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        StrCat("kubeconfig ", file, ": expected a map with clusters, users, contexts and current-context"));
  }
  if (absl::Status s = AddEntries(root, "clusters", "cluster", file, base_dir, &m->clusters); !s.ok())
    return s;
  if (absl::Status s = AddEntries(root, "users", "user", file, base_dir, &m->users); !s.ok()) return s;
  if (absl::Status s = AddEntries(root, "contexts", "context", file, base_dir, &m->contexts); !s.ok())
    return s;
  if (m->current_context.empty()) {
    std::string cc;
    if (absl::Status s = Scalar(root, "current-context", StrCat("kubeconfig ", file), &cc); !s.ok()) return s;
    m->current_context = cc;
  }
  return absl::OkStatus();
}

std::string Resolve(const std::string& base_dir, const std::string& path) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return (fs::path(base_dir) / path).lexically_normal().string();
}

// Reads a file named by a kubeconfig field, to check now (not at the first request) that it is there.
absl::StatusOr<std::string> ReadField(const std::string& where, const char* field, const std::string& path,
                                      const char* data_field) {
  absl::StatusOr<std::string> text = ReadTextFile(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        StrCat(where, ".", field, ": ", text.status().message(),
               "; fix the path (relative paths are relative to the kubeconfig) or put "
               "the content, base64-encoded, in ",
               data_field));
  }
  return text;
}

absl::StatusOr<std::string> DecodeData(const std::string& where, const char* field, const std::string& b64,
                                       std::string_view pem_marker) {
  std::string out;
  std::string compact;
  for (char c : b64) {
    if (c != '\n' && c != '\r' && c != ' ') compact.push_back(c);
  }
  if (!absl::Base64Unescape(compact, &out)) {
    return absl::InvalidArgumentError(
        StrCat(where, ".", field, ": not valid base64; encode the PEM file with `base64 -w0 FILE`"));
  }
  if (out.find(pem_marker) == std::string::npos) {
    return absl::InvalidArgumentError(StrCat(where, ".", field, ": the decoded data is not PEM (no '",
                                             pem_marker, "' line); it must be the base64 of a PEM file"));
  }
  return out;
}

absl::Status CheckPem(const std::string& where, const char* field, const std::string& text,
                      std::string_view marker) {
  if (text.find(marker) == std::string::npos) {
    return absl::InvalidArgumentError(
        StrCat(where, ".", field, ": the file is not PEM (no '", marker, "' line); give a PEM file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ClientConfig> Build(const Merged& m, std::string_view context_arg) {
  std::string files = StrJoin(m.files, ":");
  std::string context_name(context_arg);
  if (context_name.empty()) context_name = m.current_context;
  if (context_name.empty()) {
    return absl::InvalidArgumentError(
        StrCat("kubeconfig ", files,
               ": current-context is not set and no context was asked for; set "
               "current-context (kubectl config use-context NAME) or pass a context"));
  }
  auto ctx_it = m.contexts.find(context_name);
  if (ctx_it == m.contexts.end()) {
    std::vector<std::string> names;
    for (const auto& [n, e] : m.contexts) names.push_back(n);
    return absl::NotFoundError(StrCat(
        "kubeconfig ", files, ": context ", Quoted(context_name),
        " is not defined; the contexts are: ", names.empty() ? std::string("(none)") : StrJoin(names, ", ")));
  }
  const Entry& ctx = ctx_it->second;
  std::string cluster_name, user_name, ns;
  if (absl::Status s = Scalar(ctx.body, "cluster", ctx.where, &cluster_name); !s.ok()) return s;
  if (absl::Status s = Scalar(ctx.body, "user", ctx.where, &user_name); !s.ok()) return s;
  if (absl::Status s = Scalar(ctx.body, "namespace", ctx.where, &ns); !s.ok()) return s;
  if (cluster_name.empty()) {
    return absl::InvalidArgumentError(StrCat(ctx.where, ".cluster: missing; name one of the clusters"));
  }
  auto cl_it = m.clusters.find(cluster_name);
  if (cl_it == m.clusters.end()) {
    return absl::NotFoundError(
        StrCat(ctx.where, ".cluster: cluster ", Quoted(cluster_name), " is not defined under clusters"));
  }

  ClientConfig config;
  config.source = StrCat("kubeconfig ", files, " (context ", Quoted(context_name), ")");
  if (!ns.empty()) config.default_namespace = ns;

  const Entry& cl = cl_it->second;
  if (absl::Status s = Scalar(cl.body, "server", cl.where, &config.server); !s.ok()) return s;
  if (config.server.empty()) {
    return absl::InvalidArgumentError(
        StrCat(cl.where, ".server: missing; set it to the API server's URL, e.g. https://127.0.0.1:6443"));
  }
  if (!config.server.starts_with("https://") && !config.server.starts_with("http://")) {
    return absl::InvalidArgumentError(
        StrCat(cl.where, ".server: '", config.server,
               "' is not an http:// or https:// URL, e.g. https://127.0.0.1:6443"));
  }
  while (config.server.ends_with("/")) config.server.pop_back();
  if (absl::Status s = Bool(cl.body, "insecure-skip-tls-verify", cl.where, &config.insecure_skip_tls_verify);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = Scalar(cl.body, "proxy-url", cl.where, &config.proxy_url); !s.ok()) return s;
  std::string tls_server_name;
  if (absl::Status s = Scalar(cl.body, "tls-server-name", cl.where, &tls_server_name); !s.ok()) return s;
  if (!tls_server_name.empty()) {
    return absl::UnimplementedError(StrCat(cl.where,
                                           ".tls-server-name: not supported by tessera's client; use a ",
                                           "server URL whose host name the certificate names"));
  }
  std::string ca_data, ca_file;
  if (absl::Status s = Scalar(cl.body, "certificate-authority-data", cl.where, &ca_data); !s.ok()) return s;
  if (absl::Status s = Scalar(cl.body, "certificate-authority", cl.where, &ca_file); !s.ok()) return s;
  constexpr std::string_view kCertMarker = "-----BEGIN CERTIFICATE-----";
  constexpr std::string_view kKeyMarker = "PRIVATE KEY-----";
  if (!ca_data.empty()) {
    absl::StatusOr<std::string> pem =
        DecodeData(cl.where, "certificate-authority-data", ca_data, kCertMarker);
    if (!pem.ok()) return pem.status();
    config.certificate_authority_pem = *pem;
  } else if (!ca_file.empty()) {
    config.certificate_authority_file = Resolve(cl.base_dir, ca_file);
    absl::StatusOr<std::string> text = ReadField(
        cl.where, "certificate-authority", config.certificate_authority_file, "certificate-authority-data");
    if (!text.ok()) return text.status();
    if (absl::Status s = CheckPem(cl.where, "certificate-authority", *text, kCertMarker); !s.ok()) return s;
  }

  if (!user_name.empty()) {
    auto us_it = m.users.find(user_name);
    if (us_it == m.users.end()) {
      return absl::NotFoundError(
          StrCat(ctx.where, ".user: user ", Quoted(user_name), " is not defined under users"));
    }
    const Entry& us = us_it->second;
    for (const char* unsupported : {"exec", "auth-provider", "username", "password"}) {
      if (us.body[unsupported]) {
        return absl::UnimplementedError(StrCat(
            us.where, ".", unsupported,
            ": not supported by tessera's client (it reads tokens, token files and client certificates); ",
            "give the user a token (kubectl create token SERVICE-ACCOUNT) or a client certificate"));
      }
    }
    if (absl::Status s = Scalar(us.body, "token", us.where, &config.token); !s.ok()) return s;
    std::string token_file;
    if (absl::Status s = Scalar(us.body, "tokenFile", us.where, &token_file); !s.ok()) return s;
    if (config.token.empty() && !token_file.empty()) {
      config.token_file = Resolve(us.base_dir, token_file);
      absl::StatusOr<std::string> t = ReadField(us.where, "tokenFile", config.token_file, "token");
      if (!t.ok()) return t.status();
    }
    std::string cert_data, cert_file, key_data, key_file;
    if (absl::Status s = Scalar(us.body, "client-certificate-data", us.where, &cert_data); !s.ok()) return s;
    if (absl::Status s = Scalar(us.body, "client-certificate", us.where, &cert_file); !s.ok()) return s;
    if (absl::Status s = Scalar(us.body, "client-key-data", us.where, &key_data); !s.ok()) return s;
    if (absl::Status s = Scalar(us.body, "client-key", us.where, &key_file); !s.ok()) return s;
    if (!cert_data.empty()) {
      absl::StatusOr<std::string> pem =
          DecodeData(us.where, "client-certificate-data", cert_data, kCertMarker);
      if (!pem.ok()) return pem.status();
      config.client_certificate_pem = *pem;
    } else if (!cert_file.empty()) {
      config.client_certificate_file = Resolve(us.base_dir, cert_file);
      absl::StatusOr<std::string> text = ReadField(us.where, "client-certificate",
                                                   config.client_certificate_file, "client-certificate-data");
      if (!text.ok()) return text.status();
      if (absl::Status s = CheckPem(us.where, "client-certificate", *text, kCertMarker); !s.ok()) return s;
    }
    if (!key_data.empty()) {
      absl::StatusOr<std::string> pem = DecodeData(us.where, "client-key-data", key_data, kKeyMarker);
      if (!pem.ok()) return pem.status();
      config.client_key_pem = *pem;
    } else if (!key_file.empty()) {
      config.client_key_file = Resolve(us.base_dir, key_file);
      absl::StatusOr<std::string> text =
          ReadField(us.where, "client-key", config.client_key_file, "client-key-data");
      if (!text.ok()) return text.status();
      if (absl::Status s = CheckPem(us.where, "client-key", *text, kKeyMarker); !s.ok()) return s;
    }
    bool has_cert = !config.client_certificate_pem.empty() || !config.client_certificate_file.empty();
    bool has_key = !config.client_key_pem.empty() || !config.client_key_file.empty();
    if (has_cert != has_key) {
      return absl::InvalidArgumentError(
          StrCat(us.where, ": a client certificate needs its key and a key needs its ",
                 "certificate; give both client-certificate(-data) and client-key(-data)"));
    }
  }
  if (config.server.starts_with("http://") &&
      (!config.certificate_authority_pem.empty() || !config.certificate_authority_file.empty())) {
    return absl::InvalidArgumentError(
        StrCat(cl.where, ".server: '", config.server,
               "' is plain http but a certificate authority is given; use https://"));
  }
  return config;
}

}  // namespace

absl::StatusOr<ClientConfig> ParseKubeconfig(std::string_view yaml, std::string_view path,
                                             std::string_view base_dir, std::string_view context) {
  Merged m;
  if (absl::Status s = MergeText(yaml, std::string(path), std::string(base_dir), &m); !s.ok()) return s;
  return Build(m, context);
}

absl::StatusOr<ClientConfig> LoadKubeconfig(const KubeconfigSource& source) {
  std::string paths = source.paths;
  std::string origin = "the kubeconfig path";
  if (paths.empty()) {
    paths = Env("KUBECONFIG");
    origin = "$KUBECONFIG";
  }
  if (paths.empty()) {
    std::string home = Env("HOME");
    if (home.empty()) {
      return absl::FailedPreconditionError(
          "no kubeconfig: $KUBECONFIG is not set and $HOME is not set (so ~/.kube/config cannot be found); "
          "set "
          "KUBECONFIG to a kubeconfig file");
    }
    paths = home + "/.kube/config";
    origin = "the default ~/.kube/config";
  }
  Merged m;
  for (std::string_view p : StrSplit(paths, ':')) {
    if (p.empty()) continue;
    std::string file(p);
    std::error_code ec;
    if (!fs::exists(file, ec)) continue;  // kubectl skips missing files in KUBECONFIG
    absl::StatusOr<std::string> text = ReadTextFile(file);
    if (!text.ok()) {
      return absl::FailedPreconditionError(
          StrCat("kubeconfig ", file, " cannot be read: ", text.status().message(), "; fix its permissions"));
    }
    std::string dir = fs::path(file).parent_path().string();
    if (absl::Status s = MergeText(*text, file, dir, &m); !s.ok()) return s;
  }
  if (m.files.empty()) {
    return absl::NotFoundError(
        StrCat("no kubeconfig: ", origin, " (", paths,
               ") names no existing file; set KUBECONFIG to a kubeconfig file, or run in a pod "
               "to use the service account"));
  }
  return Build(m, source.context);
}

bool InCluster() {
  return !Env("KUBERNETES_SERVICE_HOST").empty();
}

absl::StatusOr<ClientConfig> LoadInClusterConfig(const InClusterSource& source) {
  std::string host = source.host ? *source.host : Env("KUBERNETES_SERVICE_HOST");
  std::string port = source.port ? *source.port : Env("KUBERNETES_SERVICE_PORT");
  if (host.empty() || port.empty()) {
    return absl::FailedPreconditionError(
        "in-cluster configuration: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set (the "
        "kubelet "
        "sets them in every pod); outside a cluster use a kubeconfig (KUBECONFIG)");
  }
  int port_number = 0;
  if (!ParseInt(port, &port_number) || port_number <= 0 || port_number > 65535) {
    return absl::InvalidArgumentError(
        StrCat("in-cluster configuration: KUBERNETES_SERVICE_PORT '", port, "' is not a port number"));
  }
  ClientConfig config;
  const std::string& dir = source.service_account_dir;
  config.source = StrCat("in-cluster service account (", dir, ")");
  bool v6 = host.find(':') != std::string::npos && !host.starts_with("[");
  config.server = StrCat("https://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port_number);
  config.token_file = dir + "/token";
  absl::StatusOr<std::string> token = ReadTextFile(config.token_file);
  if (!token.ok()) {
    return absl::FailedPreconditionError(
        StrCat("in-cluster configuration: the service-account token ", config.token_file, " cannot be read (",
               token.status().message(), "); is automountServiceAccountToken false for this pod?"));
  }
  if (StripWhitespace(*token).empty()) {
    return absl::FailedPreconditionError(
        StrCat("in-cluster configuration: the service-account token ", config.token_file, " is empty"));
  }
  config.certificate_authority_file = dir + "/ca.crt";
  absl::StatusOr<std::string> ca = ReadTextFile(config.certificate_authority_file);
  if (!ca.ok()) {
    return absl::FailedPreconditionError(StrCat("in-cluster configuration: the cluster CA ",
                                                config.certificate_authority_file, " cannot be read (",
                                                ca.status().message(), ")"));
  }
  if (ca->find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    return absl::FailedPreconditionError(StrCat("in-cluster configuration: the cluster CA ",
                                                config.certificate_authority_file,
                                                " is not a PEM certificate"));
  }
  absl::StatusOr<std::string> ns = ReadTextFile(dir + "/namespace");
  if (ns.ok() && !StripWhitespace(*ns).empty()) config.default_namespace = std::string(StripWhitespace(*ns));
  return config;
}

absl::StatusOr<ClientConfig> LoadDefaultConfig() {
  if (InCluster()) return LoadInClusterConfig();
  return LoadKubeconfig();
}

}  // namespace tessera::k8s
