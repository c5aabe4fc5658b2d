// The token-mask cache of a grammar over a vocabulary, as XGrammar's
// adaptive token mask cache does it: for each grammar node, which tokens a
// parser whose top is that node accepts whatever lies below on its stack.
//
// From a node, walking a token's bytes through the node's rule (and the
// rules it calls) either consumes the whole token inside the rule (the
// token is *accepted*, whatever the context), dies (rejected), or leaves the
// rule before the token ends (the rule's end is popped): then what follows
// depends on the caller, and the token is *uncertain* unless the byte after
// that point cannot follow the rule anywhere in the grammar (FOLLOW set).
// At run time a mask is the union of the accepted sets of the state's
// configurations plus the uncertain tokens checked against the real stack:
// a few dozen checks instead of a walk over the whole vocabulary.
//
// Each walk visits the vocabulary's sorted byte strings once, reusing the
// states of the common prefix with the previous token and skipping every
// token under a dead prefix.
#pragma once

#include <bitset>
#include <cstdint>
#include <utility>
#include <vector>

#include "engine/runtime/grammar/grammar.h"
#include "engine/runtime/grammar/parse_state.h"
#include "engine/runtime/grammar/token_vocabulary.h"

namespace pdserve::engine::grammar {

struct NodeMask {
  // Accepted tokens: a bit set of TokenMaskWords(vocab) words when many,
  // else their ids (one of the two is empty).
  std::vector<uint32_t> accepted_bits;
  std::vector<int32_t> accepted_ids;
  std::vector<int32_t> uncertain;
  // Largest growth, over accepted tokens, of the bytes still needed to
  // finish the output (bytes after the token minus before it): the same in
  // every context, so a mask can tell whether the whole accepted set fits a
  // token budget without checking tokens one by one.
  int32_t max_growth = 0;
  int64_t count_accepted = 0;
  // Accepted tokens whose growth is not zero, as {growth, id}: growing ones
  // largest first, shrinking ones (a token that completes part of what is
  // needed) smallest first. Near the end of a budget a mask takes the
  // accepted set less the growing tokens that do not fit, or only the
  // shrinking ones that do, instead of checking the vocabulary token by
  // token.
  std::vector<std::pair<int32_t, int32_t>> growing;
  std::vector<std::pair<int32_t, int32_t>> shrinking;

  size_t MemoryBytes() const {
    return accepted_bits.size() * 4 + (accepted_ids.size() + uncertain.size()) * 4 +
           (growing.size() + shrinking.size()) * 8;
  }
};

NodeMask ComputeNodeMask(const Grammar& g, const TokenVocabulary& vocab, int32_t node);

// Calls visit(id, uncertain, state) for every token of `vocab` that
// survives from `start`: state holds what the token's bytes reach (its
// configurations, or the bottom reached at its last byte). With `follow`,
// a path that reached the bottom before the token's end goes on as
// uncertain when the next byte is in `follow` (the mask precomputation);
// without it such a path dies (the bottom is the end of the output).
// Pushes onto `arena`.
template <typename Visit>
void WalkVocabulary(const Grammar& g, StackArena& arena, const TokenVocabulary& vocab,
                    const StepOut& start, const std::bitset<256>* follow, Visit&& visit);

// ---- implementation ----

struct WalkLevel {
  StepOut out;
  bool escaped = false;  // a path left the start's context earlier
};

template <typename Visit>
void WalkVocabulary(const Grammar& g, StackArena& arena, const TokenVocabulary& vocab,
                    const StepOut& start, const std::bitset<256>* follow, Visit&& visit) {
  thread_local std::vector<WalkLevel> levels;
  if (levels.size() < static_cast<size_t>(vocab.max_token_bytes()) + 1) {
    levels.resize(vocab.max_token_bytes() + 1);
  }
  levels[0].out.configs.assign(start.configs.begin(), start.configs.end());
  levels[0].out.bottom_reached = start.bottom_reached;
  levels[0].escaped = false;
  const auto sorted = vocab.sorted();
  const size_t n = sorted.size();
  int valid = 0;  // levels[0..valid] hold the current token's prefix
  for (size_t i = 0; i < n; ++i) {
    const std::string_view s = vocab.bytes(sorted[i]);
    int d = std::min<int>(valid, vocab.prefix(i));
    bool dead = false;
    while (d < static_cast<int>(s.size())) {
      const WalkLevel& cur = levels[d];
      WalkLevel& next = levels[d + 1];
      const uint8_t b = static_cast<uint8_t>(s[d]);
      AdvanceByte(g, arena, cur.out.configs, b, next.out);
      next.escaped = cur.escaped || (cur.out.bottom_reached && follow != nullptr && (*follow)[b]);
      ++d;
      if (next.out.configs.empty() && !next.out.bottom_reached && !next.escaped) {
        dead = true;
        break;
      }
    }
    valid = d;
    if (dead) {
      // Every later token with this dead prefix is rejected too.
      while (i + 1 < n && vocab.prefix(i + 1) >= d) ++i;
      continue;
    }
    const WalkLevel& end = levels[s.size()];
    if (!end.out.configs.empty() || end.out.bottom_reached) {
      visit(sorted[i], false, end.out);
    } else if (end.escaped) {
      visit(sorted[i], true, end.out);
    }
  }
}

}  // namespace pdserve::engine::grammar
