// CompiledGrammar and GrammarMatcher (see grammar_matcher.h).
#include "engine/runtime/grammar/grammar_matcher.h"

#include <algorithm>
#include <utility>

#include "engine/types/token_constraint.h"

namespace pdserve::engine::grammar {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenVocabulary> vocab)
    : grammar_(std::move(grammar)),
      vocab_(std::move(vocab)),
      once_(new std::once_flag[grammar_.num_nodes()]),
      masks_(grammar_.num_nodes()) {}

const NodeMask& CompiledGrammar::Mask(int32_t node) const {
  std::call_once(once_[node], [&] {
    masks_[node] = std::make_unique<NodeMask>(ComputeNodeMask(grammar_, *vocab_, node));
  });
  return *masks_[node];
}

void CompiledGrammar::ComputeAllMasks() const {
  for (int32_t n = 0; n < grammar_.num_nodes(); ++n) {
    if (grammar_.HasBytes(n)) Mask(n);
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> compiled)
    : compiled_(std::move(compiled)), g_(compiled_->grammar()), arena_(g_) {
  Step start;
  start.state = StartState(g_, arena_);
  start.mark = arena_.Mark();
  steps_.push_back(std::move(start));
}

bool GrammarMatcher::Sync(std::span<const int32_t> generated) {
  size_t common = 0;
  while (common < tokens_.size() && common < generated.size() &&
         tokens_[common] == generated[common]) {
    ++common;
  }
  if (common < tokens_.size()) {  // another history: roll back to the shared prefix
    tokens_.resize(common);
    steps_.resize(common + 1);
    arena_.Rewind(steps_.back().mark);
  }
  for (size_t k = common; k < generated.size(); ++k) {
    tokens_.push_back(generated[k]);
    Advance(generated[k]);
  }
  return !steps_.back().dead;
}

bool GrammarMatcher::Advance(int32_t token) {
  Step next;
  const Step& prev = steps_.back();
  next.dead = prev.dead;
  next.finished = prev.finished;
  if (!next.dead && !next.finished) {
    const TokenVocabulary& v = compiled_->vocab();
    const std::span<const int> eos = v.eos_ids();
    const bool is_eos = std::find(eos.begin(), eos.end(), token) != eos.end();
    if (is_eos && prev.state.bottom_reached) {
      next.finished = true;
    } else if (token < 0 || token >= v.size() || v.bytes(token).empty()) {
      next.dead = true;
    } else {
      next.state = prev.state;
      next.dead = !AdvanceBytes(g_, arena_, v.bytes(token), next.state, scratch_);
    }
  } else {
    next.dead = true;  // nothing may follow the end
  }
  if (next.dead) next.state = StepOut();
  next.mark = arena_.Mark();
  steps_.push_back(std::move(next));
  return !steps_.back().dead;
}

bool GrammarMatcher::CanEnd() const {
  const Step& s = steps_.back();
  return !s.dead && !s.finished && s.state.bottom_reached;
}

int32_t GrammarMatcher::MinToFinish() const {
  return grammar::MinToFinish(arena_, steps_.back().state);
}

void GrammarMatcher::AddConfig(const Config& c, int32_t limit, bool exact,
                               std::span<uint32_t> mask) {
  const TokenVocabulary& v = compiled_->vocab();
  const NodeMask& nm = compiled_->Mask(c.node);
  // An accepted token leaves the stack below as it was: after it, the bytes
  // still needed are this configuration's plus the token's growth.
  const int32_t slack = limit - arena_.MinToFinish(c);
  if (exact && slack < 0) {
    for (const auto& [growth, id] : nm.shrinking) {
      if (growth > slack) break;
      AllowToken(id, mask);
    }
  } else if (exact) {
    // The accepted set less the tokens that grow past the slack.
    exact_.assign(mask.size(), 0u);
    if (!nm.accepted_bits.empty()) {
      for (size_t w = 0; w < nm.accepted_bits.size() && w < exact_.size(); ++w) {
        exact_[w] = nm.accepted_bits[w];
      }
    } else {
      for (int32_t id : nm.accepted_ids) AllowToken(id, exact_);
    }
    for (const auto& [growth, id] : nm.growing) {
      if (growth <= slack) break;
      exact_[static_cast<size_t>(id) >> 5] &= ~(1u << (id & 31));
    }
    for (size_t w = 0; w < mask.size(); ++w) mask[w] |= exact_[w];
  } else if (!nm.accepted_bits.empty()) {
    for (size_t w = 0; w < nm.accepted_bits.size() && w < mask.size(); ++w) {
      mask[w] |= nm.accepted_bits[w];
    }
  } else {
    for (int32_t id : nm.accepted_ids) AllowToken(id, mask);
  }
  for (int32_t id : nm.uncertain) {
    check_.configs.assign(1, c);
    check_.bottom_reached = false;
    if (AdvanceBytes(g_, arena_, v.bytes(id), check_, scratch_) &&
        grammar::MinToFinish(arena_, check_) <= limit) {
      AllowToken(id, mask);
    }
  }
}

void GrammarMatcher::FillMask(int remaining, std::span<const int> eos_ids,
                              std::span<uint32_t> mask) {
  std::fill(mask.begin(), mask.end(), 0u);
  const int vocab_words = static_cast<int>(mask.size());
  auto allow_end = [&] {
    bool any = false;
    for (int id : eos_ids) {
      if (id >= 0 && id < vocab_words * 32) {
        AllowToken(id, mask);
        any = true;
      }
    }
    if (!any) AllowToken(0, mask);
  };
  const Step& step = steps_.back();
  if (step.dead || step.finished) {
    allow_end();
    return;
  }
  // The last token ends a complete output, so the reply finishes as STOP
  // rather than at max_tokens.
  if (remaining <= 1 && step.state.bottom_reached) {
    allow_end();
    return;
  }
  const size_t mark = arena_.Mark();
  // Bytes that may still be needed after this token: one token per byte,
  // with one token kept for the end-of-sequence.
  const int32_t limit = std::max(remaining - 2, 0);
  for (int pass = 0; pass < 2; ++pass) {
    // The second pass drops the budget: the vocabulary lacks tokens the
    // shortest completion needs, so the output may end cut by max_tokens.
    const int32_t budget = pass == 0 ? limit : kUnreachable;
    for (const Config& c : step.state.configs) {
      const NodeMask& nm = compiled_->Mask(c.node);
      const bool exact = pass == 0 && arena_.MinToFinish(c) + nm.max_growth > budget;
      AddConfig(c, budget, exact, mask);
    }
    if (step.state.bottom_reached) allow_end();
    if (std::any_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; })) break;
  }
  arena_.Rewind(mark);
  // Ids past the vocabulary the grammar knows stay masked; so do ids past
  // the runner's vocabulary (the mask has its size).
  if (std::none_of(mask.begin(), mask.end(), [](uint32_t w) { return w != 0; })) allow_end();
}

}  // namespace pdserve::engine::grammar
