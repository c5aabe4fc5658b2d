// Operators, access rules, methods, filters, tests and global functions of
// the Jinja subset (see jinja_builtins.h).
#include "text/jinja_builtins.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/jinja_parse.h"
#include "text/utf8.h"

namespace pdserve::text::jinja {

namespace {

// Defined below; GetAttr and ApplyFilter use them.
Value DictMethod(const Value& obj, const std::string& name);
Value StringMethod(const std::string& s, const std::string& name);
std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count);
absl::StatusOr<Value> Attribute(const Value& item, const std::string& path, int line);

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace

absl::Status RuntimeError(int line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", Absl(what)));
}

std::u32string ToCodePoints(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) out.push_back(utf8::Next(s, &i));
  return out;
}

std::string FromCodePoints(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) utf8::Append(c, &out);
  return out;
}

// Python's str.isspace() for the code points that matter.
namespace {

bool IsPySpace(char32_t c) { return utf8::IsWhiteSpace(c) || (c >= 0x1C && c <= 0x1F); }

namespace {

std::string Strip(std::string_view s, const Value& chars, bool left, bool right) {
  const std::u32string cps = ToCodePoints(s);
  std::u32string set;
  const bool custom = chars.is_string();
  if (custom) set = ToCodePoints(chars.as_string());
  auto strip = [&](char32_t c) {
    return custom ? set.find(c) != std::u32string::npos : IsPySpace(c);
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strip(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strip(cps[e - 1])) --e;
  }
  return FromCodePoints(std::u32string_view(cps).substr(b, e - b));
}

}  // namespace

}  // namespace

namespace {

std::string AsciiMap(std::string s, int (*f)(int)) {
  for (char& c : s) {
    if (static_cast<unsigned char>(c) < 0x80)
      c = static_cast<char>(f(static_cast<unsigned char>(c)));
  }
  return s;
}

}  // namespace

namespace {

std::string Title(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    const bool alpha = u < 0x80 && std::isalpha(u);
    if (alpha) c = static_cast<char>(prev_alpha ? std::tolower(u) : std::toupper(u));
    prev_alpha = alpha || u >= 0x80;
  }
  return out;
}

}  // namespace

namespace {

std::string Capitalize(const std::string& s) {
  std::string out = AsciiMap(s, [](int c) { return std::tolower(c); });
  if (!out.empty() && static_cast<unsigned char>(out[0]) < 0x80) {
    out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  }
  return out;
}

}  // namespace

// Python sequence index normalisation; nullopt when out of range.
namespace {

std::optional<size_t> PyIndex(int64_t i, size_t size) {
  if (i < 0) i += static_cast<int64_t>(size);
  if (i < 0 || i >= static_cast<int64_t>(size)) return std::nullopt;
  return static_cast<size_t>(i);
}

}  // namespace

// Python slice indices for a sequence of `size`.
std::vector<size_t> SliceIndices(size_t size, std::optional<int64_t> start,
                                 std::optional<int64_t> stop, int64_t step) {
  std::vector<size_t> out;
  const int64_t n = static_cast<int64_t>(size);
  auto clamp = [&](std::optional<int64_t> v, int64_t def, int64_t lo, int64_t hi) {
    if (!v.has_value()) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    return std::clamp(x, lo, hi);
  };
  if (step > 0) {
    const int64_t b = clamp(start, 0, 0, n);
    const int64_t e = clamp(stop, n, 0, n);
    for (int64_t i = b; i < e; i += step) out.push_back(static_cast<size_t>(i));
  } else {
    const int64_t b = clamp(start, n - 1, -1, n - 1);
    const int64_t e = clamp(stop, -1, -1, n - 1);
    for (int64_t i = b; i > e; i += step) out.push_back(static_cast<size_t>(i));
  }
  return out;
}

