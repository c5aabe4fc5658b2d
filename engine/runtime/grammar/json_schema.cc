// JSON Schema -> grammar (see json_schema.h).
#include "engine/runtime/grammar/json_schema.h"

#include <algorithm>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pdserve::engine::grammar {
namespace {

using Json = nlohmann::ordered_json;

// Upper bound on Value() calls per compile: a schema that expands further
// is refused rather than compiled into a grammar too large to serve.
constexpr int64_t kExprBudget = 20000;
constexpr int kMaxDepth = 64;

// Keywords that constrain values but that the grammar does not enforce.
const std::set<std::string, std::less<>>& UnsupportedKeywords() {
  static const auto* k = new std::set<std::string, std::less<>>{"pattern",
                                                                "format",
                                                                "minLength",
                                                                "maxLength",
                                                                "minimum",
                                                                "maximum",
                                                                "exclusiveMinimum",
                                                                "exclusiveMaximum",
                                                                "multipleOf",
                                                                "patternProperties",
                                                                "propertyNames",
                                                                "minProperties",
                                                                "maxProperties",
                                                                "dependentRequired",
                                                                "dependentSchemas",
                                                                "dependencies",
                                                                "if",
                                                                "then",
                                                                "else",
                                                                "not",
                                                                "contains",
                                                                "minContains",
                                                                "maxContains",
                                                                "uniqueItems",
                                                                "unevaluatedProperties",
                                                                "unevaluatedItems",
                                                                "$dynamicRef",
                                                                "$recursiveRef",
                                                                "contentSchema"};
  return *k;
}

// Keywords that assert something about the value (as opposed to
// annotations and containers of definitions).
bool IsAssertion(std::string_view k) {
  static const std::set<std::string, std::less<>> kAssertions = {
      "type",       "enum",        "const",
      "properties", "required",    "additionalProperties",
      "items",      "prefixItems", "additionalItems",
      "minItems",   "maxItems",    "anyOf",
      "oneOf",      "allOf",       "$ref"};
  return kAssertions.contains(k) || UnsupportedKeywords().contains(k);
}

absl::Status Unsupported(const std::string& keyword, const std::string& path,
                         const std::string& why = "") {
  return absl::InvalidArgumentError(absl::StrCat("unsupported JSON Schema keyword \"", keyword,
                                                 "\" at ", path, why.empty() ? "" : ": ", why));
}

absl::Status Invalid(const std::string& keyword, const std::string& path, const std::string& why) {
  return absl::InvalidArgumentError(
      absl::StrCat("JSON Schema keyword \"", keyword, "\" at ", path, ": ", why));
}

std::string Child(const std::string& path, std::string_view key) {
  std::string escaped;
  for (char c : key) {
    if (c == '~') {
      escaped += "~0";
    } else if (c == '/') {
      escaped += "~1";
    } else {
      escaped += c;
    }
  }
  return absl::StrCat(path, "/", escaped);
}

std::string Dump(const Json& v) { return v.dump(-1, ' ', false, Json::error_handler_t::replace); }

bool MatchesType(const Json& v, std::string_view type) {
  if (type == "string") return v.is_string();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return d == static_cast<double>(static_cast<int64_t>(d));
  }
  if (type == "boolean") return v.is_boolean();
  if (type == "null") return v.is_null();
  if (type == "object") return v.is_object();
  if (type == "array") return v.is_array();
  return false;
}

Expr Ws() { return Expr::Optional(Expr::Byte(' ')); }
Expr Comma() { return Expr::Seq({Expr::Byte(','), Ws()}); }
Expr Colon() { return Expr::Seq({Expr::Byte(':'), Ws()}); }
Expr Empty() { return Expr::Seq({}); }

