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
// The token is process-wide: set once by InitClusterAuthFromFlags (or
// SetClusterToken in tests) before any server starts or channel is made,
// read-only afterwards. No token = internal services are open.
//
// Rotation without a dip: the token file may hold several tokens, one per
// line. A process sends the first and accepts every one, so a rollout in
// three steps ("old\nnew", then "new\nold", then "new") never has two
// live processes that refuse each other (docs/operations.md).
#pragma once

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

// Reads --cluster_token_file (and the environment), sets the process token and
// warns when internal services bound on `bind_host` are open to a non-loopback
// address. A bad token file is an error: the process must not start open.
absl::Status InitClusterAuthFromFlags(const std::string& bind_host);

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

// Whether `host` is a loopback bind address (127.x, ::1, localhost).
bool IsLoopbackHost(const std::string& host);

// TLS credentials for a server from PEM files; insecure credentials when both
// paths are empty; INVALID_ARGUMENT when only one is given or a file is unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ServerTlsCredentials(
    const std::string& cert_file, const std::string& key_file);

}  // namespace pdserve
