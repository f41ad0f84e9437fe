// Client configuration: kubeconfig files (tokens, token files, client certificates, CAs as data or files,
// contexts, merged files, errors) and the in-cluster service account from a temporary directory, each used
// against the fake API server over HTTPS where it matters.
#include "k8s/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "certs.h"
#include "k8s/api_status.h"
#include "k8s/k8s_test_util.h"
#include "k8s/kube_api.h"

namespace tessera::k8s {
namespace {

using testing::FakeCluster;
using ::testing::HasSubstr;
using testing::MakeNodeObject;
using testing::TempDir;

std::string B64(const std::string& s) {
  std::string out;
  absl::Base64Escape(s, &out);
  return out;
}

std::string Msg(const absl::Status& s) {
  return std::string(s.message());
}

// A CA, a server certificate for 127.0.0.1 and a client certificate for "alice".
struct Pki {
  Pki() {
    ca = *fake::MakeCa("kubeconfig test CA");
    server = *fake::IssueCertificate(ca, {.common_name = "apiserver", .ips = {"127.0.0.1"}});
    alice = *fake::IssueCertificate(ca, {.common_name = "alice", .client = true});
  }
  fake::FakeApiServerOptions ServerOptions() const {
    fake::FakeApiServerOptions o;
    o.tls_certificate_pem = server.certificate;
    o.tls_private_key_pem = server.private_key;
    o.client_ca_pem = ca.certificate;
    o.tokens = {"dev-token"};
    return o;
  }
  fake::Pem ca, server, alice;
};

constexpr char kTwoContexts[] = R"(apiVersion: v1
kind: Config
current-context: dev
clusters:
- name: prod
  cluster:
    server: https://10.0.0.1:6443/
    certificate-authority-data: CA_DATA
- name: local
  cluster:
    server: http://127.0.0.1:8080
contexts:
- name: dev
  context: {cluster: prod, user: dev-user, namespace: team-a}
- name: local
  context: {cluster: local, user: nobody}
users:
- name: dev-user
  user:
    token: abc.def
- name: nobody
  user: {}
)";

std::string TwoContexts(const std::string& ca_pem) {
  std::string y = kTwoContexts;
  y.replace(y.find("CA_DATA"), 7, B64(ca_pem));
  return y;
}

TEST(KubeconfigTest, CurrentContextWithTokenAndCaData) {
  Pki pki;
  absl::StatusOr<ClientConfig> c = ParseKubeconfig(TwoContexts(pki.ca.certificate), "/x/config", "/x");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "https://10.0.0.1:6443");
  EXPECT_EQ(c->token, "abc.def");
  EXPECT_EQ(c->certificate_authority_pem, pki.ca.certificate);
  EXPECT_EQ(c->default_namespace, "team-a");
  EXPECT_THAT(c->source, HasSubstr("dev"));

  absl::StatusOr<ClientConfig> local =
      ParseKubeconfig(TwoContexts(pki.ca.certificate), "/x/config", "/x", "local");
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->server, "http://127.0.0.1:8080");
  EXPECT_TRUE(local->token.empty());
  EXPECT_EQ(local->default_namespace, "default");

  absl::Status missing =
      ParseKubeconfig(TwoContexts(pki.ca.certificate), "/x/config", "/x", "staging").status();
  EXPECT_TRUE(absl::IsNotFound(missing));
  EXPECT_THAT(Msg(missing), HasSubstr("dev, local"));
}

