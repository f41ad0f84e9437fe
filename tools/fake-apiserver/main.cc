// fake-apiserver: the fake Kubernetes API server as a program, for demos and manual tests of Tessera's parts.
//   fake-apiserver --port 8080 --nodes 3 --write-kubeconfig /tmp/kc
//   KUBECONFIG=/tmp/kc kubectl get nodes        (kubectl speaks the same protocol)
#include <CLI/CLI.hpp>
#include <csignal>
#include <fstream>
#include <iostream>
#include <thread>

#include "certs.h"
#include "common/files.h"
#include "common/log.h"
#include "core/strings.h"
#include "fake_apiserver.h"

namespace {

volatile std::sig_atomic_t stop_requested = 0;

void OnSignal(int) {
  stop_requested = 1;
}

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  return static_cast<bool>(out);
}

}  // namespace

int main(int argc, char** argv) {
  using tessera::StrCat;
  namespace fake = tessera::fake;
  CLI::App app{
      "fake-apiserver: an in-memory fake of the Kubernetes API server (nodes, pods, events, namespaces, "
      "configmaps, "
      "leases; get/list/watch/create/update/patch/delete, pods/binding), for demos and tests. It schedules "
      "nothing "
      "and runs no controllers. docs/k8s-client.md says what it fakes."};
  fake::FakeApiServerOptions options;
  std::string kubeconfig_path, load_file, ca_out;
  std::string cert_file, key_file, client_ca_file;
  bool self_signed = false;
  int nodes = 0, pods = 0;
  int64_t bookmark_ms = 1000;
  bool verbose = false;
  std::string listen;
  app.add_option("--listen", listen,
                 "ADDRESS:PORT to listen on (instead of --address and --port), e.g. 127.0.0.1:6443");
  app.add_option("--address", options.address, "Address to listen on")->capture_default_str();
  app.add_option("--port", options.port, "Port (0: any free port, printed at start)")->capture_default_str();
  app.add_option("--token", options.tokens,
                 "Accepted bearer token (repeat for more); none: no authentication");
  app.add_flag("--tls", self_signed,
               "Serve HTTPS with a certificate signed by a CA made at start (see --ca-out)");
  app.add_option("--ca-out", ca_out, "With --tls: write the CA certificate (PEM) here");
  app.add_option("--tls-cert", cert_file, "Serve HTTPS with this certificate (PEM)")
      ->check(CLI::ExistingFile);
  app.add_option("--tls-key", key_file, "The key of --tls-cert (PEM)")->check(CLI::ExistingFile);
  app.add_option("--client-ca", client_ca_file, "Accept client certificates signed by this CA (PEM)")
      ->check(CLI::ExistingFile);
  app.add_option("--history", options.store.history_limit,
                 "Watch events kept per resource (older: 410 Expired)")
      ->capture_default_str();
  app.add_option("--bookmark-interval-ms", bookmark_ms, "How often watches that allow bookmarks get one")
      ->capture_default_str();
  app.add_option("--load", load_file, "JSON file with objects to create at start (an array, or a v1 List)")
      ->check(CLI::ExistingFile);
  app.add_option("--nodes", nodes, "Create this many demo nodes (node-0...)")->capture_default_str();
  app.add_option("--pods", pods, "Create this many unbound demo pods in namespace default")
      ->capture_default_str();
  app.add_option("--write-kubeconfig", kubeconfig_path, "Write a kubeconfig for this server here");
  app.add_flag("-v,--verbose", verbose, "Log to stderr");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (!listen.empty()) {
    size_t colon = listen.rfind(':');
    int port = -1;
    if (colon == std::string::npos || !tessera::ParseInt(std::string_view(listen).substr(colon + 1), &port) ||
        port < 0 || port > 65535) {
      std::cerr << "fake-apiserver: --listen '" << listen << "' is not ADDRESS:PORT (e.g. 127.0.0.1:6443)\n";
      return 2;
    }
    options.address = listen.substr(0, colon);
    if (options.address.size() >= 2 && options.address.front() == '[' && options.address.back() == ']') {
      options.address = options.address.substr(1, options.address.size() - 2);
    }
    options.port = port;
  }
  tessera::log::Init("fake-apiserver", verbose ? tessera::log::Level::kInfo : tessera::log::Level::kWarn);
  options.store.bookmark_interval = std::chrono::milliseconds(bookmark_ms);

  std::string ca_pem;
  if (self_signed) {
    auto ca = fake::MakeCa("fake-apiserver CA");
    if (!ca.ok()) {
      std::cerr << "fake-apiserver: " << ca.status().message() << "\n";
      return 1;
    }
    auto server = fake::IssueCertificate(*ca, {.common_name = "fake-apiserver",
                                               .organizations = {},
                                               .dns_names = {"localhost"},
                                               .ips = {"127.0.0.1", "::1"},
                                               .client = false});
    if (!server.ok()) {
      std::cerr << "fake-apiserver: " << server.status().message() << "\n";
      return 1;
    }
    options.tls_certificate_pem = server->certificate;
    options.tls_private_key_pem = server->private_key;
    ca_pem = ca->certificate;
    if (!ca_out.empty() && !WriteFile(ca_out, ca_pem)) {
      std::cerr << "fake-apiserver: cannot write " << ca_out << "\n";
      return 1;
    }
  } else if (!cert_file.empty() || !key_file.empty()) {
    auto cert = tessera::ReadTextFile(cert_file);
    auto key = tessera::ReadTextFile(key_file);
    if (!cert.ok() || !key.ok()) {
      std::cerr << "fake-apiserver: --tls-cert and --tls-key must both name readable PEM files\n";
      return 1;
    }
    options.tls_certificate_pem = *cert;
    options.tls_private_key_pem = *key;
  }
  if (!client_ca_file.empty()) {
    auto ca = tessera::ReadTextFile(client_ca_file);
    if (!ca.ok()) {
      std::cerr << "fake-apiserver: " << ca.status().message() << "\n";
      return 1;
    }
    options.client_ca_pem = *ca;
  }

  auto server = fake::FakeApiServer::Start(options);
  if (!server.ok()) {
    std::cerr << "fake-apiserver: " << server.status().message() << "\n";
    return 1;
  }
  fake::FakeApiServer& s = **server;
  for (int i = 0; i < nodes; ++i) {
    (void)s.Create("nodes", "",
                   {{"metadata", {{"name", StrCat("node-", i)}, {"labels", {{"tessera.dev/gpu", "true"}}}}},
                    {"status", {{"capacity", {{"tessera.dev/gpu", "8"}}}}}});
  }
  for (int i = 0; i < pods; ++i) {
    (void)s.Create("pods", "default",
                   {{"metadata", {{"name", StrCat("pod-", i)}}},
                    {"spec",
                     {{"schedulerName", "tessera"},
                      {"containers",
                       {{{"name", "main"},
                         {"image", "busybox"},
                         {"resources", {{"limits", {{"tessera.dev/gpu", "1"}}}}}}}}}}});
  }
  if (!load_file.empty()) {
    auto text = tessera::ReadTextFile(load_file);
    fake::Json j = text.ok() ? fake::Json::parse(*text, nullptr, false) : fake::Json();
    if (j.is_discarded() || (!j.is_array() && !j.contains("items"))) {
      std::cerr << "fake-apiserver: " << load_file << " is not a JSON array of objects or a List\n";
      return 1;
    }
    const fake::Json& items = j.is_array() ? j : j["items"];
    for (const fake::Json& obj : items) {
      std::string api_version = obj.value("apiVersion", "v1"), kind = obj.value("kind", "");
      std::string resource;
      for (const fake::ResourceInfo& info : s.store().Resources()) {
        if (info.ApiVersion() == api_version && info.kind == kind) resource = info.GroupResource();
      }
      auto created = resource.empty() ? absl::StatusOr<fake::Json>(absl::NotFoundError(StrCat(
                                            "no resource for apiVersion ", api_version, " kind ", kind)))
                                      : s.Create(resource, "", obj);
      if (!created.ok()) {
        std::cerr << "fake-apiserver: " << load_file << ": " << created.status().message() << "\n";
        return 1;
      }
    }
  }
  if (!kubeconfig_path.empty()) {
    std::string token = options.tokens.empty() ? "" : options.tokens[0];
    if (!WriteFile(kubeconfig_path, s.Kubeconfig(token, ca_pem))) {
      std::cerr << "fake-apiserver: cannot write " << kubeconfig_path << "\n";
      return 1;
    }
  }
  std::cout << "fake-apiserver listening on " << s.url() << std::endl;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!stop_requested) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  s.Stop();
  return 0;
}