// Items a for loop or a filter iterates over: array elements, string
// characters, object keys; undefined and none give nothing.
absl::StatusOr<Array> Iterate(const Value& v, int line) {
  switch (v.kind()) {
    case Value::Kind::kArray:
      return v.as_array();
    case Value::Kind::kObject: {
      Array keys;
      for (const auto& [k, unused] : v.as_object()) keys.emplace_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      Array chars;
      for (char32_t c : ToCodePoints(v.as_string()))
        chars.emplace_back(FromCodePoints(std::u32string(1, c)));
      return chars;
    }
    case Value::Kind::kUndefined:
      return Array{};
    default:
      return RuntimeError(line, absl::StrCat("cannot iterate over ", v.Repr()));
  }
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined()) return RuntimeError(line, "subscript of an undefined value");
  if (obj.is_object() && key.is_string()) {
    Value v = obj.Get(key.as_string());
    if (!v.is_undefined()) return v;
    return GetAttr(obj, key.as_string(), line);
  }
  if (obj.is_array() && key.is_int()) {
    std::optional<size_t> i = PyIndex(key.as_int(), obj.as_array().size());
    if (!i.has_value()) return Value();
    return obj.as_array()[*i];
  }
  if (obj.is_string() && key.is_int()) {
    const std::u32string cps = ToCodePoints(obj.as_string());
    std::optional<size_t> i = PyIndex(key.as_int(), cps.size());
    if (!i.has_value()) return Value();
    return Value(FromCodePoints(std::u32string(1, cps[*i])));
  }
  if (key.is_string()) return GetAttr(obj, key.as_string(), line);
  return Value();
}

absl::StatusOr<Value> GetAttr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined()) {
    return RuntimeError(line, absl::StrCat("attribute '", name, "' of an undefined value"));
  }
  if (obj.is_object()) {
    if (name == "items" || name == "keys" || name == "values" || name == "get") {
      return DictMethod(obj, name);
    }
    return obj.Get(name);
  }
  if (obj.is_string()) return StringMethod(obj.as_string(), name);
  return Value();
}

namespace {

Value DictMethod(const Value& obj, const std::string& name) {
  return Value(
      Function([obj, name](std::span<const Value> args, const KwArgs&) -> absl::StatusOr<Value> {
        Array out;
        if (name == "get") {
          if (args.empty()) return absl::InvalidArgumentError("get() needs a key");
          Value v = args[0].is_string() ? obj.Get(args[0].as_string()) : Value();
          if (!v.is_undefined()) return v;
          return args.size() > 1 ? args[1] : Value::None();
        }
        for (const auto& [k, v] : obj.as_object()) {
          if (name == "items") {
            out.push_back(Value(Array{Value(k), v}));
          } else if (name == "keys") {
            out.emplace_back(k);
          } else {
            out.push_back(v);
          }
        }
        return Value(std::move(out));
      }));
}

}  // namespace

