// Per-node token masks (see token_masks.h).
#include "engine/runtime/grammar/token_masks.h"

#include <algorithm>
#include <functional>

#include "engine/types/token_constraint.h"

namespace pdserve::engine::grammar {

NodeMask ComputeNodeMask(const Grammar& g, const TokenVocabulary& vocab, int32_t node) {
  NodeMask mask;
  StackArena arena(g);
  StepOut start;
  start.configs.push_back({node, kNone});
  const std::bitset<256>& follow = g.Follow(g.node(node).rule).bytes;
  const int32_t before = g.MinToEnd(node);
  std::vector<int32_t> accepted;
  int32_t max_growth = kUnreachable;  // none yet
  WalkVocabulary(g, arena, vocab, start, &follow,
                 [&](int32_t id, bool uncertain, const StepOut& out) {
                   if (uncertain) {
                     mask.uncertain.push_back(id);
                     return;
                   }
                   accepted.push_back(id);
                   // Local cost: the stack below the start is empty here.
                   const int32_t growth = MinToFinish(arena, out) - before;
                   if (growth > 0) mask.growing.emplace_back(growth, id);
                   if (growth < 0) mask.shrinking.emplace_back(growth, id);
                   max_growth = max_growth == kUnreachable ? growth : std::max(max_growth, growth);
                 });
  mask.max_growth = max_growth == kUnreachable ? 0 : max_growth;
  std::sort(mask.growing.begin(), mask.growing.end(), std::greater<>());
  std::sort(mask.shrinking.begin(), mask.shrinking.end());
  mask.count_accepted = static_cast<int64_t>(accepted.size());
  if (accepted.size() * 32 > static_cast<size_t>(vocab.size())) {
    mask.accepted_bits.assign(TokenMaskWords(vocab.size()), 0);
    for (int32_t id : accepted) mask.accepted_bits[id >> 5] |= 1u << (id & 31);
  } else {
    std::sort(accepted.begin(), accepted.end());
    mask.accepted_ids = std::move(accepted);
  }
  return mask;
}

}  // namespace pdserve::engine::grammar
