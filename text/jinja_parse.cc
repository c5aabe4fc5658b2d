// Lexer and parser of the Jinja subset (see jinja_parse.h).
#include "text/jinja_parse.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/utf8.h"

namespace pdserve::text::jinja {
namespace {

constexpr int kMaxParseDepth = 200;

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status SyntaxError(int line, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", Absl(what)));
}

// ---------------------------------------------------------------- lexer --

enum class Tok {
  kText,
  kBlockBegin,
  kBlockEnd,
  kVarBegin,
  kVarEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  Tok type;
  std::string text;  // text, name, string value or operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

bool IsSpaceChar(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's str.splitlines()+join("\n") for the common line ends, which also
// drops one trailing newline (keep_trailing_newline=False).
std::string NormalizeNewlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      size_t tag = pos;
      while (true) {
        tag = src_.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= src_.size()) {
          tag = std::string::npos;
          break;
        }
        const char k = src_[tag + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++tag;
      }
      if (tag == std::string::npos) {
        Emit(Tok::kText, src_.substr(pos));
        break;
      }
      const char kind = src_[tag + 1];
      const char marker = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      std::string text = src_.substr(pos, tag - pos);
      if (marker == '-') {
        while (!text.empty() && IsSpaceChar(text.back())) text.pop_back();
      } else if ((kind == '%' || kind == '#') && marker != '+') {
        // lstrip_blocks: drop spaces/tabs between a line start and the tag.
        const size_t l = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
        if ((l > 0 || line_starting) && text.find_first_not_of(" \t", l) == std::string::npos) {
          text.resize(l);
        }
      }
      if (!text.empty()) Emit(Tok::kText, text);
      line_ = LineAt(tag);
      size_t body = tag + 2 + ((marker == '-' || marker == '+') ? 1 : 0);
      char end_marker = '\0';
      size_t after;
      if (kind == '#') {
        const size_t end = src_.find("#}", body);
        if (end == std::string::npos) return SyntaxError(line_, "unclosed comment");
        if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+'))
          end_marker = src_[end - 1];
        after = end + 2;
      } else {
        Emit(kind == '%' ? Tok::kBlockBegin : Tok::kVarBegin, "");
        absl::StatusOr<size_t> end = LexTag(body, kind, &end_marker);
        if (!end.ok()) return end.status();
        Emit(kind == '%' ? Tok::kBlockEnd : Tok::kVarEnd, "");
        after = *end;
      }
      const size_t before = after;
      if (end_marker == '-') {
        while (after < src_.size() && IsSpaceChar(src_[after])) ++after;
      } else if ((kind == '%' || kind == '#') && end_marker != '+' && after < src_.size() &&
                 src_[after] == '\n') {
        ++after;  // trim_blocks
      }
      line_starting = after > before && src_[after - 1] == '\n';
      pos = after;
    }
    Emit(Tok::kEof, "");
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_++] == '\n') ++line_count_;
    }
    return line_count_;
  }

  void Emit(Tok type, std::string text) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  // Lexes expression tokens from `pos` up to the tag end; returns the offset
  // after the closing delimiter and sets `*end_marker` to '-', '+' or 0.
  absl::StatusOr<size_t> LexTag(size_t pos, char kind, char* end_marker) {
    int depth = 0;  // open (, [, { inside the tag
    const std::string close = kind == '%' ? "%}" : "}}";
    while (true) {
      while (pos < src_.size() && IsSpaceChar(src_[pos])) {
        if (src_[pos] == '\n') ++line_;
        ++pos;
      }
      if (pos >= src_.size()) return SyntaxError(line_, "unclosed tag");
      if (depth == 0 || kind == '%') {
        for (char m : {'-', '+'}) {
          if (src_[pos] == m && src_.compare(pos + 1, 2, close) == 0 && (m == '-' || kind == '%')) {
            *end_marker = m;
            return pos + 3;
          }
        }
        if (src_.compare(pos, 2, close) == 0 && (kind == '%' || depth == 0)) {
          *end_marker = '\0';
          return pos + 2;
        }
      }
      const char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
        Emit(Tok::kName, src_.substr(pos, end - pos));
        pos = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t end = pos;
        bool is_float = false;
        while (end < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[end])) || src_[end] == '_'))
          ++end;
        if (end + 1 < src_.size() && src_[end] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
          is_float = true;
          ++end;
          while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
        }
        if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
          size_t e = end + 1;
          if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
          if (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) {
            is_float = true;
            end = e;
            while (end < src_.size() && std::isdigit(static_cast<unsigned char>(src_[end]))) ++end;
          }
        }
        std::string digits;
        for (size_t i = pos; i < end; ++i) {
          if (src_[i] != '_') digits.push_back(src_[i]);
        }
        Token t;
        t.line = line_;
        if (is_float) {
          t.type = Tok::kFloat;
          t.float_value = std::strtod(digits.c_str(), nullptr);
        } else {
          t.type = Tok::kInt;
          errno = 0;
          t.int_value = std::strtoll(digits.c_str(), nullptr, 10);
          if (errno == ERANGE) return SyntaxError(line_, "integer literal too large");
        }
        tokens_.push_back(std::move(t));
        pos = end;
      } else if (c == '\'' || c == '"') {
        std::string value;
        size_t i = pos + 1;
        while (true) {
          if (i >= src_.size()) return SyntaxError(line_, "unclosed string literal");
          const char d = src_[i];
          if (d == c) break;
          if (d == '\n') ++line_;
          if (d == '\\' && i + 1 < src_.size()) {
            const char e = src_[i + 1];
            i += 2;
            switch (e) {
              case 'n':
                value.push_back('\n');
                break;
              case 't':
                value.push_back('\t');
                break;
              case 'r':
                value.push_back('\r');
                break;
              case '\\':
              case '\'':
              case '"':
                value.push_back(e);
                break;
              case '\n':
                break;  // line continuation
              case 'u':
              case 'x': {
                const size_t n = e == 'u' ? 4 : 2;
                if (i + n > src_.size()) return SyntaxError(line_, "bad escape in string");
                char32_t cp = 0;
                for (size_t k = 0; k < n; ++k) {
                  const char h = src_[i + k];
                  const int v = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                                : (h >= 'a' && h <= 'f')                    ? h - 'a' + 10
                                : (h >= 'A' && h <= 'F')                    ? h - 'A' + 10
                                                                            : -1;
                  if (v < 0) return SyntaxError(line_, "bad escape in string");
                  cp = cp * 16 + v;
                }
                i += n;
                if (cp >= 0xD800 && cp <= 0xDFFF) cp = utf8::kReplacementChar;
                utf8::Append(cp, &value);
                break;
              }
              default:  // Python keeps unknown escapes as written
                value.push_back('\\');
                value.push_back(e);
            }
            continue;
          }
          value.push_back(d);
          ++i;
        }
        Emit(Tok::kString, std::move(value));
        pos = i + 1;
      } else {
        static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (std::string_view two : kTwo) {
          if (src_.compare(pos, 2, two) == 0) op = std::string(two);
        }
        if (op.empty()) {
          if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos) {
            return SyntaxError(line_,
                               absl::StrCat("unexpected character '", std::string(1, c), "'"));
          }
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        Emit(Tok::kOp, op);
        pos += op.size();
      }
    }
  }

  std::string src_;
  std::vector<Token> tokens_;
  int line_ = 1;
  size_t line_pos_ = 0;
  int line_count_ = 1;
};

