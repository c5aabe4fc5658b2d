// The structured-output grammar a request carries to the worker that
// samples: a small JSON document (the router writes it, the worker compiles
// it against its vocabulary), so the workers need no knowledge of the
// client protocols (OpenAI response_format, tool calls) that produced it.
//
//   {"json_schema": <schema>, "strict": <bool>}  one JSON value (json_schema.h);
//                                                 "strict" is optional (false)
//   {"json_object": true}                        any JSON object
//   {"literal": "<text>"}                        exactly this (non-empty) text
//   {"sequence": [<spec>, ...]}                  one after the other
//   {"alternatives": [<spec>, ...]}              any one of them
//   {"repeat": <spec>, "min": n, "max": m,       n..m times (max absent:
//    "separator": "<text>"}                       unbounded), separated by text
//
// The output is exactly what the spec matches, then end-of-sequence.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "engine/runtime/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine::grammar {

// INVALID_ARGUMENT naming what is wrong (a JSON Schema keyword and where it
// is, for schemas).
absl::StatusOr<Grammar> CompileGrammarSpec(std::string_view spec_json);

// Spec builders (the router's side).
nlohmann::ordered_json JsonSchemaSpec(nlohmann::ordered_json schema, bool strict);
nlohmann::ordered_json JsonObjectSpec();
nlohmann::ordered_json LiteralSpec(std::string text);
nlohmann::ordered_json SequenceSpec(std::vector<nlohmann::ordered_json> items);
nlohmann::ordered_json AlternativesSpec(std::vector<nlohmann::ordered_json> items);
nlohmann::ordered_json RepeatSpec(nlohmann::ordered_json item, int min, int max /* -1: none */,
                                  std::string separator);

}  // namespace pdserve::engine::grammar
