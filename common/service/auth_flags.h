// The flags of cluster authentication (the cluster token and internal
// mutual TLS), one flag group for every service's main; the credential
// itself is common/auth.h.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace pdserve {

// Reads --cluster_token_file (and the environment) and the --internal_tls_*
// flags, sets the process token and internal TLS, and warns when internal
// services bound on `bind_host` are open to a non-loopback address. A bad
// token file or TLS file is an error: the process must not start open.
absl::Status InitClusterAuthFromFlags(const std::string& bind_host);

}  // namespace pdserve