// One character of a JSON string: unescaped (valid UTF-8, no control
// characters, no '"' or '\') or an escape.
Expr StringChar() {
  const Expr cont = Expr::Bytes(0x80, 0xBF);
  std::vector<Expr> alts;
  alts.push_back(Expr::Bytes(0x20, 0x21));
  alts.push_back(Expr::Bytes(0x23, 0x5B));
  alts.push_back(Expr::Bytes(0x5D, 0x7F));
  alts.push_back(Expr::Seq({Expr::Bytes(0xC2, 0xDF), cont}));
  alts.push_back(Expr::Seq({Expr::Byte(0xE0), Expr::Bytes(0xA0, 0xBF), cont}));
  alts.push_back(Expr::Seq({Expr::Bytes(0xE1, 0xEC), cont, cont}));
  alts.push_back(Expr::Seq({Expr::Byte(0xED), Expr::Bytes(0x80, 0x9F), cont}));
  alts.push_back(Expr::Seq({Expr::Bytes(0xEE, 0xEF), cont, cont}));
  alts.push_back(Expr::Seq({Expr::Byte(0xF0), Expr::Bytes(0x90, 0xBF), cont, cont}));
  alts.push_back(Expr::Seq({Expr::Bytes(0xF1, 0xF3), cont, cont, cont}));
  alts.push_back(Expr::Seq({Expr::Byte(0xF4), Expr::Bytes(0x80, 0x8F), cont, cont}));
  const Expr hex = Expr::Alt({Expr::Bytes('0', '9'), Expr::Bytes('a', 'f'), Expr::Bytes('A', 'F')});
  std::vector<Expr> escapes;
  for (char c : std::string_view("\"\\/bfnrt")) escapes.push_back(Expr::Byte(c));
  escapes.push_back(Expr::Seq({Expr::Byte('u'), hex, hex, hex, hex}));
  alts.push_back(Expr::Seq({Expr::Byte('\\'), Expr::Alt(std::move(escapes))}));
  return Expr::Alt(std::move(alts));
}

Expr Digits(int min, int max) { return Expr::Repeat(Expr::Bytes('0', '9'), min, max); }

Expr IntegerPart() {
  return Expr::Seq(
      {Expr::Optional(Expr::Byte('-')),
       Expr::Alt({Expr::Byte('0'), Expr::Seq({Expr::Bytes('1', '9'), Digits(0, 15)})})});
}

}  // namespace

absl::Status JsonSchemaCompiler::Limit() {
  if (++expr_budget_ > kExprBudget) {
    return absl::InvalidArgumentError(absl::StrCat("json_schema: the schema expands to more than ",
                                                   kExprBudget, " subschemas; simplify it"));
  }
  return absl::OkStatus();
}

int32_t JsonSchemaCompiler::Builtin(const std::string& name) {
  if (auto it = builtins_.find(name); it != builtins_.end()) return it->second;
  const int32_t rule = b_.AddRule(name);
  builtins_[name] = rule;
  if (name == "string") {
    b_.SetBody(rule,
               Expr::Seq({Expr::Byte('"'), Expr::Repeat(StringChar(), 0, -1), Expr::Byte('"')}));
  } else if (name == "integer") {
    b_.SetBody(rule, IntegerPart());
  } else if (name == "number") {
    b_.SetBody(
        rule, Expr::Seq({IntegerPart(), Expr::Optional(Expr::Seq({Expr::Byte('.'), Digits(1, 16)})),
                         Expr::Optional(Expr::Seq(
                             {Expr::Alt({Expr::Byte('e'), Expr::Byte('E')}),
                              Expr::Optional(Expr::Alt({Expr::Byte('+'), Expr::Byte('-')})),
                              Digits(1, 2)}))}));
  } else if (name == "any") {
    b_.SetBody(rule,
               Expr::Alt({Expr::Call(Builtin("any_object")), Expr::Call(Builtin("any_array")),
                          Expr::Call(Builtin("string")), Expr::Call(Builtin("number")),
                          Expr::Literal("true"), Expr::Literal("false"), Expr::Literal("null")}));
  } else if (name == "any_object") {
    const int32_t any = Builtin("any");
    const Expr kv = Expr::Seq({Expr::Call(Builtin("string")), Colon(), Expr::Call(any)});
    b_.SetBody(
        rule,
        Expr::Seq({Expr::Byte('{'),
                   Expr::Optional(Expr::Seq({kv, Expr::Repeat(Expr::Seq({Comma(), kv}), 0, -1)})),
                   Expr::Byte('}')}));
  } else if (name == "any_array") {
    const Expr v = Expr::Call(Builtin("any"));
    b_.SetBody(
        rule,
        Expr::Seq({Expr::Byte('['),
                   Expr::Optional(Expr::Seq({v, Expr::Repeat(Expr::Seq({Comma(), v}), 0, -1)})),
                   Expr::Byte(']')}));
  }
  return rule;
}

