#include "certs.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <memory>

#include "core/strings.h"

namespace tessera::fake {

namespace {

struct Free {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using KeyPtr = std::unique_ptr<EVP_PKEY, Free>;
using CertPtr = std::unique_ptr<X509, Free>;
using BioPtr = std::unique_ptr<BIO, Free>;

absl::Status OpenSslError(const char* what) {
  unsigned long e = ERR_get_error();
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return absl::InternalError(StrCat("OpenSSL: ", what, ": ", buf));
}

std::string ToPem(X509* cert) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(bio.get(), cert);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string ToPem(EVP_PKEY* key) {
  BioPtr bio(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const std::string& value) {
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
  if (ext == nullptr) return OpenSslError("extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return absl::OkStatus();
}

absl::StatusOr<std::pair<CertPtr, KeyPtr>> Make(const CertificateRequest& req, X509* ca_cert,
                                                EVP_PKEY* ca_key, bool is_ca) {
  static std::atomic<long> serial{1000};
  KeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslError("key generation");
  CertPtr cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial++);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 365L * 24 * 3600);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  for (const std::string& o : req.organizations) {
    X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(o.c_str()), -1,
                               -1, 0);
  }
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(req.common_name.c_str()), -1, -1, 0);
  X509* issuer = ca_cert != nullptr ? ca_cert : cert.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer));
  absl::Status s =
      AddExtension(cert.get(), issuer, NID_basic_constraints, is_ca ? "critical,CA:TRUE" : "CA:FALSE");
  if (s.ok()) {
    s = AddExtension(cert.get(), issuer, NID_key_usage,
                     is_ca ? "critical,keyCertSign,cRLSign" : "critical,digitalSignature,keyEncipherment");
  }
  if (s.ok()) s = AddExtension(cert.get(), issuer, NID_subject_key_identifier, "hash");
  if (s.ok() && !is_ca) {
    s = AddExtension(cert.get(), issuer, NID_ext_key_usage, req.client ? "clientAuth" : "serverAuth");
  }
  std::vector<std::string> sans;
  for (const std::string& d : req.dns_names) sans.push_back("DNS:" + d);
  for (const std::string& ip : req.ips) sans.push_back("IP:" + ip);
  if (s.ok() && !sans.empty()) s = AddExtension(cert.get(), issuer, NID_subject_alt_name, StrJoin(sans, ","));
  if (!s.ok()) return s;
  if (X509_sign(cert.get(), ca_key != nullptr ? ca_key : key.get(), EVP_sha256()) == 0) {
    return OpenSslError("signing");
  }
  return std::make_pair(std::move(cert), std::move(key));
}

}  // namespace

absl::StatusOr<Pem> MakeCa(const std::string& common_name) {
  CertificateRequest req;
  req.common_name = common_name;
  auto made = Make(req, nullptr, nullptr, /*is_ca=*/true);
  if (!made.ok()) return made.status();
  return Pem{ToPem(made->first.get()), ToPem(made->second.get())};
}

absl::StatusOr<Pem> IssueCertificate(const Pem& ca, const CertificateRequest& request) {
  BioPtr cbio(BIO_new_mem_buf(ca.certificate.data(), static_cast<int>(ca.certificate.size())));
  CertPtr ca_cert(PEM_read_bio_X509(cbio.get(), nullptr, nullptr, nullptr));
  BioPtr kbio(BIO_new_mem_buf(ca.private_key.data(), static_cast<int>(ca.private_key.size())));
  KeyPtr ca_key(PEM_read_bio_PrivateKey(kbio.get(), nullptr, nullptr, nullptr));
  if (!ca_cert || !ca_key) return absl::InvalidArgumentError("the CA certificate or key is not PEM");
  auto made = Make(request, ca_cert.get(), ca_key.get(), /*is_ca=*/false);
  if (!made.ok()) return made.status();
  return Pem{ToPem(made->first.get()), ToPem(made->second.get())};
}

}  // namespace tessera::fake
