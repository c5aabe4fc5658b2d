// Structured output on the worker that samples: GrammarCompiler turns a
// request's grammar spec (grammar_spec.h) into a TokenConstraint
// (engine/types/token_constraint.h) over the model's vocabulary; the
// sampler applies it. Compiled grammars are cached by spec text (a service
// answering the same response_format again pays nothing), and each node's
// token mask is computed once, on first use.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/grammar/grammar_matcher.h"
#include "engine/runtime/grammar/token_vocabulary.h"
#include "engine/types/token_constraint.h"

namespace pdserve::engine::grammar {

// One request's constraint: a matcher over a compiled grammar that follows
// the request's history (see TokenConstraint for the contract).
class GrammarConstraint final : public TokenConstraint {
 public:
  explicit GrammarConstraint(std::shared_ptr<const CompiledGrammar> compiled)
      : matcher_(std::move(compiled)) {}
  void FillMask(std::span<const int32_t> generated, int remaining, std::span<const int> eos_ids,
                std::span<uint32_t> mask) const override;

 private:
  mutable absl::Mutex mu_;
  mutable GrammarMatcher matcher_ ABSL_GUARDED_BY(mu_);
};

class GrammarCompiler {
 public:
  // `cache_entries` compiled grammars are kept (least recently used out).
  explicit GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, size_t cache_entries = 64);

  const TokenVocabulary& vocab() const { return *vocab_; }

  // INVALID_ARGUMENT for a spec that does not compile (grammar_spec.h).
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileGrammar(std::string_view spec);
  // A fresh per-request constraint over the (cached) compiled grammar.
  absl::StatusOr<std::shared_ptr<const TokenConstraint>> Compile(std::string_view spec);

 private:
  const std::shared_ptr<const TokenVocabulary> vocab_;
  const size_t cache_entries_;
  absl::Mutex mu_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<const CompiledGrammar>>> cache_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pdserve::engine::grammar
