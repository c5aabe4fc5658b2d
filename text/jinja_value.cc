// Jinja values with Python semantics (see jinja_value.h).
#include "text/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pdserve::text::jinja {

Value Value::None() {
  Value v;
  v.data_ = NoneTag{};
  return v;
}

double Value::as_double() const {
  switch (kind()) {
    case Kind::kInt:
      return static_cast<double>(as_int());
    case Kind::kFloat:
      return std::get<double>(data_);
    case Kind::kBool:
      return as_bool() ? 1.0 : 0.0;
    default:
      return 0.0;
  }
}

Value Value::Get(std::string_view key) const {
  if (!is_object()) return Value();
  for (const auto& [k, v] : as_object()) {
    if (k == key) return v;
  }
  return Value();
}

void Value::Set(std::string_view key, Value v) const {
  Object& o = mutable_object();
  for (auto& [k, old] : o) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  o.emplace_back(std::string(key), std::move(v));
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_double() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kArray:
      return !as_array().empty();
    case Kind::kObject:
      return !as_object().empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

bool Value::Equals(const Value& other) const {
  const bool num_a = is_number() || is_bool();
  const bool num_b = other.is_number() || other.is_bool();
  if (num_a && num_b) {
    if ((is_int() || is_bool()) && (other.is_int() || other.is_bool())) {
      const int64_t a = is_bool() ? as_bool() : as_int();
      const int64_t b = other.is_bool() ? other.as_bool() : other.as_int();
      return a == b;
    }
    return as_double() == other.as_double();
  }
  if (kind() != other.kind()) return false;
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kArray: {
      const Array& a = as_array();
      const Array& b = other.as_array();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].Equals(b[i])) return false;
      }
      return true;
    }
    case Kind::kObject: {
      const Object& a = as_object();
      const Object& b = other.as_object();
      if (a.size() != b.size()) return false;
      for (const auto& [k, v] : a) {
        if (!v.Equals(other.Get(k))) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return std::get<std::shared_ptr<Function>>(data_) ==
             std::get<std::shared_ptr<Function>>(other.data_);
    default:
      return false;
  }
}

std::string FloatRepr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed notation for
  // decimal exponents in [-4, 16), scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exp = std::stoi(sci.substr(e + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  if (exp >= -4 && exp < 16) {
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (static_cast<int>(digits.size()) <= exp + 1) {
      out = digits + std::string(exp + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_buf[16];
  std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + exp_buf;
}

namespace {

std::string ReprString(const std::string& s) {
  // Python picks single quotes unless the text has ' and no ".
  const bool use_double = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = use_double ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == q) {
          out += '\\';
          out += c;
        } else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += q;
  return out;
}

void JsonString(const std::string& s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned char>(c));
          *out += buf;
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

absl::Status ToJsonImpl(const Value& v, int indent, int depth, std::string* out) {
  if (depth > 512) return absl::InvalidArgumentError("tojson: nesting too deep");
  auto newline = [&](int level) {
    if (indent < 0) return;
    out->push_back('\n');
    out->append(static_cast<size_t>(indent) * level, ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError("tojson: value is undefined");
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError("tojson: cannot serialise a function");
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += v.as_bool() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, v.as_int());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        *out += "NaN";
      } else if (std::isinf(d)) {
        *out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += FloatRepr(d);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      JsonString(v.as_string(), out);
      return absl::OkStatus();
    case Value::Kind::kArray: {
      const Array& a = v.as_array();
      if (a.empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      out->push_back('[');
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) *out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        if (absl::Status s = ToJsonImpl(a[i], indent, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back(']');
      return absl::OkStatus();
    }
    case Value::Kind::kObject: {
      const Object& o = v.as_object();
      if (o.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      out->push_back('{');
      for (size_t i = 0; i < o.size(); ++i) {
        if (i > 0) *out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        JsonString(o[i].first, out);
        *out += ": ";
        if (absl::Status s = ToJsonImpl(o[i].second, indent, depth + 1, out); !s.ok()) return s;
      }
      newline(depth);
      out->push_back('}');
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string Value::Str() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return as_string();
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind()) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(as_int());
    case Kind::kFloat:
      return FloatRepr(as_double());
    case Kind::kString:
      return ReprString(as_string());
    case Kind::kArray: {
      std::string out = "[";
      const Array& a = as_array();
      for (size_t i = 0; i < a.size(); ++i) {
        if (i > 0) out += ", ";
        out += a[i].Repr();
      }
      return out + "]";
    }
    case Kind::kObject: {
      std::string out = "{";
      const Object& o = as_object();
      for (size_t i = 0; i < o.size(); ++i) {
        if (i > 0) out += ", ";
        out += ReprString(o[i].first) + ": " + o[i].second.Repr();
      }
      return out + "}";
    }
    case Kind::kFunction:
      return "<function>";
  }
  return "";
}

absl::StatusOr<std::string> Value::ToJson(int indent) const {
  std::string out;
  if (absl::Status s = ToJsonImpl(*this, indent, 0, &out); !s.ok()) return s;
  return out;
}

}  // namespace pdserve::text::jinja
