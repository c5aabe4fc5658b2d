// Structured output in tests that run the engine, a cluster or a runner
// without the Ajv validator (tests/openai_client): a JSON Schema whose
// shortest value is long enough for a constrained stream to be preempted or
// migrated in the middle, the grammar spec the router sends for it, its
// constraint over a model's tokenizer, and a check of a reply against the
// schema that shares no code with the grammar. The schema holds no free
// strings or numbers, so every value the grammar allows is one nlohmann
// parses (a free string may carry a lone \uD800 escape, which it refuses).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/model/config.h"
#include "engine/runtime/grammar/grammar_spec.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/types/sampling_params.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::testing {

// An object with a boolean, an array of at least `min_tags` tags (an enum
// with an escaped quote, through $defs/$ref) and an optional anyOf.
inline nlohmann::ordered_json LongSchema(int min_tags) {
  return nlohmann::ordered_json::parse(absl::StrCat(R"({
    "type": "object",
    "properties": {
      "ok": {"type": "boolean"},
      "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": )",
                                                    min_tags, R"(},
      "extra": {"anyOf": [{"type": "null"},
                          {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}]}
    },
    "required": ["ok", "tags"],
    "additionalProperties": false,
    "$defs": {"tag": {"enum": ["red", "gr\"een", "blue"]}}
  })"));
}

// The spec the router sends for `schema` (frontend/structured_output.cc).
inline std::string SpecOf(const nlohmann::ordered_json& schema) {
  return engine::grammar::JsonSchemaSpec(schema, /*strict=*/true).dump();
}

// `params` with `spec` compiled by `compiler`, as a worker compiles it
// (each call: a constraint of its own). A spec that does not compile fails
// the test.
inline engine::SamplingParams Constrained(engine::SamplingParams params,
                                          engine::grammar::GrammarCompiler& compiler,
                                          const std::string& spec) {
  params.grammar_spec = spec;
  auto constraint = compiler.Compile(spec);
  EXPECT_TRUE(constraint.ok()) << constraint.status();
  if (constraint.ok()) params.constraint = *std::move(constraint);
  return params;
}

// The text of `tokens` (special tokens, the end of sequence among them,
// have no bytes).
inline std::string TextOf(const engine::grammar::TokenVocabulary& vocab,
                          std::span<const int32_t> tokens) {
  std::string text;
  for (int32_t t : tokens) {
    if (t >= 0 && t < vocab.size()) text += vocab.bytes(t);
  }
  return text;
}

// Where `value` breaks `schema` ("" when it validates), for the keywords
// LongSchema uses: type (object, array, boolean, null), properties,
// required, additionalProperties false, items, minItems, maxItems, enum,
// anyOf, and $ref to #/$defs/<name> of `root` (objects are closed: every
// member must be a listed property). A schema missing what its keywords
// need throws (the test fails).
inline std::string SchemaViolation(const nlohmann::ordered_json& root,
                                   const nlohmann::ordered_json& schema,
                                   const nlohmann::ordered_json& value,
                                   const std::string& at = "$") {
  if (schema.contains("$ref")) {
    const std::string ref = schema.at("$ref");
    const std::string prefix = "#/$defs/";
    if (ref.rfind(prefix, 0) != 0) return absl::StrCat(at, ": unsupported $ref ", ref);
    return SchemaViolation(root, root.at("$defs").at(ref.substr(prefix.size())), value, at);
  }
  if (schema.contains("anyOf")) {
    for (const auto& option : schema.at("anyOf")) {
      if (SchemaViolation(root, option, value, at).empty()) return "";
    }
    return absl::StrCat(at, ": matches no anyOf option: ", value.dump());
  }
  if (schema.contains("enum")) {
    for (const auto& option : schema.at("enum")) {
      if (option == value) return "";
    }
    return absl::StrCat(at, ": not in the enum: ", value.dump());
  }
  const std::string type = schema.value("type", "");
  if (type == "boolean") {
    return value.is_boolean() ? "" : absl::StrCat(at, ": not a boolean: ", value.dump());
  }
  if (type == "null") {
    return value.is_null() ? "" : absl::StrCat(at, ": not null: ", value.dump());
  }
  if (type == "array") {
    if (!value.is_array()) return absl::StrCat(at, ": not an array: ", value.dump());
    if (value.size() < schema.value("minItems", size_t{0})) {
      return absl::StrCat(at, ": fewer than minItems: ", value.size());
    }
    if (value.size() > schema.value("maxItems", value.size())) {
      return absl::StrCat(at, ": more than maxItems: ", value.size());
    }
    for (size_t i = 0; i < value.size(); ++i) {
      std::string why =
          SchemaViolation(root, schema.at("items"), value[i], absl::StrCat(at, "[", i, "]"));
      if (!why.empty()) return why;
    }
    return "";
  }
  if (type == "object") {
    if (!value.is_object()) return absl::StrCat(at, ": not an object: ", value.dump());
    const nlohmann::ordered_json none = nlohmann::ordered_json::array();
    for (const auto& name : schema.contains("required") ? schema.at("required") : none) {
      if (!value.contains(name.get<std::string>()))
        return absl::StrCat(at, ": lacks ", name.dump());
    }
    for (const auto& [name, member] : value.items()) {
      const nlohmann::ordered_json& properties = schema.at("properties");
      if (!properties.contains(name)) return absl::StrCat(at, ": extra property ", name);
      std::string why =
          SchemaViolation(root, properties.at(name), member, absl::StrCat(at, ".", name));
      if (!why.empty()) return why;
    }
    return "";
  }
  return absl::StrCat(at, ": unsupported schema ", schema.dump());
}

// Where `text` fails to be a value of `schema` ("" when it parses and
// validates).
inline std::string ReplyViolation(const nlohmann::ordered_json& schema, const std::string& text) {
  const auto value = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) return absl::StrCat("does not parse: ", text);
  std::string why = SchemaViolation(schema, schema, value);
  return why.empty() ? "" : absl::StrCat(why, " in ", text);
}

}  // namespace pdserve::testing
