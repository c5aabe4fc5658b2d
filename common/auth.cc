// The cluster credential; see auth.h.
#include "common/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/base/logging.h"

namespace pdserve {
namespace {

constexpr absl::string_view kBearerPrefix = "Bearer ";
constexpr absl::string_view kKvLabel = "pdserve-kv-handshake-v1";

// accepted[0] is the token sent; empty: no authentication.
std::vector<std::string>& TokenStorage() {
  static auto* tokens = new std::vector<std::string>;
  return *tokens;
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

InternalTls& TlsStorage() {
  static auto* tls = new InternalTls;
  return *tls;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> LoadClusterTokens(const std::string& token_file) {
  std::vector<std::string> tokens;
  if (!token_file.empty()) {
    absl::StatusOr<std::string> text = ReadWholeFile(token_file);
    if (!text.ok()) return text.status();
    for (absl::string_view line : absl::StrSplit(*text, '\n')) {
      line = absl::StripAsciiWhitespace(line);
      if (!line.empty()) tokens.emplace_back(line);
    }
    if (tokens.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cluster token file ", token_file, " is empty"));
    }
    return tokens;
  }
  const char* env = std::getenv(kClusterTokenEnv);
  if (env != nullptr) {
    const absl::string_view token = absl::StripAsciiWhitespace(env);
    if (!token.empty()) tokens.emplace_back(token);
  }
  return tokens;
}

absl::StatusOr<InternalTls> LoadInternalTls(const std::string& cert_file,
                                            const std::string& key_file, const std::string& ca_file,
                                            const std::string& server_name) {
  InternalTls tls;
  const int given = !cert_file.empty() + !key_file.empty() + !ca_file.empty();
  if (given == 0) return tls;
  if (given != 3) {
    return absl::InvalidArgumentError(
        "internal TLS needs --internal_tls_cert_file, --internal_tls_key_file and "
        "--internal_tls_ca_file together");
  }
  if (server_name.empty()) {
    return absl::InvalidArgumentError("--internal_tls_server_name must not be empty");
  }
  for (auto [path, out] : {std::pair{&cert_file, &tls.cert_chain},
                           std::pair{&key_file, &tls.private_key}, std::pair{&ca_file, &tls.ca}}) {
    absl::StatusOr<std::string> text = ReadWholeFile(*path);
    if (!text.ok()) return text.status();
    if (absl::StripAsciiWhitespace(*text).empty()) {
      return absl::InvalidArgumentError(absl::StrCat(*path, " is empty"));
    }
    *out = std::move(*text);
  }
  tls.server_name = server_name;
  return tls;
}

void SetInternalTls(InternalTls tls) { TlsStorage() = std::move(tls); }

const InternalTls& GetInternalTls() { return TlsStorage(); }

std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials() {
  const InternalTls& tls = GetInternalTls();
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca;
  options.pem_key_cert_pairs.push_back(
      {.private_key = tls.private_key, .cert_chain = tls.cert_chain});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> InternalChannelCredentials() {
  const InternalTls& tls = GetInternalTls();
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca;
  options.pem_private_key = tls.private_key;
  options.pem_cert_chain = tls.cert_chain;
  return grpc::SslCredentials(options);
}

void SetClusterToken(std::string token) {
  std::vector<std::string> tokens;
  if (!token.empty()) tokens.push_back(std::move(token));
  SetClusterTokens(std::move(tokens));
}

void SetClusterTokens(std::vector<std::string> tokens) {
  std::erase_if(tokens, [](const std::string& t) { return t.empty(); });
  TokenStorage() = std::move(tokens);
}

const std::string& ClusterToken() {
  static const std::string* const none = new std::string;
  const std::vector<std::string>& tokens = TokenStorage();
  return tokens.empty() ? *none : tokens.front();
}

bool TokensEqual(absl::string_view a, absl::string_view b) {
  const std::string da = Sha256(a);
  const std::string db = Sha256(b);
  return CRYPTO_memcmp(da.data(), db.data(), da.size()) == 0;
}

grpc::Status CheckClusterCredential(const grpc::ServerContext& context) {
  const std::vector<std::string>& tokens = TokenStorage();
  if (tokens.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing cluster credential");
  }
  const absl::string_view value(it->second.data(), it->second.size());
  bool match = false;
  if (absl::StartsWith(value, kBearerPrefix)) {
    // Every accepted token is compared: the time taken does not say which.
    for (const std::string& token : tokens) {
      match |= TokensEqual(value.substr(kBearerPrefix.size()), token);
    }
  }
  if (!match) return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong cluster credential");
  return grpc::Status::OK;
}

std::string KvHandshakeDigest() {
  const std::string& token = ClusterToken();
  if (token.empty()) return "";
  return Sha256(kKvLabel, token);
}

absl::Status CheckKvHandshakeDigest(absl::string_view digest) {
  const std::vector<std::string>& tokens = TokenStorage();
  if (tokens.empty()) return absl::OkStatus();
  bool match = false;
  for (const std::string& token : tokens) {
    const std::string expected = Sha256(kKvLabel, token);
    match |= digest.size() == expected.size() &&
             CRYPTO_memcmp(digest.data(), expected.data(), expected.size()) == 0;
  }
  if (!match) return absl::UnauthenticatedError("KV peer did not present the cluster credential");
  return absl::OkStatus();
}

UnpredictableIds::UnpredictableIds() : key_(32, '\0') {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(key_.data()), static_cast<int>(key_.size())) !=
      1) {
    PDSERVE_LOG(FATAL) << "no randomness for transfer ids (RAND_bytes failed)";
  }
}

uint64_t UnpredictableIds::Id(uint64_t counter) const {
  unsigned char in[8];
  for (int i = 0; i < 8; ++i) in[i] = static_cast<unsigned char>(counter >> (8 * i));
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  HMAC(EVP_sha256(), key_.data(), static_cast<int>(key_.size()), in, sizeof in, out, &size);
  uint64_t id = 0;
  for (int i = 0; i < 8; ++i) id |= uint64_t{out[i]} << (8 * i);
  return id == 0 ? 1 : id;
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
