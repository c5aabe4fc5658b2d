// Builds KV transports by kind. Built in: "tcp". "nccl" and "cuda_ipc" are
// named by the design but are not part of this binary yet; asking for them
// (or anything else) is INVALID_ARGUMENT.
//
// Endpoints name their transport by scheme: "tcp://host:port" is kind "tcp".
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kvtransfer/transport.h"

namespace pdserve::kvtransfer {

// A receiver of `kind` listening on `bind_host`:`port` (0 = any free port).
absl::StatusOr<std::unique_ptr<KvReceiver>> CreateKvReceiver(const std::string& kind,
                                                             const std::string& bind_host,
                                                             int port);
absl::StatusOr<std::unique_ptr<KvSender>> CreateKvSender(const std::string& kind);

// The kind an endpoint's scheme names ("tcp" for "tcp://..."); INVALID_ARGUMENT
// if it has no "scheme://" prefix. The kind may still not be built in.
absl::StatusOr<std::string> TransportKindOf(absl::string_view endpoint);

// A sender for any built-in kind: each Open() picks the transport by the
// endpoint's scheme, creating one underlying sender per kind on first use.
// Open() is thread-safe. An endpoint of a kind not built in fails Open() with
// INVALID_ARGUMENT.
std::unique_ptr<KvSender> CreateKvSenderForAnyEndpoint();

}  // namespace pdserve::kvtransfer