int32_t JsonSchemaCompiler::AnyObjectRule() { return Builtin("any_object"); }

int32_t JsonSchemaCompiler::AdditionalKeyRule(const std::vector<std::string>& declared) {
  // Printable ASCII without '"' and '\': such a key is its own JSON text, so
  // "not a declared name" can be decided on the bytes.
  auto allowed = [](unsigned char c) { return c >= 0x20 && c <= 0x7E && c != '"' && c != '\\'; };
  std::vector<std::string> names;
  for (const std::string& n : declared) {
    if (std::all_of(n.begin(), n.end(),
                    [&](char c) { return allowed(static_cast<unsigned char>(c)); })) {
      names.push_back(n);
    }
  }
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  const std::string key = absl::StrCat("key!", absl::StrJoin(names, "\x1f"));
  if (auto it = builtins_.find(key); it != builtins_.end()) return it->second;

  const Expr any_char =
      Expr::Alt({Expr::Bytes(0x20, 0x21), Expr::Bytes(0x23, 0x5B), Expr::Bytes(0x5D, 0x7E)});
  const Expr any_star = Expr::Repeat(any_char, 0, -1);
  // Content from a prefix shared by the names in [lo, hi) at depth d.
  auto build = [&](auto&& self, size_t lo, size_t hi, size_t d) -> Expr {
    std::vector<Expr> alts;
    bool is_name = false;
    std::vector<unsigned char> next;
    for (size_t i = lo; i < hi; ++i) {
      if (names[i].size() == d) {
        is_name = true;
      } else if (next.empty() || next.back() != static_cast<unsigned char>(names[i][d])) {
        next.push_back(static_cast<unsigned char>(names[i][d]));
      }
    }
    if (!is_name) alts.push_back(Empty());  // the key may end here
    size_t i = lo;
    for (unsigned char c : next) {
      while (i < hi && (names[i].size() == d || static_cast<unsigned char>(names[i][d]) != c)) ++i;
      size_t j = i;
      while (j < hi && names[j].size() > d && static_cast<unsigned char>(names[j][d]) == c) ++j;
      alts.push_back(Expr::Seq({Expr::Byte(c), self(self, i, j, d + 1)}));
      i = j;
    }
    // Any other allowed byte leaves every name behind.
    int run_start = -1;
    for (int c = 0x20; c <= 0x7F; ++c) {
      const bool other =
          c <= 0x7E && allowed(static_cast<unsigned char>(c)) &&
          !std::binary_search(next.begin(), next.end(), static_cast<unsigned char>(c));
      if (other && run_start < 0) run_start = c;
      if (!other && run_start >= 0) {
        alts.push_back(Expr::Seq(
            {Expr::Bytes(static_cast<uint8_t>(run_start), static_cast<uint8_t>(c - 1)), any_star}));
        run_start = -1;
      }
    }
    return Expr::Alt(std::move(alts));
  };
  const int32_t rule = b_.AddRule("additional key");
  builtins_[key] = rule;
  b_.SetBody(rule, Expr::Seq({Expr::Byte('"'), build(build, 0, names.size(), 0), Expr::Byte('"')}));
  return rule;
}

absl::StatusOr<int32_t> JsonSchemaCompiler::CompileSchema(const Json& schema, bool strict) {
  root_ = &schema;
  strict_ = strict;
  refs_.clear();
  const int32_t rule = b_.AddRule("#");
  refs_["#"] = rule;
  absl::StatusOr<Expr> body = Value(schema, "#", 0);
  if (!body.ok()) return body.status();
  b_.SetBody(rule, *std::move(body));
  return rule;
}

