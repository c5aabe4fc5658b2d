// Values of the Jinja subset interpreter (text/jinja.h), with Python's
// semantics where templates can see them: truthiness, ==, str(), repr() and
// json.dumps (as Hugging Face's tojson calls it). Arrays, objects and
// callables are shared by reference, like Python objects; a "namespace()" is
// an object assigned through `{% set ns.x = ... %}`.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::text::jinja {

class Value;
using Array = std::vector<Value>;
// Insertion-ordered, like a Python dict. Keys are unique.
using Object = std::vector<std::pair<std::string, Value>>;
using KwArgs = std::vector<std::pair<std::string, Value>>;
// A function callable from templates (globals, macros, bound methods).
using Function =
    std::function<absl::StatusOr<Value>(std::span<const Value> args, const KwArgs& kwargs)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kArray, kObject, kFunction };

  Value() = default;  // undefined
  static Value None();
  Value(bool b) : data_(b) {}
  Value(int v) : data_(int64_t{v}) {}
  Value(int64_t v) : data_(v) {}
  Value(double v) : data_(v) {}
  Value(std::string s) : data_(std::move(s)) {}
  Value(std::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  Value(Array a) : data_(std::make_shared<Array>(std::move(a))) {}
  Value(Object o) : data_(std::make_shared<Object>(std::move(o))) {}
  Value(Function f) : data_(std::make_shared<Function>(std::move(f))) {}

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_number() const { return is_int() || is_float(); }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_array() const { return kind() == Kind::kArray; }
  bool is_object() const { return kind() == Kind::kObject; }
  bool is_function() const { return kind() == Kind::kFunction; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const { return std::get<int64_t>(data_); }
  // Int, float or bool as a double.
  double as_double() const;
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const Array& as_array() const { return *std::get<std::shared_ptr<Array>>(data_); }
  const Object& as_object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  // Mutable access to a shared object (namespace assignment).
  Object& mutable_object() const { return *std::get<std::shared_ptr<Object>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<Function>>(data_); }

  // Key lookup in an object; undefined when absent or not an object.
  Value Get(std::string_view key) const;
  // Sets `key` in an object (replacing or appending).
  void Set(std::string_view key, Value v) const;

  // Python truthiness (undefined is false).
  bool Truthy() const;
  // Python ==. Numbers compare by value across int/float/bool.
  bool Equals(const Value& other) const;
  // Python str(): strings as is, None -> "None", True -> "True", undefined -> "".
  std::string Str() const;
  // Python repr(): 'quoted' strings, [..], {..}.
  std::string Repr() const;
  // json.dumps(value, ensure_ascii=False, indent=indent); indent < 0: one
  // line with ", " and ": " separators. Undefined and functions are errors.
  absl::StatusOr<std::string> ToJson(int indent = -1) const;

 private:
  struct NoneTag {};
  std::variant<std::monostate, NoneTag, bool, int64_t, double, std::string, std::shared_ptr<Array>,
               std::shared_ptr<Object>, std::shared_ptr<Function>>
      data_;
};

// Python repr of a float (shortest round trip; "1.0", "1e+16", "nan", "inf").
std::string FloatRepr(double v);

}  // namespace pdserve::text::jinja