TEST(KubeconfigTest, ClientCertificateFilesRelativeToTheKubeconfig) {
  Pki pki;
  TempDir dir;
  dir.Write("pki/ca.crt", pki.ca.certificate);
  dir.Write("pki/alice.crt", pki.alice.certificate);
  dir.Write("pki/alice.key", pki.alice.private_key);
  FakeCluster cluster(pki.ServerOptions());
  std::string yaml = StrCat(R"(apiVersion: v1
kind: Config
current-context: kind
clusters:
- name: kind
  cluster:
    server: )",
                            cluster.server->url(), R"(
    certificate-authority: pki/ca.crt
contexts:
- name: kind
  context:
    cluster: kind
    user: alice
users:
- name: alice
  user:
    client-certificate: pki/alice.crt
    client-key: pki/alice.key
)");
  std::string path = dir.Write("kube/config", yaml);
  // Paths are relative to the kubeconfig's directory: kube/../pki is wrong on purpose here.
  absl::Status wrong = LoadKubeconfig({.paths = path}).status();
  EXPECT_FALSE(wrong.ok());
  EXPECT_THAT(Msg(wrong), HasSubstr("pki/ca.crt"));

  path = dir.Write("config", yaml);
  absl::StatusOr<ClientConfig> c = LoadKubeconfig({.paths = path});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->certificate_authority_file, dir.path() + "/pki/ca.crt");
  EXPECT_EQ(c->client_certificate_file, dir.path() + "/pki/alice.crt");
  absl::StatusOr<std::unique_ptr<KubeApi>> api = NewKubeApi(*c);
  ASSERT_TRUE(api.ok()) << api.status();
  ASSERT_TRUE((*api)->Create(kNodes, "", MakeNodeObject("n")).ok());
  EXPECT_EQ(cluster.server->recent_requests().back().user, "alice");
}

TEST(KubeconfigTest, GeneratedKubeconfigWithTokenWorksOverHttps) {
  Pki pki;
  FakeCluster cluster(pki.ServerOptions());
  TempDir dir;
  std::string path = dir.Write("config", cluster.server->Kubeconfig("dev-token", pki.ca.certificate));
  absl::StatusOr<ClientConfig> c = LoadKubeconfig({.paths = path});
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::unique_ptr<KubeApi>> api = NewKubeApi(*c);
  ASSERT_TRUE(api.ok());
  EXPECT_TRUE((*api)->Create(kNodes, "", MakeNodeObject("n")).ok());
  EXPECT_EQ(cluster.server->recent_requests().back().user, "token:dev-");
}

TEST(KubeconfigTest, MergesFilesFirstDefinitionWins) {
  TempDir dir;
  std::string a = dir.Write("a", R"(apiVersion: v1
kind: Config
current-context: one
clusters:
- name: c
  cluster: {server: "http://first:1"}
contexts:
- name: one
  context: {cluster: c, user: u}
users:
- name: u
  user: {token: t1}
)");
  std::string b = dir.Write("b", R"(apiVersion: v1
kind: Config
current-context: two
clusters:
- name: c
  cluster: {server: "http://second:2"}
- name: d
  cluster: {server: "http://third:3"}
contexts:
- name: two
  context: {cluster: d, user: u}
users: []
)");
  absl::StatusOr<ClientConfig> c = LoadKubeconfig({.paths = a + ":" + dir.path() + "/missing:" + b});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, "http://first:1");  // current-context from the first file that sets it
  absl::StatusOr<ClientConfig> two = LoadKubeconfig({.paths = a + ":" + b, .context = "two"});
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->server, "http://third:3");
  EXPECT_EQ(two->token, "t1");  // user u from the first file
  EXPECT_TRUE(absl::IsNotFound(LoadKubeconfig({.paths = dir.path() + "/none"}).status()));
}