absl::StatusOr<int32_t> JsonSchemaCompiler::RefRule(const std::string& ref, const std::string& path,
                                                    int depth) {
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  if (ref.empty() || ref[0] != '#' || (ref.size() > 1 && ref[1] != '/')) {
    return Unsupported(
        "$ref", path,
        absl::StrCat("\"", ref, "\": only references within the schema (\"#/...\") are supported"));
  }
  const Json* target = root_;
  if (ref.size() > 1) {
    for (absl::string_view raw : absl::StrSplit(absl::string_view(ref).substr(2), '/')) {
      std::string token;
      for (size_t i = 0; i < raw.size(); ++i) {
        if (raw[i] == '~' && i + 1 < raw.size() && (raw[i + 1] == '0' || raw[i + 1] == '1')) {
          token += raw[i + 1] == '0' ? '~' : '/';
          ++i;
        } else {
          token += raw[i];
        }
      }
      if (target->is_object() && target->contains(token)) {
        target = &(*target)[token];
      } else if (target->is_array() && !token.empty() &&
                 std::all_of(token.begin(), token.end(),
                             [](char c) { return c >= '0' && c <= '9'; }) &&
                 token.size() < 9 && std::stoul(token) < target->size()) {
        target = &(*target)[std::stoul(token)];
      } else {
        return Invalid("$ref", path, absl::StrCat("\"", ref, "\" does not resolve"));
      }
    }
  }
  const int32_t rule = b_.AddRule(absl::StrCat("ref ", ref));
  refs_[ref] = rule;
  absl::StatusOr<Expr> body = Value(*target, ref, depth + 1);
  if (!body.ok()) return body.status();
  b_.SetBody(rule, *std::move(body));
  return rule;
}

absl::StatusOr<int32_t> JsonSchemaCompiler::ItemRule(const Json& s, const std::string& path,
                                                     int depth) {
  if (s.is_boolean() && s.get<bool>()) return Builtin("any");
  if (s.is_object() && s.size() == 1 && s.contains("$ref") && s["$ref"].is_string()) {
    return RefRule(s["$ref"].get<std::string>(), path, depth);
  }
  absl::StatusOr<Expr> e = Value(s, path, depth);
  if (!e.ok()) return e.status();
  if (e->kind == Expr::Kind::kCall) return e->rule;
  const int32_t rule = b_.AddRule(path);
  b_.SetBody(rule, *std::move(e));
  return rule;
}

