// The cluster credential: one shared secret (the cluster token) that every
// internal call carries and every internal service checks.
//
// - gRPC: channels made by MakeChannel send "authorization: Bearer <token>"
//   on every call (a client interceptor); internal services call
//   CheckClusterCredential first and answer UNAUTHENTICATED, changing
//   nothing, when the caller's token is missing or wrong.
// - KV transfer: the sender's handshake header carries KvHandshakeDigest()
//   (SHA-256 of a fixed label and the token, so the token itself never
//   travels on the KV port); receivers refuse a header without it.
//
// The token is process-wide: set once by InitClusterAuthFromFlags (common/service/auth_flags.h; or
// SetClusterToken in tests) before any server starts or channel is made,
// read-only afterwards. No token = internal services are open.
//
// Rotation without a dip: the token file may hold several tokens, one per
// line. A process sends the first and accepts every one, so a rollout in
// three steps ("old\nnew", then "new\nold", then "new") never has two
// live processes that refuse each other (docs/operations.md).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace pdserve {

// Name of the environment variable read when --cluster_token_file is empty.
inline constexpr char kClusterTokenEnv[] = "PDSERVE_CLUSTER_TOKEN";

// The tokens of `token_file` (one per line, surrounding whitespace trimmed,
// blank lines skipped; the first is the one sent), else the one of
// $PDSERVE_CLUSTER_TOKEN, else none (no authentication). A file that is
// named but unreadable or holds no token is an error, never "open".
absl::StatusOr<std::vector<std::string>> LoadClusterTokens(const std::string& token_file);

// Sets the process token (empty: no authentication). Not thread-safe: call
// before any server or channel exists.
void SetClusterToken(std::string token);
// Sets the tokens accepted, the first being the one sent (empty: no
// authentication). Not thread-safe, as SetClusterToken.
void SetClusterTokens(std::vector<std::string> tokens);
// The token this process sends ("" when none).
const std::string& ClusterToken();

// True when `a` and `b` are equal; the time taken depends on neither's
// content (SHA-256 digests compared with CRYPTO_memcmp).
bool TokensEqual(absl::string_view a, absl::string_view b);

// OK when no token is set or `context` carries "authorization: Bearer
// <token>" with one of the accepted tokens; UNAUTHENTICATED otherwise.
// Internal services call this first.
grpc::Status CheckClusterCredential(const grpc::ServerContext& context);

// The credential a KV handshake header carries (of the token sent): 32
// bytes, or "" when no token.
std::string KvHandshakeDigest();
// OK when no token is set or `digest` is that of one of the accepted tokens;
// UNAUTHENTICATED otherwise.
absl::Status CheckKvHandshakeDigest(absl::string_view digest);

// Ids an observer cannot predict from earlier ones (KV transfer ids, which
// travel in the clear on the TCP KV port): HMAC-SHA256 of a counter under a
// random per-instance key, cut to 64 bits, never 0.
class UnpredictableIds {
 public:
  UnpredictableIds();  // a fresh random key
  uint64_t Id(uint64_t counter) const;

 private:
  std::string key_;
};

// Whether `host` is a loopback bind address (127.x, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

// Mutual TLS on the internal ports (opt-in): every internal gRPC server (the
// router's registry port, the workers' ports, the NCCL transport's control
// port) presents `cert` and requires a client certificate signed by `ca`;
// every internal channel (MakeChannel) presents `cert` and verifies the
// server's against `ca` under the name `server_name` (the certificates carry
// it as a DNS subject alternative name, so they need not name pod
// addresses). The cluster token is still sent and checked. The KV data port
// (TCP transport) stays plaintext; its handshake carries the token digest.
struct InternalTls {
  std::string cert_chain;   // PEM
  std::string private_key;  // PEM
  std::string ca;           // PEM roots that sign every process's certificate
  std::string server_name = "pdserve-internal";
  bool enabled() const { return !cert_chain.empty(); }
};
// From --internal_tls_cert_file, --internal_tls_key_file and
// --internal_tls_ca_file: all three or none (disabled); INVALID_ARGUMENT when
// only some are given or a file is unreadable or empty.
absl::StatusOr<InternalTls> LoadInternalTls(const std::string& cert_file,
                                            const std::string& key_file, const std::string& ca_file,
                                            const std::string& server_name);
// Sets the process's internal TLS; like SetClusterToken, before any server
// or channel exists.
void SetInternalTls(InternalTls tls);
const InternalTls& GetInternalTls();
// What an internal server's port uses: mutual TLS when enabled, else
// plaintext.
std::shared_ptr<grpc::ServerCredentials> InternalServerCredentials();
// What an internal channel uses: TLS with this process's certificate when
// enabled (the target name set by MakeChannel), else plaintext.
std::shared_ptr<grpc::ChannelCredentials> InternalChannelCredentials();

// TLS credentials for a server from PEM files; insecure credentials when both
// paths are empty; INVALID_ARGUMENT when only one is given or a file is unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const std::string& cert_file, const std::string& key_file);

}  // namespace pdserve
