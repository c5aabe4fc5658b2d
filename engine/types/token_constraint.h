// A per-request restriction of the tokens the sampler may draw (structured
// output). It travels with the request's SamplingParams, so every runner
// that samples applies it without its engine loop knowing: the CPU sampler
// (engine/runtime/sampler.cc) masks the logits it draws from, the CUDA runner
// uploads the same bit mask and masks on the device.
//
// A constraint is a function of the tokens the request generated so far and
// the number of tokens it may still generate: a request moved to another
// worker (migration) or recomputed after preemption gets the same mask from
// the same history. Implementations cache what they computed for the last
// history they saw (engine/runtime/grammar/grammar_constraint.h).
#pragma once

#include <cstdint>
#include <span>

namespace pdserve::engine {

// Mask layout: bit (id % 32) of word (id / 32) is set when token `id` may be
// drawn; TokenMaskWords(vocab) words cover ids [0, vocab).
inline constexpr int TokenMaskWords(int vocab) { return (vocab + 31) / 32; }
inline bool TokenAllowed(std::span<const uint32_t> mask, int32_t id) {
  return (mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u;
}

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;

  // Fills `mask` (TokenMaskWords(vocab) words, vocab = what the runner
  // samples over) with the tokens allowed after `generated`, when
  // `remaining` >= 1 tokens may still be generated including this one.
  // `eos_ids` end the output: they are allowed exactly where it may end.
  // Never leaves the mask empty: a history the constraint cannot follow
  // allows only `eos_ids` (or, without any, token 0), ending the request.
  // Thread-safe.
  virtual void FillMask(std::span<const int32_t> generated, int remaining,
                        std::span<const int> eos_ids, std::span<uint32_t> mask) const = 0;
};

}  // namespace pdserve::engine
