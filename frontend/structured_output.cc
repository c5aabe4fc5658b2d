// Structured output at the front door (see structured_output.h).
#include "frontend/structured_output.h"

#include "absl/strings/str_cat.h"
#include "engine/runtime/grammar/grammar_spec.h"
#include "frontend/errors.h"

namespace pdserve::frontend {
namespace {
using Json = nlohmann::ordered_json;
}  // namespace

absl::StatusOr<std::string> OpenAiResponseFormatSpec(const Json& format) {
  if (!format.is_object()) return FieldError("response_format", " must be an object");
  const auto type_it = format.find("type");
  if (type_it == format.end() || !type_it->is_string()) {
    return FieldError("response_format.type",
                      " must be \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string type = type_it->get<std::string>();
  if (type == "text") return std::string();
  if (type == "json_object") return engine::grammar::JsonObjectSpec().dump();
  if (type != "json_schema") {
    return FieldError("response_format.type",
                      absl::StrCat(" must be \"text\", \"json_object\" or \"json_schema\", got \"",
                                   type.substr(0, 32), "\""));
  }
  const auto js = format.find("json_schema");
  if (js == format.end() || !js->is_object()) {
    return FieldError("response_format.json_schema", " must be an object with a \"schema\"");
  }
  bool strict = false;
  if (const auto s = js->find("strict"); s != js->end() && !s->is_null()) {
    if (!s->is_boolean())
      return FieldError("response_format.json_schema.strict", " must be true or false");
    strict = s->get<bool>();
  }
  const auto schema = js->find("schema");
  if (schema == js->end() || !(schema->is_object() || schema->is_boolean())) {
    return FieldError("response_format.json_schema.schema", " must be a JSON Schema object");
  }
  return engine::grammar::JsonSchemaSpec(*schema, strict).dump();
}

absl::StatusOr<std::string> ProtoResponseFormatSpec(const v1::ResponseFormat& format,
                                                    const std::string& field) {
  switch (format.format_case()) {
    case v1::ResponseFormat::FORMAT_NOT_SET:
      return std::string();
    case v1::ResponseFormat::kJsonObject:
      return format.json_object() ? engine::grammar::JsonObjectSpec().dump() : std::string();
    case v1::ResponseFormat::kJsonSchema: {
      const Json schema = Json::parse(format.json_schema().schema(), nullptr, false);
      if (schema.is_discarded() || !(schema.is_object() || schema.is_boolean())) {
        return FieldError(absl::StrCat(field, ".json_schema.schema"),
                          " must be a JSON Schema object as JSON text");
      }
      return engine::grammar::JsonSchemaSpec(schema, format.json_schema().strict()).dump();
    }
  }
  return std::string();
}

absl::Status ValidateStructuredOutput(const engine::SamplingParams& params,
                                      const FieldNames& names) {
  if (params.grammar_spec.empty()) return absl::OkStatus();
  absl::StatusOr<engine::grammar::Grammar> g =
      engine::grammar::CompileGrammarSpec(params.grammar_spec);
  if (!g.ok()) return FieldError(names.response_format, absl::StrCat(": ", g.status().message()));
  // The shortest output, then its end-of-sequence token.
  if (params.max_tokens < g->MinLength() + 1) {
    return FieldError(
        names.max_tokens,
        absl::StrCat(": the response format's shortest output and its end need up to ",
                     g->MinLength() + 1, " tokens; got ", params.max_tokens));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::frontend
