// Parsing for the Jinja subset interpreter (text/jinja.h): a lexer that
// applies Hugging Face's chat-template whitespace rules (trim_blocks,
// lstrip_blocks, -/+ markers, one trailing newline dropped) and a
// recursive-descent parser to the AST below, which text/jinja.cc walks.
// Internal to the interpreter.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "text/jinja_value.h"

namespace pdserve::text::jinja {

enum class ExprKind {
  kLiteral,
  kName,
  kAttr,
  kItem,
  kSlice,
  kCall,
  kFilter,
  kTest,
  kUnary,
  kBinary,
  kAnd,
  kOr,
  kNot,
  kCond,
  kList,
  kTuple,
  kDict
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;  // name, attribute, filter, test or operator
  bool negate = false;
  // Operands: kAttr [obj]; kItem [obj, key]; kSlice [obj, start?, stop?,
  // step?]; kCall [callee, args...]; kFilter/kTest [operand, args...];
  // kUnary/kNot [x]; kBinary/kAnd/kOr [a, b]; kCond [cond, then, else?];
  // kList/kTuple elements; kDict [k0, v0, k1, v1, ...]. Absent ones are null.
  std::vector<std::unique_ptr<Expr>> children;
  std::vector<std::pair<std::string, std::unique_ptr<Expr>>> kwargs;
};

enum class StmtKind {
  kText,
  kOutput,
  kIf,
  kFor,
  kSet,
  kSetBlock,
  kMacro,
  kBreak,
  kContinue,
  kBody
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  StmtKind kind;
  int line = 0;
  std::string text;                  // kText
  std::unique_ptr<Expr> expr;        // kOutput, kSet value, kFor iterable
  std::unique_ptr<Expr> cond;        // kFor inline filter
  std::vector<std::string> targets;  // kFor / kSet names; kSetBlock [name]
  std::string attr;                  // kSet ns.attr: targets = [ns]
  std::vector<std::pair<std::unique_ptr<Expr>, Body>> branches;  // kIf
  Body body;                                                     // kFor, kSetBlock, kMacro, kBody
  Body else_body;                                                // kIf, kFor
  std::vector<std::unique_ptr<Expr>> defaults;                   // kMacro, per target (null: none)
};

// A parsed template; immutable, shared by concurrent renders.
struct Program {
  Body body;
};

// INVALID_ARGUMENT "chat template line N: ..." on syntax errors and on tags,
// filters or tests outside the subset.
absl::StatusOr<std::unique_ptr<Program>> ParseProgram(std::string_view source);

// Filters and tests the renderer implements (text/jinja_builtins.h).
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

}  // namespace pdserve::text::jinja
