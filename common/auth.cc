// The cluster credential; see auth.h.
#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/logging.h"

ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster token that internal calls (worker registration, prefill, "
          "decode, KV handshakes) carry and check; empty: $PDSERVE_CLUSTER_TOKEN, else none "
          "(internal services open)");

namespace pdserve {
namespace {

constexpr absl::string_view kBearerPrefix = "Bearer ";
constexpr absl::string_view kKvLabel = "pdserve-kv-handshake-v1";

std::string& TokenStorage() {
  static std::string* token = new std::string;
  return *token;
}

std::string Sha256(absl::string_view a, absl::string_view b = {}) {
  const std::string text = absl::StrCat(a, b);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), out, &size, EVP_sha256(), nullptr);
  return std::string(reinterpret_cast<const char*>(out), size);
}

absl::StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

absl::StatusOr<std::string> LoadClusterToken(const std::string& token_file) {
  std::string token;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadWholeFile(token_file);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripTrailingAsciiWhitespace(*text));
    if (token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster token file ", token_file, " is empty"));
    }
    return token;
  }
  const char* env = std::getenv(kClusterTokenEnv);
  if (env != nullptr) token = std::string(absl::StripTrailingAsciiWhitespace(env));
  return token;
}

absl::Status InitClusterAuthFromFlags(const std::string& bind_host) {
  absl::StatusOr<std::string> token = LoadClusterToken(absl::GetFlag(FLAGS_cluster_token_file));
  if (!token.ok()) return token.status();
  if (token->empty() && !IsLoopbackHost(bind_host)) {
    PDSERVE_LOG(WARNING) << "no cluster token (--cluster_token_file, $" << kClusterTokenEnv
                         << "): internal services on " << bind_host
                         << " accept calls from anyone who can reach them";
  }
  SetClusterToken(std::move(*token));
  return absl::OkStatus();
}

void SetClusterToken(std::string token) { TokenStorage() = std::move(token); }

const std::string& ClusterToken() { return TokenStorage(); }

bool TokensEqual(absl::string_view a, absl::string_view b) {
  const std::string da = Sha256(a);
  const std::string db = Sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

grpc::Status CheckClusterCredential(const grpc::ServerContext& context) {
  const std::string& token = ClusterToken();
  if (token.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing cluster credential");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  if (!absl::StartsWith(value, kBearerPrefix) ||
      !TokensEqual(value.substr(kBearerPrefix.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong cluster credential");
  }
  return grpc::Status::OK;
}

std::string KvHandshakeDigest() {
  const std::string& token = ClusterToken();
  if (token.empty()) return "";
  return Sha256(kKvLabel, token);
}

absl::Status CheckKvHandshakeDigest(absl::string_view digest) {
  const std::string expected = KvHandshakeDigest();
  if (expected.empty()) return absl::OkStatus();
  if (digest.size() != expected.size() ||
      CRYPTO_memcmp(digest.data(), expected.data(), expected.size()) != 0) {
    return absl::UnauthenticatedError("KV peer did not present the cluster credential");
  }
  return absl::OkStatus();
}

bool IsLoopbackHost(const std::string& host) {
  return absl::StartsWith(host, "127.") || host == "::1" || host == "[::1]" || host == "localhost";
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const std::string& cert_file, const std::string& key_file) {
  if (cert_file.empty() && key_file.empty()) return grpc::InsecureServerCredentials();
  if (cert_file.empty() || key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate and a key file");
  }
  absl::StatusOr<std::string> cert = ReadWholeFile(cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadWholeFile(key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions options;
  options.pem_key_cert_pairs.push_back({.private_key = *key, .cert_chain = *cert});
  return grpc::SslServerCredentials(options);
}

}  // namespace pdserve
