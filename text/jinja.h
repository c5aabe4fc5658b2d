// A Jinja2 subset interpreter, enough for the chat templates models ship in
// tokenizer_config.json (Llama 3.x, Qwen2/2.5/3, and templates written like
// them). It mirrors the environment Hugging Face transformers renders chat
// templates in: trim_blocks and lstrip_blocks on, one trailing newline of the
// source dropped, loop controls (break/continue) enabled, tojson as
// json.dumps(ensure_ascii=False).
//
// Supported:
//   tags: if/elif/else, for (tuple targets, inline `if`, else, loop.*),
//         set (name, tuple, ns.attr, block form), macro, break, continue,
//         generation (rendered as its body), comments, whitespace control
//         (-, +);
//   expressions: literals (str, int, float, bool, none, list, tuple, dict),
//         . and [] access, slices, calls with keyword arguments, filters,
//         `is [not]` tests, not/and/or, comparisons, in / not in,
//         + - * / // % ** ~, conditional expressions;
//   filters: abs, capitalize, count, d/default, first, float, indent, int,
//         items, join, last, length, list, lower, map, reject, rejectattr,
//         replace, reverse, round, safe, select, selectattr, sort, string,
//         sum, title, tojson, trim, unique, upper, wordcount;
//   tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false,
//         float, ge/gt/le/lt/ne, in, integer, iterable, lower, mapping, none,
//         number, odd, sameas, sequence, string, true, undefined, upper;
//   methods: str.{capitalize, endswith, find, join, lower, lstrip, replace,
//         rstrip, split, startswith, strip, title, upper}, dict.{get, items,
//         keys, values};
//   globals: namespace, range, raise_exception, plus whatever the caller puts
//         in the render context.
// Anything else (include, extends, import, block, call, filter blocks,
// unknown filters or tests) is an INVALID_ARGUMENT error naming it and its
// line. String case mapping (upper/lower/title/capitalize) is ASCII-only.
// Rendering is bounded (output size, work, recursion): a hostile template
// fails with RESOURCE_EXHAUSTED instead of running away.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "text/jinja_value.h"

namespace pdserve::text::jinja {

struct Program;

class Template {
 public:
  // INVALID_ARGUMENT with "line N: ..." for syntax errors and constructs
  // outside the subset.
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `globals` (variable name -> value). Errors from
  // raise_exception("msg") come back as INVALID_ARGUMENT with "msg".
  absl::StatusOr<std::string> Render(const Object& globals) const;

 private:
  std::shared_ptr<const Program> program_;  // immutable: renders run concurrently
};

}  // namespace pdserve::text::jinja
