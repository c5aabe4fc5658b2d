// Jinja2 subset interpreter (see jinja.h): the renderer, a tree walk over the
// AST from jinja_parse.h with Jinja's scoping (a for-loop body gets a fresh
// scope per iteration; if does not; macros see the template's top level and
// globals) and a work budget. Operators, filters and methods live in
// jinja_builtins.cc.
#include "text/jinja.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "text/jinja_builtins.h"
#include "text/jinja_parse.h"

namespace pdserve::text::jinja {
namespace {

constexpr int64_t kMaxSteps = 5'000'000;  // work units per render (see Renderer::Step)
constexpr int kMaxCallDepth = 64;

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const Object& globals, std::string* out) : globals_(globals), out_(out) {
    scopes_.emplace_back();
  }

  absl::StatusOr<Flow> Exec(const Body& body) {
    for (const auto& s : body) {
      absl::StatusOr<Flow> f = ExecStmt(*s);
      if (!f.ok() || *f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

 private:
  // Charges `cost` units of work (one per node evaluated, loop iteration, or
  // element / 256 bytes a call or operator produced).
  absl::Status Step(int line, int64_t cost = 1) {
    steps_ += cost;
    if (steps_ > kMaxSteps) {
      return absl::ResourceExhaustedError(
          absl::StrCat("chat template line ", line, ": rendering takes too long"));
    }
    return absl::OkStatus();
  }

  absl::Status Write(std::string_view s, int line) {
    if (out_->size() + s.size() > kMaxOutputBytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "chat template line ", line, ": output exceeds ", kMaxOutputBytes, " bytes"));
    }
    out_->append(s);
    return absl::OkStatus();
  }

  Value Lookup(std::string_view name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      for (const auto& [k, v] : *it) {
        if (k == name) return v;
      }
      if (it->is_macro_boundary) break;
    }
    if (!scopes_.empty()) {
      for (const auto& [k, v] : scopes_.front()) {
        if (k == name) return v;
      }
    }
    for (const auto& [k, v] : globals_) {
      if (k == name) return v;
    }
    if (name == "range" || name == "namespace" || name == "raise_exception")
      return GlobalFunction(name);
    return Value();
  }

  void Assign(const std::string& name, Value v) {
    auto& scope = scopes_.back();
    for (auto& [k, old] : scope) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    scope.emplace_back(name, std::move(v));
  }