TEST(KubeconfigTest, ErrorsNameTheFieldAndTheFix) {
  struct Case {
    std::string yaml;
    std::string expect;
  };
  const std::string head = "apiVersion: v1\nkind: Config\n";
  std::vector<Case> cases = {
      {"clusters: [unclosed", "not valid YAML"},
      {head + "clusters: []\ncontexts: []\nusers: []\n", "current-context"},
      {head + "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
              "cluster: {server: \"ftp://h\"}\n",
       "not an http:// or https:// URL"},
      {head +
           "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: "
           "c\n  cluster: {server: \"https://h\"}\nusers:\n- name: u\n  user:\n    exec: {command: aws}\n",
       "exec: not supported"},
      {head + "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
              "cluster: {server: \"https://h\", certificate-authority-data: \"bm90IGEgY2VydA==\"}\n",
       "not PEM"},
      {head +
           "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\nclusters:\n- name: "
           "c\n  cluster: {server: \"https://h\"}\nusers:\n- name: u\n  user: {client-certificate-data: " +
           B64("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n") + "}\n",
       "needs its key"},
      {head + "current-context: x\ncontexts:\n- name: x\n  context: {cluster: gone}\nclusters: []\n",
       "\"gone\" is not defined"},
      {head + "current-context: x\ncontexts:\n- name: x\n  context: {cluster: c}\nclusters:\n- name: c\n  "
              "cluster: {server: [a, b]}\n",
       "expected a string"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<ClientConfig> r = ParseKubeconfig(c.yaml, "/k/config", "/k");
    EXPECT_FALSE(r.ok()) << c.yaml;
    EXPECT_THAT(Msg(r.status()), HasSubstr(c.expect)) << c.yaml;
    EXPECT_THAT(Msg(r.status()), HasSubstr("/k/config")) << c.yaml;
  }
}

TEST(InClusterConfigTest, ReadsTheServiceAccountAndFollowsTokenRotation) {
  Pki pki;
  fake::FakeApiServerOptions options = pki.ServerOptions();
  options.tokens = {"sa-token-1"};
  FakeCluster cluster(options);
  TempDir sa;
  sa.Write("token", "sa-token-1\n");
  sa.Write("ca.crt", pki.ca.certificate);
  sa.Write("namespace", "tessera-system\n");
  absl::StatusOr<ClientConfig> c = LoadInClusterConfig(
      {.service_account_dir = sa.path(), .host = "127.0.0.1", .port = StrCat(cluster.server->port())});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->server, StrCat("https://127.0.0.1:", cluster.server->port()));
  EXPECT_EQ(c->default_namespace, "tessera-system");
  EXPECT_EQ(c->token_file, sa.path() + "/token");
  EXPECT_EQ(c->certificate_authority_file, sa.path() + "/ca.crt");

  absl::StatusOr<std::unique_ptr<KubeApi>> api = NewKubeApi(*c);
  ASSERT_TRUE(api.ok()) << api.status();
  ASSERT_TRUE((*api)->Create(kNodes, "", MakeNodeObject("n")).ok());
  // Objects created without a namespace go to the service account's namespace.
  absl::StatusOr<Json> cm = (*api)->Create(kConfigMaps, "", {{"metadata", {{"name", "cm"}}}});
  ASSERT_TRUE(cm.ok()) << cm.status();
  EXPECT_EQ(Namespace(*cm), "tessera-system");

  // The kubelet writes a new token and the old one stops working.
  sa.Write("token", "sa-token-2\n");
  cluster.server->SetTokens({"sa-token-2"});
  absl::StatusOr<Json> n = (*api)->Get(kNodes, "", "n");
  EXPECT_TRUE(n.ok()) << n.status();
  EXPECT_EQ(cluster.server->recent_requests().back().user, "token:sa-t");

  // A revoked token that the file does not replace: 401 is reported after one re-read.
  cluster.server->SetTokens({"other"});
  absl::Status denied = (*api)->Get(kNodes, "", "n").status();
  EXPECT_TRUE(absl::IsUnauthenticated(denied)) << denied;
}

TEST(InClusterConfigTest, ErrorsSayWhatIsMissing) {
  TempDir sa;
  absl::Status no_env =
      LoadInClusterConfig({.service_account_dir = sa.path(), .host = "", .port = ""}).status();
  EXPECT_THAT(Msg(no_env), HasSubstr("KUBERNETES_SERVICE_HOST"));
  absl::Status bad_port =
      LoadInClusterConfig({.service_account_dir = sa.path(), .host = "10.0.0.1", .port = "https"}).status();
  EXPECT_THAT(Msg(bad_port), HasSubstr("not a port number"));
  absl::Status no_token =
      LoadInClusterConfig({.service_account_dir = sa.path(), .host = "10.0.0.1", .port = "443"}).status();
  EXPECT_THAT(Msg(no_token), HasSubstr("automountServiceAccountToken"));
  sa.Write("token", "t");
  sa.Write("ca.crt", "garbage");
  absl::Status bad_ca =
      LoadInClusterConfig({.service_account_dir = sa.path(), .host = "10.0.0.1", .port = "443"}).status();
  EXPECT_THAT(Msg(bad_ca), HasSubstr("not a PEM certificate"));
  sa.Write("ca.crt", Pki().ca.certificate);
  absl::StatusOr<ClientConfig> v6 =
      LoadInClusterConfig({.service_account_dir = sa.path(), .host = "fd00::1", .port = "443"});
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->server, "https://[fd00::1]:443");
  EXPECT_EQ(v6->default_namespace, "default");
}

}  // namespace
}  // namespace tessera::k8s