namespace {

Value StringMethod(const std::string& s, const std::string& name) {
  static const std::set<std::string, std::less<>> kMethods = {
      "capitalize", "endswith", "find",       "join",  "lower", "lstrip", "replace",
      "rstrip",     "split",    "startswith", "strip", "title", "upper"};
  if (!kMethods.contains(name)) return Value();
  return Value(Function(
      [s, name](std::span<const Value> args, const KwArgs& kwargs) -> absl::StatusOr<Value> {
        auto arg = [&](size_t i, const char* key) -> Value {
          if (i < args.size()) return args[i];
          for (const auto& [k, v] : kwargs) {
            if (k == key) return v;
          }
          return Value();
        };
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
          return Value(Strip(s, arg(0, "chars"), name != "rstrip", name != "lstrip"));
        }
        if (name == "upper") return Value(AsciiMap(s, [](int c) { return std::toupper(c); }));
        if (name == "lower") return Value(AsciiMap(s, [](int c) { return std::tolower(c); }));
        if (name == "title") return Value(Title(s));
        if (name == "capitalize") return Value(Capitalize(s));
        if (name == "startswith" || name == "endswith") {
          const Value p = arg(0, "prefix");
          Array options;
          if (p.is_string()) {
            options.push_back(p);
          } else if (p.is_array()) {
            options = p.as_array();
          } else {
            return absl::InvalidArgumentError(absl::StrCat(name, "() needs a string"));
          }
          for (const Value& o : options) {
            if (!o.is_string())
              return absl::InvalidArgumentError(absl::StrCat(name, "() needs a string"));
            const std::string& x = o.as_string();
            if (name == "startswith" ? s.starts_with(x) : s.ends_with(x)) return Value(true);
          }
          return Value(false);
        }
        if (name == "split") {
          const Value sep = arg(0, "sep");
          const Value max = arg(1, "maxsplit");
          int64_t maxsplit = max.is_int() ? max.as_int() : -1;
          Array out;
          if (sep.is_undefined() || sep.is_none()) {
            const std::u32string cps = ToCodePoints(s);
            size_t i = 0;
            while (true) {
              while (i < cps.size() && IsPySpace(cps[i])) ++i;
              if (i >= cps.size()) break;
              if (maxsplit == 0) {
                size_t e = cps.size();
                while (e > i && IsPySpace(cps[e - 1])) --e;
                out.emplace_back(FromCodePoints(std::u32string_view(cps).substr(i, e - i)));
                break;
              }
              size_t j = i;
              while (j < cps.size() && !IsPySpace(cps[j])) ++j;
              out.emplace_back(FromCodePoints(std::u32string_view(cps).substr(i, j - i)));
              if (maxsplit > 0) --maxsplit;
              i = j;
            }
            return Value(std::move(out));
          }
          if (!sep.is_string() || sep.as_string().empty()) {
            return absl::InvalidArgumentError("split() separator must be a non-empty string");
          }
          const std::string& d = sep.as_string();
          size_t start = 0;
          while (true) {
            const size_t at = maxsplit == 0 ? std::string::npos : s.find(d, start);
            if (at == std::string::npos) {
              out.emplace_back(s.substr(start));
              break;
            }
            out.emplace_back(s.substr(start, at - start));
            start = at + d.size();
            if (maxsplit > 0) --maxsplit;
          }
          return Value(std::move(out));
        }
        if (name == "replace") {
          const Value from = arg(0, "old");
          const Value to = arg(1, "new");
          const Value count = arg(2, "count");
          if (!from.is_string() || !to.is_string()) {
            return absl::InvalidArgumentError("replace() needs two strings");
          }
          return Value(ReplaceAll(s, from.as_string(), to.as_string(),
                                  count.is_int() ? count.as_int() : -1));
        }
        if (name == "find") {
          const Value sub = arg(0, "sub");
          if (!sub.is_string()) return absl::InvalidArgumentError("find() needs a string");
          const size_t at = s.find(sub.as_string());
          if (at == std::string::npos) return Value(int64_t{-1});
          return Value(static_cast<int64_t>(ToCodePoints(s.substr(0, at)).size()));
        }
        // join
        const Value items = arg(0, "iterable");
        if (!items.is_array()) return absl::InvalidArgumentError("join() needs a list");
        std::string out;
        for (size_t i = 0; i < items.as_array().size(); ++i) {
          if (i > 0) out += s;
          if (!items.as_array()[i].is_string())
            return absl::InvalidArgumentError("join() needs strings");
          out += items.as_array()[i].as_string();
        }
        return Value(std::move(out));
      }));
}

}  // namespace

namespace {

std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to,
                       int64_t count) {
  if (from.empty()) {
    // Python inserts `to` around every character.
    const std::u32string cps = ToCodePoints(s);
    std::string out;
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      if (i < cps.size()) utf8::Append(cps[i], &out);
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(s, start);
  return out;
}

}  // namespace

