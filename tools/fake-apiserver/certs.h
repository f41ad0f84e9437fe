// Test certificates made with OpenSSL at run time: a CA, and server or client certificates it signs, as PEM.
//
//   absl::StatusOr<Pem> ca = MakeCa("tessera test CA");
//   absl::StatusOr<Pem> server = IssueCertificate(*ca, {.common_name = "fake-apiserver",
//                                                       .dns_names = {"localhost"}, .ips = {"127.0.0.1"}});
//   absl::StatusOr<Pem> user = IssueCertificate(*ca, {.common_name = "alice", .organizations = {"dev"},
//                                                     .client = true});
//
// Keys are ECDSA P-256; certificates are valid from an hour ago for a year.
// Thread-safety: pure functions.
#ifndef TESSERA_TOOLS_FAKE_APISERVER_CERTS_H_
#define TESSERA_TOOLS_FAKE_APISERVER_CERTS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tessera::fake {

struct Pem {
  std::string certificate;
  std::string private_key;
};

struct CertificateRequest {
  std::string common_name;                 // a client certificate's user name
  std::vector<std::string> organizations;  // a client certificate's groups
  std::vector<std::string> dns_names;
  std::vector<std::string> ips;
  bool client = false;  // extendedKeyUsage clientAuth instead of serverAuth
};

absl::StatusOr<Pem> MakeCa(const std::string& common_name);
absl::StatusOr<Pem> IssueCertificate(const Pem& ca, const CertificateRequest& request);

}  // namespace tessera::fake

#endif  // TESSERA_TOOLS_FAKE_APISERVER_CERTS_H_
