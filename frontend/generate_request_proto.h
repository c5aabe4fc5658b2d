// pdserve.v1 protobuf <-> the front end's native structs, for the gRPC
// adapter (frontend/grpc_service.h). Decoding takes the request's raw bytes:
// protobuf refuses a string field holding invalid UTF-8 without saying
// which, so the bytes are checked first and such a request is
// INVALID_ARGUMENT naming the field ("chat.messages[1].content"), and every
// repeated field is counted against its limit (frontend/request_limits.h)
// before the message is parsed, so an oversized list costs no memory. No I/O.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/request.h"
#include "frontend/request_session.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::frontend {

struct DecodeLimits {
  // Most prompt token ids (the model's context); 0: not checked here.
  int max_prompt_token_ids = 0;
};

// The most entries the repeated field `field` of pdserve.v1 may hold;
// nullopt for none (the token ids when `limits` sets none).
std::optional<int> WireLimit(const google::protobuf::FieldDescriptor& field,
                             const DecodeLimits& limits);

// Wire bytes -> message. INVALID_ARGUMENT naming the first string field
// that is not valid UTF-8, a repeated field over its limit
// ("sampling.stop_token_ids holds 5000 entries; at most 1024"; prompt ids
// beyond the context are named "input", as validation names them), or
// saying the bytes are no GenerateRequest.
absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view bytes,
                                                         const DecodeLimits& limits = {});

// Message -> native request, with the gRPC field names. proto3 defaults are
// read as the API documents them (top_p and repetition_penalty 0 mean off).
absl::StatusOr<Request> RequestFromProto(const v1::GenerateRequest& request);

// ParseGenerateRequest, then RequestFromProto.
absl::StatusOr<Request> DecodeGenerateRequest(std::string_view bytes,
                                              const DecodeLimits& limits = {});

// One response message for `delta`.
v1::GenerateResponse DeltaToProto(const Delta& delta, const std::string& request_id);

}  // namespace pdserve::frontend