absl::StatusOr<Value> Binary(const std::string& op, const Value& a, const Value& b, int line) {
  auto type_error = [&]() {
    return RuntimeError(
        line, absl::StrCat("unsupported operands for ", op, ": ", a.Repr(), " and ", b.Repr()));
  };
  if (op == "~") return Value(a.Str() + b.Str());
  if (op == "==") return Value(a.Equals(b));
  if (op == "!=") return Value(!a.Equals(b));
  if (op == "in" || op == "not in") {
    bool found = false;
    if (b.is_string()) {
      if (!a.is_string()) return type_error();
      found = b.as_string().find(a.as_string()) != std::string::npos;
    } else if (b.is_array()) {
      for (const Value& x : b.as_array()) found = found || x.Equals(a);
    } else if (b.is_object()) {
      found = a.is_string() && !b.Get(a.as_string()).is_undefined();
    } else if (b.is_undefined()) {
      return RuntimeError(line, "'in' on an undefined value");
    } else {
      return type_error();
    }
    return Value(op == "in" ? found : !found);
  }
  const bool nums = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    int c;
    if (nums) {
      const double x = a.as_double(), y = b.as_double();
      c = x < y ? -1 : x > y ? 1 : 0;
    } else if (a.is_string() && b.is_string()) {
      c = a.as_string().compare(b.as_string());
    } else {
      return type_error();
    }
    if (op == "<") return Value(c < 0);
    if (op == ">") return Value(c > 0);
    if (op == "<=") return Value(c <= 0);
    return Value(c >= 0);
  }
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  auto ival = [](const Value& v) { return v.is_bool() ? int64_t{v.as_bool()} : v.as_int(); };
  if (op == "+") {
    if (ints) return Value(ival(a) + ival(b));
    if (nums) return Value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) {
      if (a.as_string().size() + b.as_string().size() > kMaxOutputBytes) {
        return absl::ResourceExhaustedError("string too long");
      }
      return Value(a.as_string() + b.as_string());
    }
    if (a.is_array() && b.is_array()) {
      Array out = a.as_array();
      out.insert(out.end(), b.as_array().begin(), b.as_array().end());
      return Value(std::move(out));
    }
    return type_error();
  }
  if (op == "-") {
    if (ints) return Value(ival(a) - ival(b));
    if (nums) return Value(a.as_double() - b.as_double());
    return type_error();
  }
  if (op == "*") {
    if (ints) return Value(ival(a) * ival(b));
    if (nums) return Value(a.as_double() * b.as_double());
    const Value* seq = a.is_string() || a.is_array() ? &a : &b;
    const Value* times = seq == &a ? &b : &a;
    if (!times->is_int() || !(seq->is_string() || seq->is_array())) return type_error();
    const int64_t n = std::max<int64_t>(0, times->as_int());
    const size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_array().size() * 16;
    if (unit != 0 && static_cast<uint64_t>(n) > kMaxOutputBytes / unit) {
      return absl::ResourceExhaustedError("sequence repetition too long");
    }
    if (seq->is_string()) {
      std::string out;
      for (int64_t i = 0; i < n; ++i) out += seq->as_string();
      return Value(std::move(out));
    }
    Array out;
    for (int64_t i = 0; i < n; ++i)
      out.insert(out.end(), seq->as_array().begin(), seq->as_array().end());
    return Value(std::move(out));
  }
  if (!nums) return type_error();
  if (op == "/") {
    if (b.as_double() == 0) return RuntimeError(line, "division by zero");
    return Value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) return RuntimeError(line, "division by zero");
    if (ints) {
      const int64_t x = ival(a), y = ival(b);
      int64_t q = x / y;
      if ((x % y != 0) && ((x < 0) != (y < 0))) --q;  // floor
      return Value(op == "//" ? q : x - q * y);
    }
    const double q = std::floor(a.as_double() / b.as_double());
    return Value(op == "//" ? q : a.as_double() - q * b.as_double());
  }
  if (op == "**") {
    if (ints && ival(b) >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < ival(b) && i < 64; ++i) r *= ival(a);
      return Value(r);
    }
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  return type_error();
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& x,
                               const std::vector<Value>& args, int line) {
  auto need_arg = [&]() -> absl::StatusOr<Value> {
    if (args.empty())
      return RuntimeError(line, absl::StrCat("test '", name, "' needs an argument"));
    return args[0];
  };
  if (name == "defined") return !x.is_undefined();
  if (name == "undefined") return x.is_undefined();
  if (name == "none") return x.is_none();
  if (name == "boolean") return x.is_bool();
  if (name == "true") return x.is_bool() && x.as_bool();
  if (name == "false") return x.is_bool() && !x.as_bool();
  if (name == "string") return x.is_string();
  if (name == "number") return x.is_number();
  if (name == "integer") return x.is_int();
  if (name == "float") return x.is_float();
  if (name == "mapping") return x.is_object();
  if (name == "iterable") return x.is_array() || x.is_object() || x.is_string();
  if (name == "sequence") return x.is_array() || x.is_object() || x.is_string();
  if (name == "callable") return x.is_function();
  if (name == "lower")
    return x.is_string() &&
           AsciiMap(x.as_string(), [](int c) { return std::tolower(c); }) == x.as_string();
  if (name == "upper")
    return x.is_string() &&
           AsciiMap(x.as_string(), [](int c) { return std::toupper(c); }) == x.as_string();
  if (name == "odd" || name == "even") {
    if (!x.is_int()) return RuntimeError(line, "odd/even need an integer");
    return (x.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    absl::StatusOr<Value> d = need_arg();
    if (!d.ok()) return d.status();
    if (!x.is_int() || !d->is_int() || d->as_int() == 0)
      return RuntimeError(line, "bad divisibleby");
    return x.as_int() % d->as_int() == 0;
  }
  absl::StatusOr<Value> other = need_arg();
  if (!other.ok()) return other.status();
  std::string op = name;
  if (name == "eq" || name == "equalto" || name == "sameas") op = "==";
  if (name == "ne") op = "!=";
  if (name == "lt") op = "<";
  if (name == "gt") op = ">";
  if (name == "le") op = "<=";
  if (name == "ge") op = ">=";
  absl::StatusOr<Value> r = Binary(op, x, *other, line);
  if (!r.ok()) return r.status();
  return r->Truthy();
}

namespace {

absl::StatusOr<Value> Attribute(const Value& item, const std::string& path, int line) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.is_undefined()) return Value();
    absl::StatusOr<Value> next = GetItem(v, Value(part), line);
    if (!next.ok()) return next;
    v = *std::move(next);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

}  // namespace

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& x,
                                  const std::vector<Value>& args, const KwArgs& kwargs, int line) {
  auto arg = [&](size_t i, const char* key) -> Value {
    if (i < args.size()) return args[i];
    for (const auto& [k, v] : kwargs) {
      if (k == key) return v;
    }
    return Value();
  };
  if (name == "safe") return x;
  if (name == "string") return Value(x.Str());
  if (name == "length" || name == "count") {
    if (x.is_string()) return Value(static_cast<int64_t>(ToCodePoints(x.as_string()).size()));
    if (x.is_array()) return Value(static_cast<int64_t>(x.as_array().size()));
    if (x.is_object()) return Value(static_cast<int64_t>(x.as_object().size()));
    if (x.is_undefined()) return Value(int64_t{0});
    return RuntimeError(line, absl::StrCat("length of ", x.Repr()));
  }
  if (name == "default" || name == "d") {
    const Value fallback = arg(0, "default_value");
    const bool boolean = arg(1, "boolean").Truthy();
    if (x.is_undefined() || (boolean && !x.Truthy()))
      return fallback.is_undefined() ? Value("") : fallback;
    return x;
  }
  if (name == "trim") return Value(Strip(x.Str(), arg(0, "chars"), true, true));
  if (name == "upper") return Value(AsciiMap(x.Str(), [](int c) { return std::toupper(c); }));
  if (name == "lower") return Value(AsciiMap(x.Str(), [](int c) { return std::tolower(c); }));
  if (name == "title") return Value(Title(x.Str()));
  if (name == "capitalize") return Value(Capitalize(x.Str()));
  if (name == "wordcount") {
    absl::StatusOr<Value> words = StringMethod(x.Str(), "split").as_function()({}, {});
    if (!words.ok()) return words;
    return Value(static_cast<int64_t>(words->as_array().size()));
  }
  if (name == "replace") {
    const Value from = arg(0, "old");
    const Value to = arg(1, "new");
    const Value count = arg(2, "count");
    if (!from.is_string() || !to.is_string())
      return RuntimeError(line, "replace needs two strings");
    return Value(ReplaceAll(x.Str(), from.as_string(), to.as_string(),
                            count.is_int() ? count.as_int() : -1));
  }
  if (name == "indent") {
    const Value width = arg(0, "width");
    const bool first = arg(1, "first").Truthy();
    const bool blank = arg(2, "blank").Truthy();
    const std::string pad =
        width.is_string()
            ? width.as_string()
            : std::string(
                  width.is_int() ? std::max<int64_t>(0, std::min<int64_t>(width.as_int(), 256)) : 4,
                  ' ');
    const std::string s = x.Str();
    std::string out;
    size_t start = 0;
    bool first_line = true;
    while (start <= s.size()) {
      const size_t nl = s.find('\n', start);
      const std::string line_text =
          s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
      const bool indent_it = first_line ? first : (blank || !line_text.empty());
      if (indent_it) out += pad;
      out += line_text;
      if (nl == std::string::npos) break;
      out += '\n';
      start = nl + 1;
      first_line = false;
    }
    return Value(std::move(out));
  }
  if (name == "tojson") {
    const Value indent = arg(0, "indent");
    absl::StatusOr<std::string> json = x.ToJson(
        indent.is_int() ? static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 64)) : -1);
    if (!json.ok()) return RuntimeError(line, std::string(json.status().message()));
    return Value(*std::move(json));
  }
  if (name == "int") {
    if (x.is_int()) return x;
    if (x.is_float()) return Value(static_cast<int64_t>(x.as_double()));
    if (x.is_bool()) return Value(int64_t{x.as_bool()});
    if (x.is_string()) {
      char* end = nullptr;
      const long long v = std::strtoll(x.as_string().c_str(), &end, 10);
      if (end != nullptr && *end == '\0' && !x.as_string().empty()) return Value(int64_t{v});
    }
    const Value d = arg(0, "default");
    return d.is_undefined() ? Value(int64_t{0}) : d;
  }
  if (name == "float") {
    if (x.is_number() || x.is_bool()) return Value(x.as_double());
    if (x.is_string()) {
      char* end = nullptr;
      const double v = std::strtod(x.as_string().c_str(), &end);
      if (end != nullptr && *end == '\0' && !x.as_string().empty()) return Value(v);
    }
    const Value d = arg(0, "default");
    return d.is_undefined() ? Value(0.0) : d;
  }
  if (name == "abs") {
    if (x.is_int()) return Value(x.as_int() < 0 ? -x.as_int() : x.as_int());
    if (x.is_number()) return Value(std::fabs(x.as_double()));
    return RuntimeError(line, "abs needs a number");
  }
  if (name == "round") {
    if (!x.is_number()) return RuntimeError(line, "round needs a number");
    const Value precision = arg(0, "precision");
    const double p =
        std::pow(10.0, precision.is_int() ? static_cast<double>(precision.as_int()) : 0.0);
    return Value(std::round(x.as_double() * p) / p);
  }
  if (name == "items") {
    if (x.is_undefined()) return Value(Array{});
    if (!x.is_object()) return RuntimeError(line, "items needs a mapping");
    return DictMethod(x, "items").as_function()({}, {});
  }
  // Filters over sequences.
  absl::StatusOr<Array> items = Iterate(x, line);
  if (!items.ok()) return items.status();
  if (name == "list") return Value(*std::move(items));
  if (name == "first") return items->empty() ? Value() : items->front();
  if (name == "last") return items->empty() ? Value() : items->back();
  if (name == "reverse") {
    if (x.is_string()) {
      std::u32string cps = ToCodePoints(x.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value(FromCodePoints(cps));
    }
    std::reverse(items->begin(), items->end());
    return Value(*std::move(items));
  }
  if (name == "join") {
    const Value sep = arg(0, "d");
    const Value attribute = arg(1, "attribute");
    std::string out;
    for (size_t i = 0; i < items->size(); ++i) {
      if (i > 0) out += sep.Str();
      Value item = (*items)[i];
      if (attribute.is_string()) {
        absl::StatusOr<Value> a = Attribute(item, attribute.as_string(), line);
        if (!a.ok()) return a;
        item = *std::move(a);
      }
      out += item.Str();
      if (out.size() > kMaxOutputBytes) return absl::ResourceExhaustedError("join result too long");
    }
    return Value(std::move(out));
  }
  if (name == "sum") {
    Value total = arg(1, "start");
    if (total.is_undefined()) total = Value(int64_t{0});
    const Value attribute = arg(0, "attribute");
    for (const Value& item : *items) {
      Value v = item;
      if (attribute.is_string()) {
        absl::StatusOr<Value> a = Attribute(item, attribute.as_string(), line);
        if (!a.ok()) return a;
        v = *std::move(a);
      }
      absl::StatusOr<Value> s = Binary("+", total, v, line);
      if (!s.ok()) return s;
      total = *std::move(s);
    }
    return total;
  }
  if (name == "unique") {
    Array out;
    for (const Value& item : *items) {
      bool seen = false;
      for (const Value& o : out) seen = seen || o.Equals(item);
      if (!seen) out.push_back(item);
    }
    return Value(std::move(out));
  }
  if (name == "sort") {
    const bool reverse = arg(0, "reverse").Truthy();
    const Value attribute = arg(2, "attribute");
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& item : *items) {
      Value key = item;
      if (attribute.is_string()) {
        absl::StatusOr<Value> a = Attribute(item, attribute.as_string(), line);
        if (!a.ok()) return a;
        key = *std::move(a);
      }
      keyed.emplace_back(key, item);
    }
    absl::Status error;
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& l, const auto& r) {
      absl::StatusOr<Value> less =
          Binary("<", reverse ? r.first : l.first, reverse ? l.first : r.first, line);
      if (!less.ok()) {
        error = less.status();
        return false;
      }
      return less->Truthy();
    });
    if (!error.ok()) return error;
    Array out;
    for (auto& [k, v] : keyed) out.push_back(std::move(v));
    return Value(std::move(out));
  }
  if (name == "map") {
    const Value attribute = arg(99, "attribute");
    Array out;
    for (const Value& item : *items) {
      if (attribute.is_string()) {
        absl::StatusOr<Value> a = Attribute(item, attribute.as_string(), line);
        if (!a.ok()) return a;
        out.push_back(a->is_undefined() ? arg(99, "default") : *std::move(a));
      } else if (!args.empty() && args[0].is_string()) {
        if (!IsKnownFilter(args[0].as_string())) {
          return RuntimeError(line, absl::StrCat("unsupported filter '", args[0].as_string(), "'"));
        }
        absl::StatusOr<Value> v = ApplyFilter(
            args[0].as_string(), item, std::vector<Value>(args.begin() + 1, args.end()), {}, line);
        if (!v.ok()) return v;
        out.push_back(*std::move(v));
      } else {
        return RuntimeError(line, "map needs a filter name or attribute=");
      }
    }
    return Value(std::move(out));
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name.ends_with("attr");
    const bool keep_if = name.starts_with("select");
    const size_t test_at = by_attr ? 1 : 0;
    Array out;
    for (const Value& item : *items) {
      Value subject = item;
      if (by_attr) {
        if (args.empty() || !args[0].is_string())
          return RuntimeError(line, absl::StrCat(name, " needs an attribute"));
        absl::StatusOr<Value> a = Attribute(item, args[0].as_string(), line);
        if (!a.ok()) return a;
        subject = *std::move(a);
      }
      bool pass;
      if (args.size() > test_at) {
        if (!args[test_at].is_string() || !IsKnownTest(args[test_at].as_string())) {
          return RuntimeError(line, absl::StrCat(name, ": unsupported test"));
        }
        absl::StatusOr<bool> t =
            ApplyTest(args[test_at].as_string(), subject,
                      std::vector<Value>(args.begin() + test_at + 1, args.end()), line);
        if (!t.ok()) return t.status();
        pass = *t;
      } else {
        pass = subject.Truthy();
      }
      if (pass == keep_if) out.push_back(item);
    }
    return Value(std::move(out));
  }
  return RuntimeError(line, absl::StrCat("unsupported filter '", name, "'"));
}

