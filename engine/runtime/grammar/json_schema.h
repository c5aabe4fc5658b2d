// JSON Schema -> grammar rules for the JSON text of a matching value.
//
// Supported: boolean schemas; type (string, number, integer, boolean,
// null, object, array, or a list of them); enum and const (any JSON
// values); properties in schema order with required and optional ones;
// additionalProperties (false, true or a schema); items, prefixItems (and
// the older items-as-array form with additionalItems), minItems and
// maxItems (up to kMaxItemsBound); anyOf, oneOf (as anyOf: exclusivity is
// not enforced), allOf with one schema; $ref to any local JSON pointer
// ("#", "#/$defs/Name", "#/definitions/Name", ...), recursion included.
// Annotations (title, description, default, examples, $schema, $id,
// $comment, deprecated, readOnly, writeOnly, ...) and unknown keywords are
// ignored, as JSON Schema says. Known assertion keywords that the grammar
// does not enforce (pattern, format, minLength, minimum, uniqueItems, not,
// if/then/else, ...) are refused with INVALID_ARGUMENT naming the keyword
// and where it is, rather than ignored: the output must validate.
//
// The text produced is compact JSON with at most one space after ':' and
// ',' (so a model cannot run off into whitespace); object properties come
// in the schema's order, additional ones after them with keys of printable
// ASCII that are none of the declared names; numbers have at most 16
// integer and 16 fraction digits and a two-digit exponent (always finite
// doubles); strings are valid UTF-8 with JSON's escapes.
//
// `strict` (OpenAI's json_schema.strict): objects without
// additionalProperties take no further properties, as OpenAI's strict mode
// requires them to say; without strict they follow JSON Schema (any
// further property allowed).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "engine/runtime/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine::grammar {

inline constexpr int kMaxItemsBound = 1024;

class JsonSchemaCompiler {
 public:
  explicit JsonSchemaCompiler(GrammarBuilder& builder) : b_(builder) {}

  // A rule matching the JSON text of values valid against `schema`, whose
  // $refs resolve within `schema` itself. `schema` must outlive the call.
  absl::StatusOr<int32_t> CompileSchema(const nlohmann::ordered_json& schema, bool strict);
  // A rule matching any JSON object.
  int32_t AnyObjectRule();

 private:
  using Json = nlohmann::ordered_json;
  absl::StatusOr<Expr> Value(const Json& s, const std::string& path, int depth);
  absl::StatusOr<Expr> ObjectExpr(const Json& s, const std::string& path, int depth);
  absl::StatusOr<Expr> ArrayExpr(const Json& s, const std::string& path, int depth);
  absl::StatusOr<int32_t> RefRule(const std::string& ref, const std::string& path, int depth);
  absl::StatusOr<int32_t> ItemRule(const Json& s, const std::string& path, int depth);
  int32_t Builtin(const std::string& name);
  int32_t AdditionalKeyRule(const std::vector<std::string>& declared);
  absl::Status Limit();

  GrammarBuilder& b_;
  const Json* root_ = nullptr;
  bool strict_ = false;
  std::map<std::string, int32_t> builtins_;
  std::map<std::string, int32_t> refs_;  // JSON pointer -> rule
  int64_t expr_budget_ = 0;
};

}  // namespace pdserve::engine::grammar