  absl::StatusOr<Flow> ExecStmt(const Stmt& s) {
    if (absl::Status st = Step(s.line); !st.ok()) return st;
    switch (s.kind) {
      case StmtKind::kText:
        if (absl::Status st = Write(s.text, s.line); !st.ok()) return st;
        return Flow::kNormal;
      case StmtKind::kOutput: {
        absl::StatusOr<Value> v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        if (absl::Status st = Write(v->Str(), s.line); !st.ok()) return st;
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const auto& [cond, body] : s.branches) {
          absl::StatusOr<Value> c = Eval(*cond);
          if (!c.ok()) return c.status();
          if (c->Truthy()) return Exec(body);
        }
        return Exec(s.else_body);
      case StmtKind::kFor:
        return ExecFor(s);
      case StmtKind::kSet: {
        absl::StatusOr<Value> v = Eval(*s.expr);
        if (!v.ok()) return v.status();
        if (!s.attr.empty()) {
          const Value ns = Lookup(s.targets[0]);
          if (!ns.is_object()) {
            return RuntimeError(s.line, absl::StrCat("cannot set an attribute of ", s.targets[0]));
          }
          ns.Set(s.attr, *std::move(v));
          return Flow::kNormal;
        }
        if (s.targets.size() == 1) {
          Assign(s.targets[0], *std::move(v));
          return Flow::kNormal;
        }
        absl::StatusOr<Array> items = Iterate(*v, s.line);
        if (!items.ok()) return items.status();
        if (items->size() != s.targets.size())
          return RuntimeError(s.line, "cannot unpack: wrong length");
        for (size_t i = 0; i < s.targets.size(); ++i) Assign(s.targets[i], (*items)[i]);
        return Flow::kNormal;
      }
      case StmtKind::kSetBlock: {
        std::string captured;
        std::string* saved = out_;
        out_ = &captured;
        absl::StatusOr<Flow> f = Exec(s.body);
        out_ = saved;
        if (!f.ok()) return f.status();
        Assign(s.targets[0], Value(std::move(captured)));
        return Flow::kNormal;
      }
      case StmtKind::kMacro:
        Assign(s.attr, MakeMacro(s));
        return Flow::kNormal;
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kBody:
        return Exec(s.body);
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecFor(const Stmt& s) {
    absl::StatusOr<Value> iterable = Eval(*s.expr);
    if (!iterable.ok()) return iterable.status();
    absl::StatusOr<Array> all = Iterate(*iterable, s.line);
    if (!all.ok()) return all.status();
    auto bind = [&](const Value& item) -> absl::Status {
      if (s.targets.size() == 1) {
        Assign(s.targets[0], item);
        return absl::OkStatus();
      }
      absl::StatusOr<Array> parts = Iterate(item, s.line);
      if (!parts.ok()) return parts.status();
      if (parts->size() != s.targets.size())
        return RuntimeError(s.line, "cannot unpack: wrong length");
      for (size_t i = 0; i < s.targets.size(); ++i) Assign(s.targets[i], (*parts)[i]);
      return absl::OkStatus();
    };
    Array items;
    if (s.cond != nullptr) {
      for (const Value& item : *all) {
        if (absl::Status st = Step(s.line); !st.ok()) return st;
        scopes_.emplace_back();
        absl::Status b = bind(item);
        absl::StatusOr<Value> keep = b.ok() ? Eval(*s.cond) : absl::StatusOr<Value>(b);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    if (items.empty()) return Exec(s.else_body);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      if (absl::Status st = Step(s.line); !st.ok()) return st;
      scopes_.emplace_back();  // a fresh scope per iteration, as in Jinja
      Object loop = {{"index0", Value(i)},
                     {"index", Value(i + 1)},
                     {"revindex0", Value(n - i - 1)},
                     {"revindex", Value(n - i)},
                     {"first", Value(i == 0)},
                     {"last", Value(i == n - 1)},
                     {"length", Value(n)},
                     {"previtem", i > 0 ? items[i - 1] : Value()},
                     {"nextitem", i + 1 < n ? items[i + 1] : Value()}};
      Assign("loop", Value(std::move(loop)));
      absl::Status b = bind(items[i]);
      absl::StatusOr<Flow> f = b.ok() ? Exec(s.body) : absl::StatusOr<Flow>(b);
      scopes_.pop_back();
      if (!f.ok()) return f.status();
      if (*f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value MakeMacro(const Stmt& s) {
    const Stmt* def = &s;
    return Value(Function([this, def](std::span<const Value> args,
                                      const KwArgs& kwargs) -> absl::StatusOr<Value> {
      if (++call_depth_ > kMaxCallDepth) {
        --call_depth_;
        return absl::ResourceExhaustedError("macro calls nested too deeply");
      }
      if (args.size() > def->targets.size()) {
        --call_depth_;
        return RuntimeError(def->line, absl::StrCat("macro ", def->attr, ": too many arguments"));
      }
      scopes_.emplace_back();
      scopes_.back().is_macro_boundary = true;
      absl::Status status;
      for (size_t i = 0; i < def->targets.size() && status.ok(); ++i) {
        Value v;
        bool found = false;
        if (i < args.size()) {
          v = args[i];
          found = true;
        }
        for (const auto& [k, kv] : kwargs) {
          if (k == def->targets[i]) v = kv, found = true;
        }
        if (!found && def->defaults[i] != nullptr) {
          absl::StatusOr<Value> d = Eval(*def->defaults[i]);
          if (!d.ok()) {
            status = d.status();
            break;
          }
          v = *std::move(d);
        }
        Assign(def->targets[i], v);
      }
      std::string captured;
      std::string* saved = out_;
      out_ = &captured;
      absl::StatusOr<Flow> f = status.ok() ? Exec(def->body) : absl::StatusOr<Flow>(status);
      out_ = saved;
      scopes_.pop_back();
      --call_depth_;
      if (!f.ok()) return f.status();
      return Value(std::move(captured));
    }));
  }

  absl::StatusOr<std::vector<Value>> EvalArgs(const Expr& e, size_t first, KwArgs* kwargs) {
    std::vector<Value> args;
    for (size_t i = first; i < e.children.size(); ++i) {
      absl::StatusOr<Value> v = Eval(*e.children[i]);
      if (!v.ok()) return v.status();
      args.push_back(*std::move(v));
    }
    for (const auto& [k, x] : e.kwargs) {
      absl::StatusOr<Value> v = Eval(*x);
      if (!v.ok()) return v.status();
      kwargs->emplace_back(k, *std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    if (absl::Status st = Step(e.line); !st.ok()) return st;
    absl::StatusOr<Value> v = EvalNode(e);
    if (v.ok() && (e.kind == ExprKind::kCall || e.kind == ExprKind::kFilter ||
                   e.kind == ExprKind::kBinary || e.kind == ExprKind::kSlice)) {
      // Builtins can make big values cheaply: charge for their size.
      const int64_t cost = v->is_array()    ? static_cast<int64_t>(v->as_array().size())
                           : v->is_string() ? static_cast<int64_t>(v->as_string().size() / 256)
                                            : 0;
      if (absl::Status st = Step(e.line, cost); !st.ok()) return st;
    }
    return v;
  }

  absl::StatusOr<Value> EvalNode(const Expr& e) {
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return Lookup(e.name);
      case ExprKind::kAttr: {
        absl::StatusOr<Value> obj = Eval(*e.children[0]);
        if (!obj.ok()) return obj;
        return GetAttr(*obj, e.name, e.line);
      }
      case ExprKind::kItem: {
        absl::StatusOr<Value> obj = Eval(*e.children[0]);
        if (!obj.ok()) return obj;
        absl::StatusOr<Value> key = Eval(*e.children[1]);
        if (!key.ok()) return key;
        return GetItem(*obj, *key, e.line);
      }
      case ExprKind::kSlice:
        return EvalSlice(e);
      case ExprKind::kCall: {
        absl::StatusOr<Value> callee = Eval(*e.children[0]);
        if (!callee.ok()) return callee;
        if (!callee->is_function()) {
          return RuntimeError(e.line, callee->is_undefined() ? "call of an undefined function"
                                                             : "value is not callable");
        }
        KwArgs kwargs;
        absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1, &kwargs);
        if (!args.ok()) return args.status();
        absl::StatusOr<Value> r = callee->as_function()(*args, kwargs);
        if (!r.ok() && r.status().code() == absl::StatusCode::kInvalidArgument &&
            !absl::StartsWith(r.status().message(), "chat template line")) {
          return RuntimeError(e.line, std::string(r.status().message()));
        }
        return r;
      }
      case ExprKind::kFilter: {
        absl::StatusOr<Value> x = Eval(*e.children[0]);
        if (!x.ok()) return x;
        KwArgs kwargs;
        absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1, &kwargs);
        if (!args.ok()) return args.status();
        return ApplyFilter(e.name, *x, *args, kwargs, e.line);
      }
      case ExprKind::kTest: {
        absl::StatusOr<Value> x = Eval(*e.children[0]);
        if (!x.ok()) return x;
        KwArgs kwargs;
        absl::StatusOr<std::vector<Value>> args = EvalArgs(e, 1, &kwargs);
        if (!args.ok()) return args.status();
        absl::StatusOr<bool> r = ApplyTest(e.name, *x, *args, e.line);
        if (!r.ok()) return r.status();
        return Value(*r != e.negate);
      }
      case ExprKind::kNot: {
        absl::StatusOr<Value> x = Eval(*e.children[0]);
        if (!x.ok()) return x;
        return Value(!x->Truthy());
      }
      case ExprKind::kAnd:
      case ExprKind::kOr: {
        absl::StatusOr<Value> a = Eval(*e.children[0]);
        if (!a.ok()) return a;
        if (a->Truthy() == (e.kind == ExprKind::kOr)) return a;
        return Eval(*e.children[1]);
      }
      case ExprKind::kCond: {
        absl::StatusOr<Value> c = Eval(*e.children[0]);
        if (!c.ok()) return c;
        if (c->Truthy()) return Eval(*e.children[1]);
        if (e.children[2] == nullptr) return Value();
        return Eval(*e.children[2]);
      }
      case ExprKind::kUnary: {
        absl::StatusOr<Value> x = Eval(*e.children[0]);
        if (!x.ok()) return x;
        if (x->is_int()) return Value(e.name == "-" ? -x->as_int() : x->as_int());
        if (x->is_float() || x->is_bool())
          return Value(e.name == "-" ? -x->as_double() : x->as_double());
        return RuntimeError(e.line, absl::StrCat("bad operand for unary ", e.name));
      }
      case ExprKind::kBinary: {
        absl::StatusOr<Value> a = Eval(*e.children[0]);
        if (!a.ok()) return a;
        absl::StatusOr<Value> b = Eval(*e.children[1]);
        if (!b.ok()) return b;
        return Binary(e.name, *a, *b, e.line);
      }
      case ExprKind::kList:
      case ExprKind::kTuple: {
        Array items;
        for (const auto& c : e.children) {
          absl::StatusOr<Value> v = Eval(*c);
          if (!v.ok()) return v;
          items.push_back(*std::move(v));
        }
        return Value(std::move(items));
      }
      case ExprKind::kDict: {
        Value dict = Value(Object{});
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          absl::StatusOr<Value> k = Eval(*e.children[i]);
          if (!k.ok()) return k;
          absl::StatusOr<Value> v = Eval(*e.children[i + 1]);
          if (!v.ok()) return v;
          if (!k->is_string()) return RuntimeError(e.line, "dict keys must be strings");
          dict.Set(k->as_string(), *std::move(v));
        }
        return dict;
      }
    }
    return Value();
  }

  absl::StatusOr<Value> EvalSlice(const Expr& e) {
    absl::StatusOr<Value> obj = Eval(*e.children[0]);
    if (!obj.ok()) return obj;
    std::optional<int64_t> bounds[3];
    for (int i = 0; i < 3; ++i) {
      if (e.children[i + 1] == nullptr) continue;
      absl::StatusOr<Value> v = Eval(*e.children[i + 1]);
      if (!v.ok()) return v;
      if (v->is_none()) continue;
      if (!v->is_int()) return RuntimeError(e.line, "slice indices must be integers");
      bounds[i] = v->as_int();
    }
    const int64_t step = bounds[2].value_or(1);
    if (step == 0) return RuntimeError(e.line, "slice step cannot be zero");
    if (obj->is_array()) {
      Array out;
      for (size_t i : SliceIndices(obj->as_array().size(), bounds[0], bounds[1], step)) {
        out.push_back(obj->as_array()[i]);
      }
      return Value(std::move(out));
    }
    if (obj->is_string()) {
      const std::u32string cps = ToCodePoints(obj->as_string());
      std::u32string out;
      for (size_t i : SliceIndices(cps.size(), bounds[0], bounds[1], step)) out.push_back(cps[i]);
      return Value(FromCodePoints(out));
    }
    return RuntimeError(e.line, absl::StrCat("cannot slice ", obj->Repr()));
  }

  struct Scope : std::vector<std::pair<std::string, Value>> {
    bool is_macro_boundary = false;
  };

  const Object& globals_;
  std::string* out_;
  std::vector<Scope> scopes_;  // [0]: template top level
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  absl::StatusOr<std::unique_ptr<Program>> program = ParseProgram(source);
  if (!program.ok()) return program.status();
  Template t;
  t.program_ = std::shared_ptr<const Program>(*std::move(program));
  return t;
}

absl::StatusOr<std::string> Template::Render(const Object& globals) const {
  if (program_ == nullptr) return absl::FailedPreconditionError("empty template");
  std::string out;
  Renderer renderer(globals, &out);
  absl::StatusOr<Flow> f = renderer.Exec(program_->body);
  if (!f.ok()) return f.status();
  return out;
}

}  // namespace pdserve::text::jinja