Value GlobalFunction(std::string_view name) {
  if (name == "range") {
    return Value(Function([](std::span<const Value> args, const KwArgs&) -> absl::StatusOr<Value> {
      int64_t start = 0, stop = 0, step = 1;
      for (const Value& a : args) {
        if (!a.is_int()) return absl::InvalidArgumentError("range() takes integers");
      }
      if (args.size() == 1) {
        stop = args[0].as_int();
      } else if (args.size() == 2 || args.size() == 3) {
        start = args[0].as_int();
        stop = args[1].as_int();
        if (args.size() == 3) step = args[2].as_int();
      } else {
        return absl::InvalidArgumentError("range() takes 1 to 3 arguments");
      }
      if (step == 0) return absl::InvalidArgumentError("range() step must not be zero");
      Array out;
      for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (out.size() >= 1'000'000) return absl::ResourceExhaustedError("range() too long");
        out.emplace_back(i);
      }
      return Value(std::move(out));
    }));
  }
  if (name == "namespace") {
    return Value(
        Function([](std::span<const Value> args, const KwArgs& kwargs) -> absl::StatusOr<Value> {
          Object o;
          for (const Value& a : args) {
            if (!a.is_object())
              return absl::InvalidArgumentError("namespace() takes a dict or keywords");
            for (const auto& kv : a.as_object()) o.push_back(kv);
          }
          for (const auto& kv : kwargs) o.push_back(kv);
          return Value(std::move(o));
        }));
  }
  // raise_exception
  return Value(Function([](std::span<const Value> args, const KwArgs&) -> absl::StatusOr<Value> {
    return absl::InvalidArgumentError(args.empty() ? "raise_exception()" : args[0].Str());
  }));
}

}  // namespace pdserve::text::jinja
