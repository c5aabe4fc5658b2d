// GrammarConstraint and GrammarCompiler (see grammar_constraint.h).
#include "engine/runtime/grammar/grammar_constraint.h"

#include "engine/runtime/grammar/grammar_spec.h"

namespace pdserve::engine::grammar {

void GrammarConstraint::FillMask(std::span<const int32_t> generated, int remaining,
                                 std::span<const int> eos_ids, std::span<uint32_t> mask) const {
  absl::MutexLock lock(&mu_);
  matcher_.Sync(generated);
  matcher_.FillMask(remaining, eos_ids, mask);
}

GrammarCompiler::GrammarCompiler(std::shared_ptr<const TokenVocabulary> vocab, size_t cache_entries)
    : vocab_(std::move(vocab)), cache_entries_(cache_entries) {}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> GrammarCompiler::CompileGrammar(
    std::string_view spec) {
  {
    absl::MutexLock lock(&mu_);
    for (auto it = cache_.begin(); it != cache_.end(); ++it) {
      if (it->first == spec) {
        cache_.splice(cache_.begin(), cache_, it);
        return cache_.front().second;
      }
    }
  }
  // Compiled outside the lock: two requests with a new spec may both
  // compile it; the first to finish is kept.
  absl::StatusOr<Grammar> grammar = CompileGrammarSpec(spec);
  if (!grammar.ok()) return grammar.status();
  auto compiled = std::make_shared<const CompiledGrammar>(*std::move(grammar), vocab_);
  absl::MutexLock lock(&mu_);
  cache_.emplace_front(std::string(spec), compiled);
  while (cache_.size() > cache_entries_) cache_.pop_back();
  return compiled;
}

absl::StatusOr<std::shared_ptr<const TokenConstraint>> GrammarCompiler::Compile(
    std::string_view spec) {
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> compiled = CompileGrammar(spec);
  if (!compiled.ok()) return compiled.status();
  return std::make_shared<const GrammarConstraint>(*std::move(compiled));
}

}  // namespace pdserve::engine::grammar
