// The flags of cluster authentication; see auth_flags.h.
#include "common/service/auth_flags.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/auth.h"
#include "common/base/logging.h"

ABSL_FLAG(std::string, cluster_token_file, "",
          "File holding the cluster token that internal calls (worker registration, prefill, "
          "decode, KV handshakes) carry and check; several lines: the first is sent, every one "
          "accepted (rotation); empty: $PDSERVE_CLUSTER_TOKEN, else none (internal services "
          "open)");

ABSL_FLAG(std::string, internal_tls_cert_file, "",
          "PEM certificate chain this process presents on its internal ports and channels "
          "(mutual TLS, with --internal_tls_key_file and --internal_tls_ca_file); empty: "
          "internal gRPC in plaintext");
ABSL_FLAG(std::string, internal_tls_key_file, "", "PEM private key of --internal_tls_cert_file");
ABSL_FLAG(std::string, internal_tls_ca_file, "",
          "PEM CA certificates that sign every cluster process's internal certificate");
ABSL_FLAG(std::string, internal_tls_server_name, "pdserve-internal",
          "Name internal certificates carry (DNS subject alternative name) and channels verify");

namespace pdserve {

absl::Status InitClusterAuthFromFlags(const std::string& bind_host) {
  absl::StatusOr<std::vector<std::string>> tokens =
      LoadClusterTokens(absl::GetFlag(FLAGS_cluster_token_file));
  if (!tokens.ok()) return tokens.status();
  absl::StatusOr<InternalTls> tls = LoadInternalTls(
      absl::GetFlag(FLAGS_internal_tls_cert_file), absl::GetFlag(FLAGS_internal_tls_key_file),
      absl::GetFlag(FLAGS_internal_tls_ca_file), absl::GetFlag(FLAGS_internal_tls_server_name));
  if (!tls.ok()) return tls.status();
  if (tls->enabled()) {
    PDSERVE_LOG(INFO) << "internal gRPC over mutual TLS (server name " << tls->server_name << ")";
  }
  SetInternalTls(std::move(*tls));
  if (tokens->empty() && !IsLoopbackHost(bind_host)) {
    PDSERVE_LOG(WARNING) << "no cluster token (--cluster_token_file, $" << kClusterTokenEnv
                         << "): internal services on " << bind_host
                         << " accept calls from anyone who can reach them";
  }
  if (tokens->size() > 1) {
    PDSERVE_LOG(INFO) << "cluster token file holds " << tokens->size()
                      << " tokens: sending the first, accepting all (rotation)";
  }
  SetClusterTokens(std::move(*tokens));
  return absl::OkStatus();
}

}  // namespace pdserve
