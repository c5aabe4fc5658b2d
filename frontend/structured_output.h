// Structured output at the front door: each protocol's way of asking for it
// (OpenAI response_format, pdserve.v1 SamplingParams.response_format) turned
// into the grammar spec the workers compile (engine/runtime/grammar/
// grammar_spec.h), and the spec checked once here, so a schema the grammar
// cannot enforce is a 400 naming the keyword before any worker is asked.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/types/sampling_params.h"
#include "frontend/request.h"
#include "nlohmann/json.hpp"
#include "pdserve/v1/generation.pb.h"

namespace pdserve::frontend {

// OpenAI's response_format object: {"type": "text"} -> "" (no grammar),
// {"type": "json_object"}, {"type": "json_schema", "json_schema": {"name",
// "schema", "strict", "description"}}. INVALID_ARGUMENT naming the field.
absl::StatusOr<std::string> OpenAiResponseFormatSpec(const nlohmann::ordered_json& format);

// pdserve.v1.ResponseFormat (unset: ""). The schema is JSON text;
// INVALID_ARGUMENT naming `field` when it does not parse.
absl::StatusOr<std::string> ProtoResponseFormatSpec(const v1::ResponseFormat& format,
                                                    const std::string& field);

// Checks params.grammar_spec (if any): it compiles (else INVALID_ARGUMENT
// naming names.response_format and what the grammar refused, e.g. the
// unsupported keyword and where it is), and max_tokens leaves room for the
// shortest output it allows (names.max_tokens).
absl::Status ValidateStructuredOutput(const engine::SamplingParams& params,
                                      const FieldNames& names);

}  // namespace pdserve::frontend