absl::StatusOr<Expr> JsonSchemaCompiler::Value(const Json& s, const std::string& path, int depth) {
  if (absl::Status st = Limit(); !st.ok()) return st;
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: nested deeper than ", kMaxDepth, " at ", path));
  }
  if (s.is_boolean()) {
    if (s.get<bool>()) return Expr::Call(Builtin("any"));
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: the schema at ", path, " is false: no value is valid"));
  }
  if (!s.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: the schema at ", path, " must be an object or a boolean"));
  }
  for (const auto& [k, v] : s.items()) {
    if (k == "uniqueItems" && v.is_boolean() && !v.get<bool>()) continue;
    if (UnsupportedKeywords().contains(k)) return Unsupported(k, path);
  }
  auto other_assertion = [&](std::string_view self) -> std::string {
    for (const auto& [k, v] : s.items()) {
      if (k != self && IsAssertion(k) && !(k == "uniqueItems")) return k;
    }
    return "";
  };

  if (s.contains("$ref")) {
    if (!s["$ref"].is_string()) return Invalid("$ref", path, "must be a string");
    if (const std::string k = other_assertion("$ref"); !k.empty()) {
      return Unsupported("$ref", path, absl::StrCat("together with \"", k, "\""));
    }
    absl::StatusOr<int32_t> rule = RefRule(s["$ref"].get<std::string>(), path, depth);
    if (!rule.ok()) return rule.status();
    return Expr::Call(*rule);
  }
  if (s.contains("allOf")) {
    const Json& all = s["allOf"];
    if (!all.is_array() || all.size() != 1 || !other_assertion("allOf").empty()) {
      return Unsupported("allOf", path,
                         "only allOf with a single schema and no sibling assertions");
    }
    return Value(all[0], Child(Child(path, "allOf"), "0"), depth + 1);
  }
  if (s.contains("anyOf") || s.contains("oneOf")) {
    const char* key = s.contains("anyOf") ? "anyOf" : "oneOf";
    if (s.contains("anyOf") && s.contains("oneOf")) {
      return Unsupported("oneOf", path, "together with \"anyOf\"");
    }
    const Json& alts = s[key];
    if (!alts.is_array() || alts.empty()) return Invalid(key, path, "must be a non-empty array");
    if (const std::string k = other_assertion(key); !k.empty()) {
      return Unsupported(key, path, absl::StrCat("together with \"", k, "\""));
    }
    std::vector<Expr> items;
    for (size_t i = 0; i < alts.size(); ++i) {
      absl::StatusOr<Expr> e =
          Value(alts[i], Child(Child(path, key), std::to_string(i)), depth + 1);
      if (!e.ok()) return e.status();
      items.push_back(*std::move(e));
    }
    return Expr::Alt(std::move(items));
  }

  std::vector<std::string> types;
  if (s.contains("type")) {
    const Json& t = s["type"];
    auto add = [&](const Json& name) -> absl::Status {
      static const std::set<std::string, std::less<>> kTypes = {
          "string", "number", "integer", "boolean", "null", "object", "array"};
      if (!name.is_string() || !kTypes.contains(name.get<std::string>())) {
        return Invalid("type", path, absl::StrCat("unknown type ", Dump(name)));
      }
      types.push_back(name.get<std::string>());
      return absl::OkStatus();
    };
    if (t.is_array()) {
      for (const Json& name : t) {
        if (absl::Status st = add(name); !st.ok()) return st;
      }
      if (types.empty()) return Invalid("type", path, "is an empty list");
    } else if (absl::Status st = add(t); !st.ok()) {
      return st;
    }
  }
  if (s.contains("const") || s.contains("enum")) {
    std::vector<Json> values;
    if (s.contains("const")) {
      values.push_back(s["const"]);
    } else {
      if (!s["enum"].is_array()) return Invalid("enum", path, "must be an array");
      values.assign(s["enum"].begin(), s["enum"].end());
    }
    std::vector<Expr> alts;
    std::set<std::string> seen;
    for (const Json& v : values) {
      if (!types.empty() && std::none_of(types.begin(), types.end(),
                                         [&](const std::string& t) { return MatchesType(v, t); })) {
        continue;
      }
      const std::string text = Dump(v);
      if (seen.insert(text).second) alts.push_back(Expr::Literal(text));
    }
    if (alts.empty()) {
      return Invalid(s.contains("const") ? "const" : "enum", path, "no value of the allowed types");
    }
    return Expr::Alt(std::move(alts));
  }
  if (types.empty()) {
    static const char* kObjectKeys[] = {"properties", "required", "additionalProperties"};
    static const char* kArrayKeys[] = {"items", "prefixItems", "additionalItems", "minItems",
                                       "maxItems"};
    for (const char* k : kObjectKeys) {
      if (s.contains(k)) types = {"object"};
    }
    for (const char* k : kArrayKeys) {
      if (s.contains(k)) types.push_back("array");
    }
    if (types.empty()) return Expr::Call(Builtin("any"));
  }
  std::vector<Expr> alts;
  for (const std::string& t : types) {
    if (t == "string" || t == "number" || t == "integer") {
      alts.push_back(Expr::Call(Builtin(t)));
    } else if (t == "boolean") {
      alts.push_back(Expr::Literal("true"));
      alts.push_back(Expr::Literal("false"));
    } else if (t == "null") {
      alts.push_back(Expr::Literal("null"));
    } else if (t == "object") {
      absl::StatusOr<Expr> e = ObjectExpr(s, path, depth);
      if (!e.ok()) return e.status();
      alts.push_back(*std::move(e));
    } else if (t == "array") {
      absl::StatusOr<Expr> e = ArrayExpr(s, path, depth);
      if (!e.ok()) return e.status();
      alts.push_back(*std::move(e));
    }
  }
  if (alts.size() == 1) return std::move(alts[0]);
  return Expr::Alt(std::move(alts));
}

