// pdserve.v1 protobuf <-> the front end's native structs, for the gRPC
// adapter (frontend/grpc_service.h). Decoding takes the request's raw bytes:
// protobuf refuses a string field holding invalid UTF-8 without saying
// which, so the bytes are checked first and such a request is
// INVALID_ARGUMENT naming the field ("chat.messages[1].content"). No I/O.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "frontend/request.h"
#include "frontend/request_session.h"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::frontend {

// Wire bytes -> message. INVALID_ARGUMENT naming the first string field
// that is not valid UTF-8, or saying the bytes are no GenerateRequest.
absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view bytes);

// Message -> native request, with the gRPC field names. proto3 defaults are
// read as the API documents them (top_p and repetition_penalty 0 mean off).
absl::StatusOr<Request> RequestFromProto(const v1::GenerateRequest& request);

// ParseGenerateRequest, then RequestFromProto.
absl::StatusOr<Request> DecodeGenerateRequest(std::string_view bytes);

// One response message for `delta`.
v1::GenerateResponse DeltaToProto(const Delta& delta, const std::string& request_id);

}  // namespace pdserve::frontend