const std::set<std::string, std::less<>>& KnownFilters() {
  static const auto* names = new std::set<std::string, std::less<>>{
      "abs",    "capitalize", "count",      "d",          "default",  "first",   "float",
      "indent", "int",        "items",      "join",       "last",     "length",  "list",
      "lower",  "map",        "reject",     "rejectattr", "replace",  "reverse", "round",
      "safe",   "select",     "selectattr", "sort",       "string",   "sum",     "title",
      "tojson", "trim",       "unique",     "upper",      "wordcount"};
  return *names;
}

const std::set<std::string, std::less<>>& KnownTests() {
  static const auto* names = new std::set<std::string, std::less<>>{
      "boolean",  "callable", "defined", "divisibleby", "eq",      "equalto", "==",
      "even",     "false",    "float",   "ge",          "gt",      "in",      "integer",
      "iterable", "le",       "lower",   "lt",          "mapping", "ne",      "none",
      "number",   "odd",      "sameas",  "sequence",    "string",  "true",    "undefined",
      "upper",    "!=",       "<",       ">",           "<=",      ">="};
  return *names;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseTemplate() {
    std::string end;
    absl::StatusOr<Body> body = ParseBody({}, &end);
    if (!body.ok()) return body.status();
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == Tok::kName && Peek(ahead).text == name;
  }
  absl::Status Expect(std::string_view op) {
    if (!IsOp(op)) return SyntaxError(Peek().line, absl::StrCat("expected '", Absl(op), "'"));
    ++i_;
    return absl::OkStatus();
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().type != Tok::kBlockEnd) {
      return SyntaxError(Peek().line, absl::StrCat("expected end of tag, got '", Peek().text, "'"));
    }
    ++i_;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().type != Tok::kName) return SyntaxError(Peek().line, "expected a name");
    return t_[i_++].text;
  }

  // Parses statements until a block tag named in `ends` (consumed up to its
  // name; the caller parses the rest of that tag) or end of input.
  absl::StatusOr<Body> ParseBody(const std::vector<std::string_view>& ends, std::string* end) {
    Body body;
    while (true) {
      const Token& tok = Peek();
      if (tok.type == Tok::kEof) {
        if (!ends.empty()) {
          return SyntaxError(tok.line, absl::StrCat("missing {% ", Absl(ends.back()), " %}"));
        }
        return body;
      }
      if (tok.type == Tok::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->text = tok.text;
        body.push_back(std::move(s));
        ++i_;
        continue;
      }
      if (tok.type == Tok::kVarBegin) {
        ++i_;
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->line = tok.line;
        absl::StatusOr<std::unique_ptr<Expr>> e = ParseExpr();
        if (!e.ok()) return e.status();
        s->expr = *std::move(e);
        if (Peek().type != Tok::kVarEnd) return SyntaxError(Peek().line, "expected '}}'");
        ++i_;
        body.push_back(std::move(s));
        continue;
      }
      if (tok.type != Tok::kBlockBegin) return SyntaxError(tok.line, "unexpected token");
      const Token& name = Peek(1);
      if (name.type != Tok::kName) return SyntaxError(name.line, "expected a tag name");
      if (std::find(ends.begin(), ends.end(), name.text) != ends.end()) {
        *end = name.text;
        i_ += 2;
        return body;
      }
      i_ += 2;
      absl::StatusOr<std::unique_ptr<Stmt>> s = ParseTag(name.text, name.line);
      if (!s.ok()) return s.status();
      body.push_back(*std::move(s));
    }
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseTag(const std::string& tag, int line) {
    auto s = std::make_unique<Stmt>();
    s->line = line;
    if (tag == "if") {
      s->kind = StmtKind::kIf;
      while (true) {
        absl::StatusOr<std::unique_ptr<Expr>> cond = ParseExpr();
        if (!cond.ok()) return cond.status();
        if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
        std::string end;
        absl::StatusOr<Body> body = ParseBody({"elif", "else", "endif"}, &end);
        if (!body.ok()) return body.status();
        s->branches.emplace_back(*std::move(cond), *std::move(body));
        if (end == "elif") continue;
        if (end == "else") {
          if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
          absl::StatusOr<Body> e = ParseBody({"endif"}, &end);
          if (!e.ok()) return e.status();
          s->else_body = *std::move(e);
        }
        if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
        return s;
      }
    }
    if (tag == "for") {
      s->kind = StmtKind::kFor;
      do {
        absl::StatusOr<std::string> n = ExpectName();
        if (!n.ok()) return n.status();
        s->targets.push_back(*n);
      } while (IsOp(",") && (++i_, true));
      if (!IsName("in")) return SyntaxError(Peek().line, "expected 'in' in for");
      ++i_;
      absl::StatusOr<std::unique_ptr<Expr>> iter = ParseExpr(/*allow_cond=*/false);
      if (!iter.ok()) return iter.status();
      s->expr = *std::move(iter);
      if (IsName("if")) {
        ++i_;
        absl::StatusOr<std::unique_ptr<Expr>> cond = ParseExpr(/*allow_cond=*/false);
        if (!cond.ok()) return cond.status();
        s->cond = *std::move(cond);
      }
      if (IsName("recursive")) return SyntaxError(Peek().line, "recursive loops are not supported");
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      std::string end;
      absl::StatusOr<Body> body = ParseBody({"else", "endfor"}, &end);
      if (!body.ok()) return body.status();
      s->body = *std::move(body);
      if (end == "else") {
        if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
        absl::StatusOr<Body> e = ParseBody({"endfor"}, &end);
        if (!e.ok()) return e.status();
        s->else_body = *std::move(e);
      }
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      return s;
    }
    if (tag == "set") {
      absl::StatusOr<std::string> n = ExpectName();
      if (!n.ok()) return n.status();
      s->targets.push_back(*n);
      if (IsOp(".")) {
        ++i_;
        absl::StatusOr<std::string> attr = ExpectName();
        if (!attr.ok()) return attr.status();
        s->attr = *attr;
      } else {
        while (IsOp(",")) {
          ++i_;
          absl::StatusOr<std::string> more = ExpectName();
          if (!more.ok()) return more.status();
          s->targets.push_back(*more);
        }
      }
      if (Peek().type == Tok::kBlockEnd) {
        if (!s->attr.empty() || s->targets.size() != 1) {
          return SyntaxError(line, "block set needs a single name");
        }
        ++i_;
        s->kind = StmtKind::kSetBlock;
        std::string end;
        absl::StatusOr<Body> body = ParseBody({"endset"}, &end);
        if (!body.ok()) return body.status();
        s->body = *std::move(body);
        if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
        return s;
      }
      s->kind = StmtKind::kSet;
      if (absl::Status st = Expect("="); !st.ok()) return st;
      absl::StatusOr<std::unique_ptr<Expr>> value = ParseTupleOrExpr();
      if (!value.ok()) return value.status();
      s->expr = *std::move(value);
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      return s;
    }
    if (tag == "macro") {
      s->kind = StmtKind::kMacro;
      absl::StatusOr<std::string> n = ExpectName();
      if (!n.ok()) return n.status();
      s->attr = *n;  // macro name
      if (absl::Status st = Expect("("); !st.ok()) return st;
      while (!IsOp(")")) {
        absl::StatusOr<std::string> param = ExpectName();
        if (!param.ok()) return param.status();
        s->targets.push_back(*param);
        std::unique_ptr<Expr> def;
        if (IsOp("=")) {
          ++i_;
          absl::StatusOr<std::unique_ptr<Expr>> d = ParseExpr();
          if (!d.ok()) return d.status();
          def = *std::move(d);
        }
        s->defaults.push_back(std::move(def));
        if (!IsOp(",")) break;
        ++i_;
      }
      if (absl::Status st = Expect(")"); !st.ok()) return st;
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      std::string end;
      absl::StatusOr<Body> body = ParseBody({"endmacro"}, &end);
      if (!body.ok()) return body.status();
      s->body = *std::move(body);
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      return s;
    }
    if (tag == "break" || tag == "continue") {
      s->kind = tag == "break" ? StmtKind::kBreak : StmtKind::kContinue;
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      return s;
    }
    if (tag == "generation") {
      s->kind = StmtKind::kBody;
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      std::string end;
      absl::StatusOr<Body> body = ParseBody({"endgeneration"}, &end);
      if (!body.ok()) return body.status();
      s->body = *std::move(body);
      if (absl::Status st = ExpectBlockEnd(); !st.ok()) return st;
      return s;
    }
    return SyntaxError(line, absl::StrCat("unsupported tag {% ", tag, " %}"));
  }

  std::unique_ptr<Expr> Node(ExprKind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `a, b` (a tuple) or a single expression: set values.
  absl::StatusOr<std::unique_ptr<Expr>> ParseTupleOrExpr() {
    absl::StatusOr<std::unique_ptr<Expr>> first = ParseExpr();
    if (!first.ok() || !IsOp(",")) return first;
    auto tuple = Node(ExprKind::kTuple, Peek().line);
    tuple->children.push_back(*std::move(first));
    while (IsOp(",")) {
      ++i_;
      absl::StatusOr<std::unique_ptr<Expr>> next = ParseExpr();
      if (!next.ok()) return next.status();
      tuple->children.push_back(*std::move(next));
    }
    return tuple;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseExpr(bool allow_cond = true) {
    if (++depth_ > kMaxParseDepth) return SyntaxError(Peek().line, "expression nested too deeply");
    absl::StatusOr<std::unique_ptr<Expr>> e = ParseOr();
    if (e.ok() && allow_cond && IsName("if")) {
      const int line = Peek().line;
      ++i_;
      absl::StatusOr<std::unique_ptr<Expr>> cond = ParseOr();
      if (!cond.ok()) return cond.status();
      auto node = Node(ExprKind::kCond, line);
      node->children.push_back(*std::move(cond));
      node->children.push_back(*std::move(e));
      if (IsName("else")) {
        ++i_;
        absl::StatusOr<std::unique_ptr<Expr>> other = ParseExpr();
        if (!other.ok()) return other.status();
        node->children.push_back(*std::move(other));
      } else {
        node->children.push_back(nullptr);
      }
      e = std::move(node);
    }
    --depth_;
    return e;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseOr() {
    absl::StatusOr<std::unique_ptr<Expr>> left = ParseAnd();
    while (left.ok() && IsName("or")) {
      const int line = Peek().line;
      ++i_;
      absl::StatusOr<std::unique_ptr<Expr>> right = ParseAnd();
      if (!right.ok()) return right.status();
      auto node = Node(ExprKind::kOr, line);
      node->children.push_back(*std::move(left));
      node->children.push_back(*std::move(right));
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseAnd() {
    absl::StatusOr<std::unique_ptr<Expr>> left = ParseNot();
    while (left.ok() && IsName("and")) {
      const int line = Peek().line;
      ++i_;
      absl::StatusOr<std::unique_ptr<Expr>> right = ParseNot();
      if (!right.ok()) return right.status();
      auto node = Node(ExprKind::kAnd, line);
      node->children.push_back(*std::move(left));
      node->children.push_back(*std::move(right));
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseNot() {
    if (IsName("not")) {
      const int line = Peek().line;
      ++i_;
      if (++depth_ > kMaxParseDepth) return SyntaxError(line, "expression nested too deeply");
      absl::StatusOr<std::unique_ptr<Expr>> x = ParseNot();
      --depth_;
      if (!x.ok()) return x.status();
      auto node = Node(ExprKind::kNot, line);
      node->children.push_back(*std::move(x));
      return node;
    }
    return ParseCompare();
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseCompare() {
    absl::StatusOr<std::unique_ptr<Expr>> left = ParseMath1();
    if (!left.ok()) return left;
    std::unique_ptr<Expr> result;  // chained comparisons: a < b < c
    std::unique_ptr<Expr> prev_right;
    while (true) {
      std::string op;
      const int line = Peek().line;
      if (Peek().type == Tok::kOp &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = Peek().text;
        ++i_;
      } else if (IsName("in")) {
        op = "in";
        ++i_;
      } else if (IsName("not") && IsName("in", 1)) {
        op = "not in";
        i_ += 2;
      } else {
        break;
      }
      absl::StatusOr<std::unique_ptr<Expr>> right = ParseMath1();
      if (!right.ok()) return right.status();
      auto cmp = Node(ExprKind::kBinary, line);
      cmp->name = op;
      if (result == nullptr) {
        cmp->children.push_back(*std::move(left));
        cmp->children.push_back(*std::move(right));
        result = std::move(cmp);
        continue;
      }
      // a < b < c  ==  (a < b) and (b < c); b is re-evaluated (pure here).
      return SyntaxError(line, "chained comparisons are not supported");
    }
    if (result != nullptr) return result;
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseBinaryLevel(
      const std::vector<std::string_view>& ops,
      absl::StatusOr<std::unique_ptr<Expr>> (Parser::*next)()) {
    absl::StatusOr<std::unique_ptr<Expr>> left = (this->*next)();
    while (left.ok() && Peek().type == Tok::kOp &&
           std::find(ops.begin(), ops.end(), Peek().text) != ops.end()) {
      auto node = Node(ExprKind::kBinary, Peek().line);
      node->name = t_[i_++].text;
      absl::StatusOr<std::unique_ptr<Expr>> right = (this->*next)();
      if (!right.ok()) return right.status();
      node->children.push_back(*std::move(left));
      node->children.push_back(*std::move(right));
      left = std::move(node);
    }
    return left;
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseMath1() {
    return ParseBinaryLevel({"+", "-"}, &Parser::ParseConcat);
  }
  absl::StatusOr<std::unique_ptr<Expr>> ParseConcat() {
    return ParseBinaryLevel({"~"}, &Parser::ParseMath2);
  }
  absl::StatusOr<std::unique_ptr<Expr>> ParseMath2() {
    return ParseBinaryLevel({"*", "/", "//", "%"}, &Parser::ParsePow);
  }
  absl::StatusOr<std::unique_ptr<Expr>> ParsePow() {
    return ParseBinaryLevel({"**"}, &Parser::ParseUnaryWithFilters);
  }
  absl::StatusOr<std::unique_ptr<Expr>> ParseUnaryWithFilters() { return ParseUnary(true); }

  absl::StatusOr<std::unique_ptr<Expr>> ParseUnary(bool with_filter) {
    std::unique_ptr<Expr> node;
    if (IsOp("-") || IsOp("+")) {
      const int line = Peek().line;
      const std::string op = t_[i_++].text;
      if (++depth_ > kMaxParseDepth) return SyntaxError(line, "expression nested too deeply");
      absl::StatusOr<std::unique_ptr<Expr>> x = ParseUnary(false);
      --depth_;
      if (!x.ok()) return x.status();
      node = Node(ExprKind::kUnary, line);
      node->name = op;
      node->children.push_back(*std::move(x));
    } else {
      absl::StatusOr<std::unique_ptr<Expr>> p = ParsePrimary();
      if (!p.ok()) return p.status();
      node = *std::move(p);
    }
    absl::StatusOr<std::unique_ptr<Expr>> post = ParsePostfix(std::move(node));
    if (!post.ok() || !with_filter) return post;
    return ParseFilterExpr(*std::move(post));
  }

  absl::Status ParseArgs(Expr* call) {
    // At '(' .
    ++i_;
    while (!IsOp(")")) {
      if (Peek().type == Tok::kName && IsOp("=", 1)) {
        std::string key = t_[i_].text;
        i_ += 2;
        absl::StatusOr<std::unique_ptr<Expr>> v = ParseExpr();
        if (!v.ok()) return v.status();
        call->kwargs.emplace_back(std::move(key), *std::move(v));
      } else {
        if (!call->kwargs.empty()) {
          return SyntaxError(Peek().line, "positional argument after keyword argument");
        }
        absl::StatusOr<std::unique_ptr<Expr>> v = ParseExpr();
        if (!v.ok()) return v.status();
        call->children.push_back(*std::move(v));
      }
      if (!IsOp(",")) break;
      ++i_;
    }
    return Expect(")");
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParsePostfix(std::unique_ptr<Expr> node) {
    while (true) {
      const int line = Peek().line;
      if (IsOp(".")) {
        ++i_;
        if (Peek().type == Tok::kInt) {  // x.0 == x[0]
          auto item = Node(ExprKind::kItem, line);
          item->children.push_back(std::move(node));
          auto key = Node(ExprKind::kLiteral, line);
          key->literal = Value(t_[i_++].int_value);
          item->children.push_back(std::move(key));
          node = std::move(item);
          continue;
        }
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        auto attr = Node(ExprKind::kAttr, line);
        attr->name = *name;
        attr->children.push_back(std::move(node));
        node = std::move(attr);
      } else if (IsOp("[")) {
        ++i_;
        std::unique_ptr<Expr> parts[3];
        int colons = 0;
        while (!IsOp("]")) {
          if (IsOp(":")) {
            if (++colons > 2) return SyntaxError(line, "bad slice");
            ++i_;
            continue;
          }
          absl::StatusOr<std::unique_ptr<Expr>> e = ParseExpr();
          if (!e.ok()) return e.status();
          if (parts[colons] != nullptr) return SyntaxError(line, "expected ']'");
          parts[colons] = *std::move(e);
        }
        ++i_;
        if (colons == 0) {
          if (parts[0] == nullptr) return SyntaxError(line, "empty subscript");
          auto item = Node(ExprKind::kItem, line);
          item->children.push_back(std::move(node));
          item->children.push_back(std::move(parts[0]));
          node = std::move(item);
        } else {
          auto slice = Node(ExprKind::kSlice, line);
          slice->children.push_back(std::move(node));
          for (auto& p : parts) slice->children.push_back(std::move(p));
          node = std::move(slice);
        }
      } else if (IsOp("(")) {
        auto call = Node(ExprKind::kCall, line);
        call->children.push_back(std::move(node));
        if (absl::Status s = ParseArgs(call.get()); !s.ok()) return s;
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParseFilterExpr(std::unique_ptr<Expr> node) {
    while (true) {
      const int line = Peek().line;
      if (IsOp("|")) {
        ++i_;
        absl::StatusOr<std::string> name = ExpectName();
        if (!name.ok()) return name.status();
        if (!KnownFilters().contains(*name)) {
          return SyntaxError(line, absl::StrCat("unsupported filter '", *name, "'"));
        }
        auto f = Node(ExprKind::kFilter, line);
        f->name = *name;
        f->children.push_back(std::move(node));
        if (IsOp("(")) {
          if (absl::Status s = ParseArgs(f.get()); !s.ok()) return s;
        }
        node = std::move(f);
      } else if (IsName("is")) {
        ++i_;
        auto test = Node(ExprKind::kTest, line);
        if (IsName("not")) {
          test->negate = true;
          ++i_;
        }
        std::string name;
        if (Peek().type == Tok::kName) {
          name = t_[i_++].text;
        } else if (Peek().type == Tok::kOp) {
          name = t_[i_++].text;  // `is ==`-style tests
        }
        if (!KnownTests().contains(name)) {
          return SyntaxError(line, absl::StrCat("unsupported test '", name, "'"));
        }
        test->name = name == "none" || name == "None" ? "none" : name;
        test->children.push_back(std::move(node));
        if (IsOp("(")) {
          if (absl::Status s = ParseArgs(test.get()); !s.ok()) return s;
        } else if (Peek().type == Tok::kString || Peek().type == Tok::kInt ||
                   Peek().type == Tok::kFloat ||
                   (Peek().type == Tok::kName && !IsName("and") && !IsName("or") &&
                    !IsName("else") && !IsName("if") && !IsName("in") && !IsName("is") &&
                    !IsName("not"))) {
          absl::StatusOr<std::unique_ptr<Expr>> arg = ParsePrimary();
          if (!arg.ok()) return arg.status();
          absl::StatusOr<std::unique_ptr<Expr>> post = ParsePostfix(*std::move(arg));
          if (!post.ok()) return post.status();
          test->children.push_back(*std::move(post));
        }
        node = std::move(test);
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<std::unique_ptr<Expr>> ParsePrimary() {
    const Token& tok = Peek();
    const int line = tok.line;
    switch (tok.type) {
      case Tok::kString: {
        std::string s;
        while (Peek().type == Tok::kString) s += t_[i_++].text;  // adjacent literals join
        auto e = Node(ExprKind::kLiteral, line);
        e->literal = Value(std::move(s));
        return e;
      }
      case Tok::kInt: {
        auto e = Node(ExprKind::kLiteral, line);
        e->literal = Value(tok.int_value);
        ++i_;
        return e;
      }
      case Tok::kFloat: {
        auto e = Node(ExprKind::kLiteral, line);
        e->literal = Value(tok.float_value);
        ++i_;
        return e;
      }
      case Tok::kName: {
        auto e = Node(ExprKind::kLiteral, line);
        const std::string& n = tok.text;
        if (n == "true" || n == "True") {
          e->literal = Value(true);
        } else if (n == "false" || n == "False") {
          e->literal = Value(false);
        } else if (n == "none" || n == "None") {
          e->literal = Value::None();
        } else {
          e->kind = ExprKind::kName;
          e->name = n;
        }
        ++i_;
        return e;
      }
      case Tok::kOp:
        break;
      default:
        return SyntaxError(line, "expected an expression");
    }
    if (IsOp("(")) {
      ++i_;
      if (IsOp(")")) {
        ++i_;
        return Node(ExprKind::kTuple, line);
      }
      absl::StatusOr<std::unique_ptr<Expr>> inner = ParseExpr();
      if (!inner.ok()) return inner.status();
      if (IsOp(",")) {
        auto tuple = Node(ExprKind::kTuple, line);
        tuple->children.push_back(*std::move(inner));
        while (IsOp(",")) {
          ++i_;
          if (IsOp(")")) break;
          absl::StatusOr<std::unique_ptr<Expr>> next = ParseExpr();
          if (!next.ok()) return next.status();
          tuple->children.push_back(*std::move(next));
        }
        if (absl::Status s = Expect(")"); !s.ok()) return s;
        return tuple;
      }
      if (absl::Status s = Expect(")"); !s.ok()) return s;
      return inner;
    }
    if (IsOp("[")) {
      ++i_;
      auto list = Node(ExprKind::kList, line);
      while (!IsOp("]")) {
        absl::StatusOr<std::unique_ptr<Expr>> e = ParseExpr();
        if (!e.ok()) return e.status();
        list->children.push_back(*std::move(e));
        if (!IsOp(",")) break;
        ++i_;
      }
      if (absl::Status s = Expect("]"); !s.ok()) return s;
      return list;
    }
    if (IsOp("{")) {
      ++i_;
      auto dict = Node(ExprKind::kDict, line);
      while (!IsOp("}")) {
        absl::StatusOr<std::unique_ptr<Expr>> k = ParseExpr();
        if (!k.ok()) return k.status();
        if (absl::Status s = Expect(":"); !s.ok()) return s;
        absl::StatusOr<std::unique_ptr<Expr>> v = ParseExpr();
        if (!v.ok()) return v.status();
        dict->children.push_back(*std::move(k));
        dict->children.push_back(*std::move(v));
        if (!IsOp(",")) break;
        ++i_;
      }
      if (absl::Status s = Expect("}"); !s.ok()) return s;
      return dict;
    }
    return SyntaxError(line, absl::StrCat("unexpected '", tok.text, "'"));
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

bool IsKnownFilter(std::string_view name) { return KnownFilters().contains(name); }
bool IsKnownTest(std::string_view name) { return KnownTests().contains(name); }

absl::StatusOr<std::unique_ptr<Program>> ParseProgram(std::string_view source) {
  Lexer lexer(NormalizeNewlines(source));
  absl::StatusOr<std::vector<Token>> tokens = lexer.Run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(*std::move(tokens));
  absl::StatusOr<Body> body = parser.ParseTemplate();
  if (!body.ok()) return body.status();
  auto program = std::make_unique<Program>();
  program->body = *std::move(body);
  return program;
}

}  // namespace pdserve::text::jinja