absl::StatusOr<Expr> JsonSchemaCompiler::ObjectExpr(const Json& s, const std::string& path,
                                                    int depth) {
  struct Prop {
    std::string name;
    int32_t rule;
    bool required;
  };
  std::set<std::string> required;
  if (s.contains("required")) {
    const Json& r = s["required"];
    if (!r.is_array()) return Invalid("required", path, "must be an array of strings");
    for (const Json& n : r) {
      if (!n.is_string()) return Invalid("required", path, "must be an array of strings");
      required.insert(n.get<std::string>());
    }
  }
  // Further properties: none (closed), or any key not declared with values of `extra`.
  bool closed = strict_;
  int32_t extra = kNone;
  if (s.contains("additionalProperties")) {
    const Json& a = s["additionalProperties"];
    if (a.is_boolean()) {
      closed = !a.get<bool>();
    } else {
      closed = false;
      absl::StatusOr<int32_t> r = ItemRule(a, Child(path, "additionalProperties"), depth + 1);
      if (!r.ok()) return r.status();
      extra = *r;
    }
  }
  if (!closed && extra == kNone) extra = Builtin("any");

  std::vector<Prop> props;
  std::vector<std::string> declared;
  if (s.contains("properties")) {
    const Json& p = s["properties"];
    if (!p.is_object()) return Invalid("properties", path, "must be an object");
    for (const auto& [name, sub] : p.items()) {
      absl::StatusOr<int32_t> r = ItemRule(sub, Child(Child(path, "properties"), name), depth + 1);
      if (!r.ok()) return r.status();
      props.push_back({name, *r, required.contains(name)});
      declared.push_back(name);
    }
  }
  for (const std::string& name : required) {
    if (std::find(declared.begin(), declared.end(), name) != declared.end()) continue;
    if (closed) {
      return Invalid("required", path,
                     absl::StrCat("property \"", name,
                                  "\" is required but no further properties are allowed"));
    }
    props.push_back({name, extra, true});
    declared.push_back(name);
  }

  auto kv = [&](const Prop& p) {
    return Expr::Seq({Expr::Literal(Dump(Json(p.name))), Colon(), Expr::Call(p.rule)});
  };
  // After the declared properties: further ones, if allowed.
  Expr more_first = Empty(), more_rest = Empty();
  if (!closed) {
    const Expr add =
        Expr::Seq({Expr::Call(AdditionalKeyRule(declared)), Colon(), Expr::Call(extra)});
    const Expr rest = Expr::Repeat(Expr::Seq({Comma(), add}), 0, -1);
    more_first = Expr::Optional(Expr::Seq({add, rest}));
    more_rest = rest;
  }
  // tail_rest: properties i.. after something was written (each with its
  // comma, optional ones optional); tail_first: before anything was.
  const size_t n = props.size();
  std::vector<Expr> tail_rest(n + 1), tail_first(n + 1);
  tail_rest[n] = more_rest;
  tail_first[n] = more_first;
  for (size_t i = n; i-- > 0;) {
    const Expr with_comma = Expr::Seq({Comma(), kv(props[i])});
    tail_rest[i] =
        Expr::Seq({props[i].required ? with_comma : Expr::Optional(with_comma), tail_rest[i + 1]});
    const Expr starts_here = Expr::Seq({kv(props[i]), tail_rest[i + 1]});
    tail_first[i] = props[i].required ? starts_here : Expr::Alt({starts_here, tail_first[i + 1]});
  }
  return Expr::Seq({Expr::Byte('{'), std::move(tail_first[0]), Expr::Byte('}')});
}

