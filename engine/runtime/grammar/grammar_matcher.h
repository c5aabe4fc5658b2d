// A grammar compiled against a vocabulary (CompiledGrammar: the grammar and
// its per-node token masks, computed once per node on first use, shared by
// every request with the same grammar) and one request's position in it
// (GrammarMatcher).
//
// The matcher follows the generated tokens and computes the mask of the
// next one: for each configuration of the parse state, its node's accepted
// tokens (a bit-set OR) and its uncertain tokens checked against the real
// stack. It also keeps the output finishable within the token budget: a
// token is allowed only if the bytes still needed to finish the output
// after it fit the tokens left after it, less one for the end-of-sequence
// (so a reply ends as STOP, not at max_tokens; the budget counts bytes as tokens,
// so it holds wherever every byte the shortest completion needs is a token
// of its own, as in byte-level vocabularies). Where a node's accepted set
// could overrun the budget, that configuration's tokens are checked one by
// one (a walk over the vocabulary; only in the last steps of a budget). The
// end-of-sequence ids are allowed exactly where the output may end.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/runtime/grammar/grammar.h"
#include "engine/runtime/grammar/parse_state.h"
#include "engine/runtime/grammar/token_masks.h"
#include "engine/runtime/grammar/token_vocabulary.h"

namespace pdserve::engine::grammar {

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab);

  const Grammar& grammar() const { return grammar_; }
  const TokenVocabulary& vocab() const { return *vocab_; }
  // The node's mask, computed on first use. Thread-safe.
  const NodeMask& Mask(int32_t node) const;
  // Computes every node's mask now (benchmarks; a compile that should not
  // pay on first use).
  void ComputeAllMasks() const;

 private:
  const Grammar grammar_;
  const std::shared_ptr<const TokenVocabulary> vocab_;
  mutable std::unique_ptr<std::once_flag[]> once_;
  mutable std::vector<std::unique_ptr<NodeMask>> masks_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled);

  // Brings the state to after `generated`, replaying from the longest
  // prefix it already followed. Returns false when the tokens leave the
  // grammar (then the state is dead and the mask allows only the end).
  bool Sync(std::span<const int32_t> generated);

  // The mask of the next token (see token_constraint.h for the layout),
  // with `remaining` >= 1 tokens left including it.
  void FillMask(int remaining, std::span<const int> eos_ids, std::span<uint32_t> mask);

  // The output may end here (end-of-sequence allowed).
  bool CanEnd() const;
  // Fewest bytes still needed to finish the output.
  int32_t MinToFinish() const;
  bool dead() const { return steps_.back().dead; }

 private:
  // One token onto the state; false if it leaves the grammar.
  bool Advance(int32_t token);
  void AllowToken(int32_t id, std::span<uint32_t> mask) const {
    mask[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  }
  // Tokens from configuration `c` leading to states that need at most
  // `limit` bytes to finish; `exact`: walk the vocabulary instead of using
  // the node's accepted set.
  void AddConfig(const Config& c, int32_t limit, bool exact, std::span<uint32_t> mask);

  const std::shared_ptr<const CompiledGrammar> compiled_;
  const Grammar& g_;
  StackArena arena_;
  // steps_[k]: the state after tokens_[0..k) and the arena's size then.
  struct Step {
    StepOut state;
    size_t mark = 0;
    bool dead = false;      // a token left the grammar
    bool finished = false;  // an end-of-sequence token ended the output
  };
  std::vector<Step> steps_;
  std::vector<int32_t> tokens_;
  StepOut scratch_, check_;
  std::vector<uint32_t> exact_;  // AddConfig's accepted set near the budget's end
};

}  // namespace pdserve::engine::grammar
