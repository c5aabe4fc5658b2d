// Grammar specs (see grammar_spec.h).
#include "engine/runtime/grammar/grammar_spec.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/runtime/grammar/json_schema.h"

namespace pdserve::engine::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Grammars larger than this are refused (their masks would cost too much
// memory and compile time for one request).
constexpr int32_t kMaxNodes = 200000;
constexpr int kMaxSpecDepth = 16;

class SpecCompiler {
 public:
  absl::StatusOr<Expr> Compile(const Json& spec, int depth) {
    if (depth > kMaxSpecDepth) return Error("nested too deeply");
    if (!spec.is_object()) return Error("each part must be an object");
    if (spec.contains("json_schema")) {
      const Json& strict = spec.contains("strict") ? spec["strict"] : Json(false);
      if (!strict.is_boolean()) return Error("\"strict\" must be a boolean");
      // The compiler keeps pointers into the schema: it lives as long as this.
      schemas_.push_back(std::make_unique<Json>(spec["json_schema"]));
      absl::StatusOr<int32_t> rule = schema_.CompileSchema(*schemas_.back(), strict.get<bool>());
      if (!rule.ok()) return rule.status();
      return Expr::Call(*rule);
    }
    if (spec.contains("json_object")) return Expr::Call(schema_.AnyObjectRule());
    if (spec.contains("literal")) {
      if (!spec["literal"].is_string() || spec["literal"].get<std::string>().empty()) {
        return Error("\"literal\" must be a non-empty string");
      }
      return Expr::Literal(spec["literal"].get<std::string>());
    }
    for (const char* key : {"sequence", "alternatives"}) {
      if (!spec.contains(key)) continue;
      const Json& list = spec[key];
      if (!list.is_array() || list.empty())
        return Error(absl::StrCat("\"", key, "\" must be a non-empty array"));
      std::vector<Expr> items;
      for (const Json& item : list) {
        absl::StatusOr<Expr> e = Compile(item, depth + 1);
        if (!e.ok()) return e.status();
        items.push_back(*std::move(e));
      }
      return std::string_view(key) == "sequence" ? Expr::Seq(std::move(items))
                                                 : Expr::Alt(std::move(items));
    }
    if (spec.contains("repeat")) {
      absl::StatusOr<Expr> item = Compile(spec["repeat"], depth + 1);
      if (!item.ok()) return item.status();
      const Json min = spec.value("min", Json(0));
      const Json max = spec.value("max", Json(-1));
      const Json sep = spec.value("separator", Json(""));
      if (!min.is_number_integer() || !max.is_number_integer() || !sep.is_string() ||
          min.get<int>() < 0 || min.get<int>() > 64 || max.get<int>() > 64 ||
          (max.get<int>() >= 0 && max.get<int>() < std::max(min.get<int>(), 1))) {
        return Error("\"repeat\" needs 0 <= min <= max <= 64 (max >= 1) and a string separator");
      }
      const int lo = min.get<int>(), hi = max.get<int>();
      const Expr separated = Expr::Seq({Expr::Literal(sep.get<std::string>()), *item});
      // item (sep item){lo-1, hi-1}, optional as a whole when lo == 0.
      const Expr body =
          Expr::Seq({*item, Expr::Repeat(separated, std::max(lo - 1, 0), hi < 0 ? -1 : hi - 1)});
      return lo == 0 ? Expr::Optional(body) : body;
    }
    return Error(
        "unknown part (expected json_schema, json_object, literal, sequence, alternatives or "
        "repeat)");
  }

  GrammarBuilder& builder() { return builder_; }

 private:
  static absl::Status Error(const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("grammar spec: ", what));
  }

  GrammarBuilder builder_;
  JsonSchemaCompiler schema_{builder_};
  std::vector<std::unique_ptr<Json>> schemas_;
};

}  // namespace

absl::StatusOr<Grammar> CompileGrammarSpec(std::string_view spec_json) {
  Json spec = Json::parse(spec_json, nullptr, /*allow_exceptions=*/false);
  if (spec.is_discarded()) return absl::InvalidArgumentError("grammar spec: not valid JSON");
  SpecCompiler compiler;
  absl::StatusOr<Expr> body = compiler.Compile(spec, 0);
  if (!body.ok()) return body.status();
  GrammarBuilder& b = compiler.builder();
  const int32_t root = b.AddRule("output");
  b.SetBody(root, *std::move(body));
  absl::StatusOr<Grammar> g = b.Build(root);
  if (!g.ok()) return g.status();
  if (g->num_nodes() > kMaxNodes) {
    return absl::InvalidArgumentError(absl::StrCat("grammar spec: the grammar has ", g->num_nodes(),
                                                   " states, more than ", kMaxNodes));
  }
  return g;
}

Json JsonSchemaSpec(Json schema, bool strict) {
  Json j = Json::object();
  j["json_schema"] = std::move(schema);
  j["strict"] = strict;
  return j;
}

Json JsonObjectSpec() { return Json{{"json_object", true}}; }

Json LiteralSpec(std::string text) { return Json{{"literal", std::move(text)}}; }

Json SequenceSpec(std::vector<Json> items) {
  Json j = Json::object();
  j["sequence"] = Json(std::move(items));
  return j;
}

Json AlternativesSpec(std::vector<Json> items) {
  Json j = Json::object();
  j["alternatives"] = Json(std::move(items));
  return j;
}

Json RepeatSpec(Json item, int min, int max, std::string separator) {
  Json j = Json::object();
  j["repeat"] = std::move(item);
  j["min"] = min;
  if (max >= 0) j["max"] = max;
  j["separator"] = std::move(separator);
  return j;
}

}  // namespace pdserve::engine::grammar
