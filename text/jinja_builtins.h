// Python-flavoured operations on Jinja values for the renderer
// (text/jinja.cc): operators, item and attribute access, str and dict
// methods, filters, tests, and the global functions range, namespace and
// raise_exception. Pure functions of their arguments; errors are
// INVALID_ARGUMENT "chat template line N: ...", or RESOURCE_EXHAUSTED when a
// result would pass kMaxOutputBytes.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja_value.h"

namespace pdserve::text::jinja {

// Largest rendered text, and largest string an operator may build.
inline constexpr size_t kMaxOutputBytes = size_t{16} << 20;

absl::Status RuntimeError(int line, std::string_view what);

// Items a for loop or a filter iterates over: array elements, string
// characters, object keys; undefined gives nothing; others are errors.
absl::StatusOr<Array> Iterate(const Value& v, int line);

// Python slice positions over a sequence of `size`; `step` != 0.
std::vector<size_t> SliceIndices(size_t size, std::optional<int64_t> start,
                                 std::optional<int64_t> stop, int64_t step);
std::u32string ToCodePoints(std::string_view s);
std::string FromCodePoints(std::u32string_view s);

// obj[key] and obj.name with Jinja's rules (item first for [], attribute
// first for .; str and dict methods come back as bound functions). Undefined
// when missing; an error when `obj` itself is undefined.
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line);
absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line);

// Binary operator `op`: + - * / // % ** ~ == != < > <= >= in "not in".
absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b, int line);

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& x,
                               const std::vector<Value>& args, int line);
absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& x,
                                  const std::vector<Value>& args, const KwArgs& kwargs, int line);

// range / namespace / raise_exception; undefined for other names.
Value GlobalFunction(std::string_view name);

}  // namespace pdserve::text::jinja
