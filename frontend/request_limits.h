// How many entries each list of a client request may hold, on every API
// (gRPC pdserve.v1, OpenAI HTTP). A request over a limit is refused with
// INVALID_ARGUMENT (HTTP 400) naming the field, as early as its protocol
// allows (gRPC: from the wire bytes, before the message is parsed). The
// token ids of a prompt are bounded by the model's context instead, and the
// body or message as a whole by the server's size limit (64 MiB).
// docs/architecture.md ("Request fields and their limits") lists them for
// clients; the reasons: docs/decisions/limits.md.
#pragma once

#include <cstddef>

#include "engine/types/sampling_params.h"

namespace pdserve::frontend {

inline constexpr int kMaxStopStrings = 16;
inline constexpr size_t kMaxStopStringBytes = 256;
inline constexpr int kMaxStopTokenIds = engine::kMaxStopTokenIds;  // 1024
inline constexpr int kMaxChatMessages = 1024;
inline constexpr int kMaxChatTemplateKwargs = 16;
// OpenAI's own limit on a request's tools.
inline constexpr int kMaxTools = 128;
inline constexpr int kMaxToolCallsPerMessage = 128;
// Text parts of one chat message's content.
inline constexpr int kMaxContentParts = 256;
inline constexpr size_t kMaxIdBytes = 256;  // request_id, user

}  // namespace pdserve::frontend