absl::StatusOr<Expr> JsonSchemaCompiler::ArrayExpr(const Json& s, const std::string& path,
                                                   int depth) {
  std::vector<int32_t> prefix;
  const Json* items = nullptr;  // schema of items after the prefix; null: any
  std::string items_path;
  const Json* prefix_items = nullptr;
  std::string prefix_key;
  if (s.contains("prefixItems")) {
    prefix_items = &s["prefixItems"];
    prefix_key = "prefixItems";
    if (s.contains("items")) {
      items = &s["items"];
      items_path = Child(path, "items");
    }
  } else if (s.contains("items") && s["items"].is_array()) {
    prefix_items = &s["items"];  // draft 4-7 tuple form
    prefix_key = "items";
    if (s.contains("additionalItems")) {
      items = &s["additionalItems"];
      items_path = Child(path, "additionalItems");
    }
  } else if (s.contains("items")) {
    items = &s["items"];
    items_path = Child(path, "items");
  }
  if (prefix_items != nullptr) {
    if (!prefix_items->is_array()) return Invalid(prefix_key, path, "must be an array");
    for (size_t i = 0; i < prefix_items->size(); ++i) {
      absl::StatusOr<int32_t> r = ItemRule(
          (*prefix_items)[i], Child(Child(path, prefix_key), std::to_string(i)), depth + 1);
      if (!r.ok()) return r.status();
      prefix.push_back(*r);
    }
  }
  const bool items_allowed = items == nullptr || !(items->is_boolean() && !items->get<bool>());
  int32_t item_rule = kNone;
  if (items_allowed) {
    absl::StatusOr<int32_t> r = items == nullptr ? absl::StatusOr<int32_t>(Builtin("any"))
                                                 : ItemRule(*items, items_path, depth + 1);
    if (!r.ok()) return r.status();
    item_rule = *r;
  }
  auto bound = [&](const char* key, int64_t fallback) -> absl::StatusOr<int64_t> {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!MatchesType(v, "integer") || v.get<double>() < 0) {
      return Invalid(key, path, "must be a non-negative integer");
    }
    if (v.get<double>() > kMaxItemsBound) {
      return Unsupported(key, path,
                         absl::StrCat("values above ", kMaxItemsBound, " are not supported"));
    }
    return static_cast<int64_t>(v.get<double>());
  };
  absl::StatusOr<int64_t> min_items = bound("minItems", 0);
  if (!min_items.ok()) return min_items.status();
  absl::StatusOr<int64_t> max_items = bound("maxItems", -1);
  if (!max_items.ok()) return max_items.status();
  const int64_t k = static_cast<int64_t>(prefix.size());
  int64_t max = *max_items;
  if (!items_allowed) max = max < 0 ? k : std::min(max, k);
  const int64_t min = *min_items;
  if (max >= 0 && min > max)
    return Invalid("minItems", path, "more items are required than allowed");

  auto element = [&](int64_t j) { return Expr::Call(j < k ? prefix[j] : item_rule); };
  auto sep = [&](int64_t j) { return j > 0 ? Comma() : Empty(); };
  std::vector<Expr> seq = {Expr::Byte('[')};
  for (int64_t j = 0; j < min; ++j) {
    seq.push_back(sep(j));
    seq.push_back(element(j));
  }
  const int64_t j_open = std::max(min, k);  // first position of the unbounded tail
  Expr tail = Empty();
  int64_t last = max;
  if (max < 0) {
    const Expr rep = Expr::Repeat(Expr::Seq({Comma(), Expr::Call(item_rule)}), 0, -1);
    tail = j_open == 0 ? Expr::Optional(Expr::Seq({Expr::Call(item_rule), rep})) : rep;
    last = j_open;
  }
  for (int64_t j = last; j-- > min;) {
    tail = Expr::Optional(Expr::Seq({sep(j), element(j), std::move(tail)}));
  }
  seq.push_back(std::move(tail));
  seq.push_back(Expr::Byte(']'));
  return Expr::Seq(std::move(seq));
}

}  // namespace pdserve::engine::grammar
